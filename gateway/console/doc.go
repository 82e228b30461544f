// Package console is Loops' web console, served by `loops serve` at / (the runs list) and
// under /console/: sign in with an API key, then see the key's workspace only: training
// runs with their live status, a run's live charts (loss per token by loss function,
// tokens per step, backend seconds per step, kl_sample_train, zero-advantage share,
// gradient and update norms; EMA smoothing and log-scale toggles) and health alerts (internal/runhealth, the same rules
// as `loops runs show`), its checkpoints (download, publish/unpublish, TTL, delete after a
// confirmation page), sessions and their samplers, usage by hour or day and kind, and the
// workspace's limits. Deployments get a page only when the server is given a
// DeploymentService (Services.Deployments); worker pools will get one the same way once
// loops.v1 serves them. Nothing is shown for services that do not exist.
//
// Architecture, and why:
//   - Server-rendered HTML (html/template, embedded with go:embed). The pages are views of
//     loops.v1 answers, so the server that owns the data renders them: no JSON API to keep
//     in step with a front end, no build step, nothing to download at run time, and the
//     binary that `go run ./cmd/loops serve` builds is the whole console.
//   - Charts drawn on the server as SVG by gonum.org/v1/plot (vg/vgsvg), a maintained Go
//     plotting library, from GetTrainingRunMetrics with max_points = ChartPoints, so a
//     chart costs the same for a run of 10 steps or 100,000. SVG is inlined in the page.
//   - One small hand-written script (static/console.js) re-fetches the live parts of a
//     page (elements with a data-live URL, rendered by the same templates) every few
//     seconds while the tab is visible, and applies the chart toggles by changing that
//     URL. Every page works without it, only without refresh. No third-party JS or CSS.
//   - The console calls the core's loops.v1 service implementations in-process (Services),
//     the same code the Connect, REST and Tinker surfaces call, so workspace scoping,
//     validation, limits and errors are the API's own; the console adds no data access.
//
// Sign-in and sessions: POST /console/signin checks the key (auth.Keys.Authenticate) and
// creates a console session on the server: a random id in a cookie without expiry (so the
// browser forgets it when it closes), HttpOnly, SameSite=Strict, Secure over TLS. The key
// itself never goes back to the browser. Sessions are bounded (MaxSessions in all,
// MaxSessionsPerWorkspace each: one workspace's sign-ins push out only its own oldest) and
// expire (idle SessionIdle, at most SessionLifetime); on a full server a sign-in takes the
// oldest session of the workspace holding the most, if it holds at least two more than the
// signing-in one, so no set of workspaces keeps another out. Wrap, in front of the API-key
// middleware, turns a session cookie into the session's key header, so a console request is
// authenticated, scoped to its workspace and counted against the key's requests in flight
// by exactly the path an API request takes. Every state-changing form (sign-out, publish,
// TTL, download link, delete) is a POST carrying the session's CSRF token; pages send a
// strict Content-Security-Policy, no caching and no framing.
//
// Bounds: a page lists at most PageSize rows (then a next-page link with the API's page
// token), charts at most ChartPoints points per series, alerts read the last AlertSteps
// steps, the sessions page looks up SamplersPerSession samplers per session, forms are at
// most 8 KiB, and each page's service calls share a 30 s deadline. Drawing is CPU work the
// training path shares: at most GOMAXPROCS/2 chart sets are drawn at once across the server
// (a page that finds no slot before its deadline gets 429), and the last 128 drawings are
// kept, keyed by run, toggles and the newest record, so refreshing the page of an idle run
// reads its metrics but draws nothing (BenchmarkCharts: one drawing of five 400-point charts).
package console
