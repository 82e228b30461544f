package console_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/console"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

const keyA, keyB = "tml-console-a", "tml-console-b"

// startServer runs a gateway with two keys in two workspaces (ws-a, ws-b).
func startServer(t testing.TB) string {
	t.Helper()
	return startServerWith(t, nil)
}

// browser is an HTTP client with a cookie jar that does not follow redirects.
type browser struct {
	t    testing.TB
	base string
	c    *http.Client
}

func newBrowser(t testing.TB, base string) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(req *http.Request) (int, http.Header, string) {
	b.t.Helper()
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, resp.Header, string(body)
}

func (b *browser) get(path string) (int, http.Header, string) {
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	require.NoError(b.t, err)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) (int, http.Header, string) {
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

func (b *browser) signIn(key string) {
	b.t.Helper()
	code, h, body := b.post(console.SignInPath, url.Values{"api_key": {key}})
	require.Equal(b.t, http.StatusSeeOther, code, body)
	require.Equal(b.t, "/", h.Get("Location"))
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the session's CSRF token from a page.
func (b *browser) csrf() string {
	b.t.Helper()
	code, _, body := b.get("/")
	require.Equal(b.t, http.StatusOK, code)
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(b.t, m, body)
	return m[1]
}

func withKey(key string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(auth.HeaderName, key)
			return next(ctx, req)
		}
	}))
}

// train creates a run for key, runs steps SFT+RL steps and saves a checkpoint; it returns
// the run and the checkpoint's path.
func train(t testing.TB, base, key string, steps int) (string, string) {
	t.Helper()
	ctx := context.Background()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, base, withKey(key))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, base, withKey(key))
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(60 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	run := wait(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})).GetTrainingRunId()
	f := func(v ...float32) *loopsv1.Tensor {
		return &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: v}
	}
	seq := int64(0)
	for range steps {
		seq++
		wait(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: seq, LossFn: "importance_sampling",
			Data: []*loopsv1.Datum{{Tokens: []int32{72, 105, 33, 10}, LossFnInputs: map[string]*loopsv1.Tensor{
				"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: []int64{105, 33, 10, 72}},
				"logprobs":      f(-1, -1, -1, -1),
				"advantages":    f(1, 1, 1, 1),
			}}}}))
		seq++
		wait(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: seq, Adam: &loopsv1.AdamParams{LearningRate: 1e-3}}))
	}
	seq++
	op := wait(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: seq, Name: "ck1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING}))
	return run, op.GetSaveWeights().GetPath()
}

// TestConsoleSignInAndWorkspaces signs two keys in and checks that each sees only its own
// workspace, through pages and live fragments, and that the API key is never trusted from
// the browser on console paths.
func TestConsoleSignInAndWorkspaces(t *testing.T) {
	base := startServer(t)
	run, ck := train(t, base, keyA, 3)

	a := newBrowser(t, base)
	code, h, _ := a.get("/")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, console.SignInPath, h.Get("Location"))

	// A wrong key is refused on the sign-in page, with the reason.
	code, _, body := a.post(console.SignInPath, url.Values{"api_key": {"tml-nobody"}})
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "unknown API key")

	// The cookie: a session cookie (no expiry), HttpOnly, SameSite=Strict, not the key.
	code, h, _ = a.post(console.SignInPath, url.Values{"api_key": {keyA}})
	require.Equal(t, http.StatusSeeOther, code)
	ck0 := h.Get("Set-Cookie")
	require.Contains(t, ck0, console.CookieName+"=")
	require.Contains(t, ck0, "HttpOnly")
	require.Contains(t, ck0, "SameSite=Strict")
	require.NotContains(t, ck0, "Expires")
	require.NotContains(t, ck0, "Max-Age")
	require.NotContains(t, ck0, keyA)

	code, h, body = a.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-run="`+run+`"`)
	require.Contains(t, body, "ws-a")
	require.Contains(t, h.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "no-store", h.Get("Cache-Control"))

	code, _, body = a.get("/console/runs/" + run)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="chart-loss" data-points="3"`)
	require.Contains(t, body, `id="chart-kl" data-points="6"`) // k1 and k3
	require.Contains(t, body, "<svg")
	require.Contains(t, body, `data-rule="kl_sample_train"`)
	require.Contains(t, body, "ck1")
	// The receipt's facts (docs/receipts.md): 3 × (forward_backward, optim_step) and the save.
	require.Contains(t, body, `<td id="receipt">7 steps (<code>loops runs receipt `+run+`</code>)</td>`)
	require.Regexp(t, `<td id="revision" title="sha256:[0-9a-f]{64}">sha256:[0-9a-f]{12}…</td>`, body)
	code, _, body = a.get("/console/runs/" + run + "/live?ema=1&log=1")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<html")
	require.Contains(t, body, `id="chart-tokens" data-points="3"`)
	// The run page's link to its checkpoint leads there (as a browser follows it).
	_, _, body = a.get("/console/runs/" + run)
	link := regexp.MustCompile(`href="(/console/checkpoint\?path=[^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, link, body)
	code, _, body = a.get(html.UnescapeString(link[1]))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, ck)
	// The gateway serves deployments, so the console lists them.
	require.Contains(t, body, `href="/console/deployments"`)
	for _, p := range []string{"/console/sessions", "/console/usage", "/console/usage?range=7d", "/console/limits", "/console/deployments"} {
		code, _, body = a.get(p)
		require.Equal(t, http.StatusOK, code, p+": "+body)
	}
	require.Contains(t, body, "ws-a")
	_, _, body = a.get("/console/usage")
	require.Regexp(t, `training_tokens</td><td class="num">12<`, body) // 3 steps × 4 tokens
	// The limits page shows how long the workspace's work waited lately (issue 25).
	_, _, body = a.get("/console/limits")
	require.Contains(t, body, `id="fairness"`)
	require.Regexp(t, `Operations ended</th><td>[1-9]`, body)
	// and, per base model, the catalog's family, publisher, modalities, LoRA targets and
	// tinker-cookbook renderer (loops/tiny: a Qwen3 on the reference engine)
	require.Contains(t, body, `<td>loops/tiny</td><td>qwen3</td><td>Qwen</td><td>Qwen3ForCausalLM</td><td>text</td>`)
	require.Regexp(t, `<td>q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head</td><td><code>qwen3_instruct</code></td>`, body)

	// The second key: none of the first's runs, not even by id.
	b := newBrowser(t, base)
	b.signIn(keyB)
	code, _, body = b.get("/")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, run)
	require.Contains(t, body, `id="no-runs"`)
	code, _, body = b.get("/console/runs/" + run)
	require.Equal(t, http.StatusNotFound, code)
	require.NotContains(t, body, "<svg")
	code, _, _ = b.get("/console/runs/" + run + "/live")
	require.Equal(t, http.StatusNotFound, code)
	code, _, _ = b.get("/console/checkpoint?path=" + url.QueryEscape(ck))
	require.Equal(t, http.StatusNotFound, code)
	code, _, _ = b.post("/console/checkpoint/delete", url.Values{"csrf": {b.csrf()}, "path": {ck}, "confirm": {"yes"}})
	require.Equal(t, http.StatusNotFound, code)

	// Forms sent from another site are refused, sign-in included (login CSRF).
	req, err := http.NewRequest(http.MethodPost, base+console.SignInPath, strings.NewReader(url.Values{"api_key": {keyB}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	code, _, body = newBrowser(t, base).do(req)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "another site")
	req, err = http.NewRequest(http.MethodPost, base+"/console/checkpoint/public", strings.NewReader(url.Values{"csrf": {b.csrf()}, "path": {ck}, "public": {"true"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	code, _, _ = b.do(req)
	require.Equal(t, http.StatusForbidden, code)

	// A key header from the browser is not trusted on console paths.
	anon := newBrowser(t, base)
	req, err = http.NewRequest(http.MethodGet, base+"/", nil)
	require.NoError(t, err)
	req.Header.Set(auth.HeaderName, keyA)
	code, _, _ = anon.do(req)
	require.Equal(t, http.StatusSeeOther, code)

	// Signing out ends the session on the server.
	code, _, _ = a.post("/console/signout", url.Values{"csrf": {a.csrf()}})
	require.Equal(t, http.StatusSeeOther, code)
	code, _, _ = a.get("/")
	require.Equal(t, http.StatusSeeOther, code)

	// The API is unchanged next to the console.
	code, _, _ = anon.get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, _, _ = anon.get("/v1/training_runs")
	require.Equal(t, http.StatusUnauthorized, code)
}

// TestConsoleCheckpointActions publishes, sets a TTL on and deletes a checkpoint through
// the console's forms, and checks that every form needs the session's CSRF token.
func TestConsoleCheckpointActions(t *testing.T) {
	base := startServer(t)
	run, ck := train(t, base, keyA, 1)
	a := newBrowser(t, base)
	a.signIn(keyA)
	tok := a.csrf()

	for _, bad := range []url.Values{{"path": {ck}, "public": {"true"}}, {"path": {ck}, "public": {"true"}, "csrf": {"x" + tok}}} {
		code, _, body := a.post("/console/checkpoint/public", bad)
		require.Equal(t, http.StatusForbidden, code)
		require.Contains(t, body, "CSRF token")
	}
	// Another session's token is not this one's.
	other := newBrowser(t, base)
	other.signIn(keyA)
	code, _, _ := a.post("/console/checkpoint/public", url.Values{"path": {ck}, "public": {"true"}, "csrf": {other.csrf()}})
	require.Equal(t, http.StatusForbidden, code)

	code, h, _ := a.post("/console/checkpoint/public", url.Values{"path": {ck}, "public": {"true"}, "csrf": {tok}})
	require.Equal(t, http.StatusSeeOther, code)
	_, _, body := a.get(h.Get("Location"))
	require.Contains(t, body, "Done: published")
	require.Contains(t, body, `id="visibility">public`)

	code, _, body = a.post("/console/checkpoint/ttl", url.Values{"path": {ck}, "ttl_hours": {"-3"}, "csrf": {tok}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "whole number of hours")
	code, h, _ = a.post("/console/checkpoint/ttl", url.Values{"path": {ck}, "ttl_hours": {"48"}, "csrf": {tok}})
	require.Equal(t, http.StatusSeeOther, code)
	_, _, body = a.get(h.Get("Location"))
	require.Contains(t, body, "public, expires ")

	// Download: a short-lived archive link that serves the checkpoint as a tar.
	code, h, _ = a.post("/console/checkpoint/download", url.Values{"path": {ck}, "csrf": {tok}})
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, strings.HasPrefix(h.Get("Location"), "/v1/checkpoint_archives/"), h.Get("Location"))
	code, _, body = a.get(h.Get("Location"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "adapter_config.json")

	// Delete: the confirmation page, then the confirmed POST.
	code, _, body = a.get("/console/checkpoint/delete?path=" + url.QueryEscape(ck))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="confirm-delete"`)
	code, _, _ = a.post("/console/checkpoint/delete", url.Values{"path": {ck}, "csrf": {tok}})
	require.Equal(t, http.StatusBadRequest, code) // not confirmed
	code, h, _ = a.post("/console/checkpoint/delete", url.Values{"path": {ck}, "csrf": {tok}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, h.Get("Location"), "/console/runs/"+run)
	_, _, body = a.get(h.Get("Location"))
	require.Contains(t, body, `id="deleted">Deleted checkpoint ck1.`)
	code, _, _ = a.get("/console/checkpoint?path=" + url.QueryEscape(ck))
	require.Equal(t, http.StatusNotFound, code)
	_, _, body = a.get("/console/runs/" + run)
	require.Contains(t, body, "No checkpoints yet.")
}

// FuzzConsoleForms posts arbitrary forms to the console's actions and asks for arbitrary
// pages: the answer is never a 5xx. The wrong-key throttle is all but off, so that the
// fuzzed sign-ins do not turn every later page into a 429.
func FuzzConsoleForms(f *testing.F) {
	base := startServerWith(f, func(c *gateway.Config) {
		c.AuthThrottle = auth.ThrottleOptions{FailuresPerClient: 1 << 30, Failures: 1 << 30}
	})
	b := newBrowser(f, base)
	b.signIn(keyA)
	tok := b.csrf()
	for _, s := range [][3]string{
		{"/console/checkpoint/ttl", "path=tinker://run-x/weights/a&ttl_hours=12", ""},
		{"/console/checkpoint/public", "path=tinker://../../etc&public=true", ""},
		{"/console/checkpoint/delete", "path=weights/a&confirm=yes", ""},
		{"/console/checkpoint/download", "path=%00", ""},
		{"/console/runs/run-x/live", "", "ema=1&log=1"},
		{"/console/usage", "", "range=9999d"},
		{"/", "", "page=bm90IGEgdG9rZW4"},
		{"/console/sessions", "", "page=%ff"},
		{"/console/signin", "api_key=tml-%00x&api_key=tml-console-a", ""},
		{"/console/signout", "csrf=x", ""},
		{"/console/access/request", "model=loops/tiny&max_sequence_length=99999999999&reason=%00", ""},
		{"/console/access/decide", "id=acr-0011&decision=grant&hours=-1", ""},
		{"/console/access", "", "done=%ff"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, path, form, query string) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#?") || len(path) > 2048 || len(form) > 4096 || len(query) > 2048 {
			t.Skip()
		}
		u, err := url.Parse(base + path + "?" + query)
		if err != nil {
			t.Skip()
		}
		bt := &browser{t: t, base: b.base, c: b.c} // the signed-in client, reporting to t
		body := form
		if strings.HasPrefix(path, "/console/checkpoint/") || strings.HasPrefix(path, "/console/access/") {
			body = form + "&csrf=" + tok
		}
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			req, err := http.NewRequest(m, u.String(), strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			code, _, resp := bt.do(req)
			require.Less(t, code, 500, "%s %s: %s", m, u, resp)
		}
	})
}
