package console

import (
	"context"
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"time"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// Paths of the console. Root is the runs list; everything else is under Prefix.
const (
	Root   = "/"
	Prefix = "/console/"
	// SignInPath and StaticPrefix need no session (list them among the auth middleware's
	// public paths, as PublicPaths does).
	SignInPath   = Prefix + "signin"
	StaticPrefix = Prefix + "static/"
	// CookieName is the session cookie.
	CookieName = "loops_console"
)

// PublicPaths are the console paths the API-key middleware must let through without a key:
// the sign-in page and the console's own scripts and styles.
var PublicPaths = []string{SignInPath, StaticPrefix}

// Bounds of what one page asks of the services.
const (
	// PageSize is the rows of one page of runs, sessions or checkpoints.
	PageSize = 50
	// ChartPoints is the max_points a run page asks GetTrainingRunMetrics for (the
	// server downsamples longer histories to it).
	ChartPoints = 400
	// AlertSteps is how many of the latest steps the alerts are checked on, at full
	// resolution (runhealth.Check).
	AlertSteps = 20
	// SamplersPerSession is how many of a session's samplers the sessions page looks up.
	SamplersPerSession = 5
	// maxFormBytes bounds a form body (sign-in, checkpoint actions).
	maxFormBytes = 8 << 10
	// serviceTimeout bounds the service calls of one page.
	serviceTimeout = 30 * time.Second
)

// Services are the loops.v1 services the console calls, in-process: the core's own
// implementations (gateway/core Services), which check the workspace in the context exactly
// as they do for the API.
type Services struct {
	Training    loopsv1connect.TrainingServiceHandler
	Checkpoints loopsv1connect.CheckpointServiceHandler
	Sessions    loopsv1connect.SessionServiceHandler
	Sampling    loopsv1connect.SamplingServiceHandler
	Usage       loopsv1connect.UsageServiceHandler
	Workspace   loopsv1connect.WorkspaceServiceHandler
	// Deployments is nil while the server serves no deployments; the console then shows
	// none (no placeholder pretends they exist). Worker pools get a page the same way once
	// loops.v1 has a service for them.
	Deployments loopsv1connect.DeploymentServiceHandler
	// Access is the access requests' service (nil: the console shows no Access page).
	Access loopsv1connect.AccessServiceHandler
	// Evals is the evals' service (nil: run pages chart no eval scores).
	Evals loopsv1connect.EvalServiceHandler
}

// Options configure the console. Zero values take the defaults.
type Options struct {
	// Authenticate returns the workspace of an API key (auth.Keys.Authenticate); sign-in
	// calls it so that a wrong key is refused on the sign-in page itself.
	Authenticate func(key string) (string, error)
	// Throttle, when set, counts sign-ins with wrong keys per client address (the same
	// throttle as the API's): a throttled address's sign-in is refused with 429 and
	// Retry-After, whatever key it sends.
	Throttle *auth.Throttle
	// Proxies are the trusted reverse proxies: their X-Forwarded-For names the client
	// address, and X-Forwarded-Proto: https from them makes the session cookie Secure (as
	// a request over TLS does).
	Proxies auth.TrustedProxies
	// Session bounds (defaults DefaultMaxSessions, DefaultMaxSessionsPerWorkspace,
	// DefaultSessionIdle, DefaultSessionLifetime).
	MaxSessions             int
	MaxSessionsPerWorkspace int
	SessionIdle             time.Duration
	SessionLifetime         time.Duration
	// RefreshInterval is how often open pages refresh their live parts (default 3 s).
	RefreshInterval time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.MaxSessionsPerWorkspace <= 0 {
		o.MaxSessionsPerWorkspace = DefaultMaxSessionsPerWorkspace
	}
	if o.SessionIdle <= 0 {
		o.SessionIdle = DefaultSessionIdle
	}
	if o.SessionLifetime <= 0 {
		o.SessionLifetime = DefaultSessionLifetime
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = 3 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console is the web console.
type Console struct {
	svc      Services
	opts     Options
	log      *slog.Logger
	sessions *sessions
	pages    map[string]*template.Template
	static   http.Handler
	drawer   *drawer
}

// New returns a console over svc.
func New(svc Services, opts Options) *Console {
	opts = opts.withDefaults()
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded folder exists
	}
	return &Console{svc: svc, opts: opts, log: opts.Logger, sessions: newSessions(opts),
		pages: parsePages(), static: http.StripPrefix(StaticPrefix, http.FileServerFS(sub)),
		drawer: newDrawer(runtime.GOMAXPROCS(0) / 2)}
}

// IsConsolePath reports whether a request path is the console's: the root or under Prefix.
func IsConsolePath(p string) bool { return p == Root || strings.HasPrefix(p, Prefix) }

func isPublic(p string) bool { return p == SignInPath || strings.HasPrefix(p, StaticPrefix) }

type sessionKey struct{}

// Wrap goes in front of the API-key middleware (auth.Keys.Middleware). A console request
// with a live session cookie is sent on with the session's API key in the X-API-Key
// header, so the middleware authenticates it, scopes it to the key's workspace and counts it
// against the key's requests in flight, exactly as an API request; a console request
// without one is sent to the sign-in page. Other requests pass untouched, and a key header
// sent by the browser itself is never trusted on console paths.
func (c *Console) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsConsolePath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		r.Header.Del(auth.HeaderName)
		r.Header.Del("Authorization")
		if isPublic(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		var s *session
		if ck, err := r.Cookie(CookieName); err == nil {
			s = c.sessions.get(ck.Value)
		}
		if s == nil {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, SignInPath, http.StatusSeeOther)
				return
			}
			http.Error(w, "not signed in (or the session expired): sign in again at "+SignInPath, http.StatusUnauthorized)
			return
		}
		r.Header.Set(auth.HeaderName, s.key)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	})
}

// sessionOf returns the session Wrap found for the request, or nil.
func sessionOf(r *http.Request) *session {
	s, _ := r.Context().Value(sessionKey{}).(*session)
	return s
}

// Handler serves the console's pages; mount it at Root (exactly) and Prefix, behind Wrap
// and the auth middleware.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+StaticPrefix, c.static)
	mux.HandleFunc("GET "+SignInPath, c.signInPage)
	mux.HandleFunc("POST "+SignInPath, c.signIn)
	mux.HandleFunc("POST "+Prefix+"signout", c.page(c.signOut))
	mux.HandleFunc("GET /{$}", c.page(c.runsPage))
	mux.HandleFunc("GET "+Prefix+"runs/live", c.page(c.runsLive))
	mux.HandleFunc("GET "+Prefix+"runs/{id}", c.page(c.runPage))
	mux.HandleFunc("GET "+Prefix+"runs/{id}/live", c.page(c.runLive))
	mux.HandleFunc("GET "+Prefix+"checkpoint", c.page(c.checkpointPage))
	mux.HandleFunc("GET "+Prefix+"checkpoint/delete", c.page(c.deleteConfirmPage))
	mux.HandleFunc("POST "+Prefix+"checkpoint/delete", c.page(c.deleteCheckpoint))
	mux.HandleFunc("POST "+Prefix+"checkpoint/public", c.page(c.setPublic))
	mux.HandleFunc("POST "+Prefix+"checkpoint/ttl", c.page(c.setTTL))
	mux.HandleFunc("POST "+Prefix+"checkpoint/download", c.page(c.download))
	mux.HandleFunc("GET "+Prefix+"sessions", c.page(c.sessionsPage))
	mux.HandleFunc("GET "+Prefix+"usage", c.page(c.usagePage))
	mux.HandleFunc("GET "+Prefix+"limits", c.page(c.limitsPage))
	mux.HandleFunc("GET "+Prefix+"deployments", c.page(c.deploymentsPage))
	mux.HandleFunc("GET "+Prefix+"access", c.page(c.accessPage))
	mux.HandleFunc("POST "+Prefix+"access/request", c.page(c.accessRequest))
	mux.HandleFunc("POST "+Prefix+"access/decide", c.page(c.accessDecide))
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "no such console page: "+r.URL.Path)
	})
	return withHeaders(mux)
}

// withHeaders sets the security headers of every console answer: no caching (pages show
// one workspace's data), no framing, scripts and styles from this server only.
func withHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, StaticPrefix) {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// pageFunc is a signed-in page: it runs with the session and a bounded context carrying
// the workspace (set by the auth middleware).
type pageFunc func(w http.ResponseWriter, r *http.Request, s *session) error

// page adapts a pageFunc: it checks the session, bounds the request, checks the CSRF token
// of state-changing requests, and renders errors.
func (c *Console) page(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		if s == nil || auth.Workspace(r.Context()) != s.workspace {
			http.Redirect(w, r, SignInPath, http.StatusSeeOther)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), serviceTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		if r.Method == http.MethodPost {
			if !sameOrigin(r) {
				c.fail(w, r, http.StatusForbidden, "the form was sent from another site ("+r.Header.Get("Origin")+"): use the console's own pages")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				c.fail(w, r, http.StatusBadRequest, "the form could not be read (over "+itoa(maxFormBytes)+" bytes, or malformed): go back and submit it again")
				return
			}
			if !s.validCSRF(r.PostForm.Get("csrf")) {
				c.fail(w, r, http.StatusForbidden, "the form's CSRF token is missing or not this session's: reload the page and submit it again")
				return
			}
		}
		if err := f(w, r, s); err != nil {
			c.serviceError(w, r, err)
		}
	}
}

// sameOrigin reports whether a browser's POST comes from the console's own pages: its
// Origin header, when sent (browsers send it on every cross-site POST), names this host.
// Requests without one (non-browser clients) are left to the CSRF token.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// serviceError renders a service error with the status and message the API would give
// (internal errors masked and logged with an id).
func (c *Console) serviceError(w http.ResponseWriter, r *http.Request, err error) {
	out := errs.Edge(err)
	if out.ID != "" {
		c.log.Error("console: service call failed", slog.String("error_id", out.ID), slog.String("path", r.URL.Path), slog.Any("err", err))
	}
	c.fail(w, r, out.Entry.HTTPStatus, out.Err.Message())
}
