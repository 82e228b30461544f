package console

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
	"github.com/loops-dev/loops/internal/runcost"
	"github.com/loops-dev/loops/internal/runhealth"
)

// pageNames are the templates/<name>.html files rendered inside templates/layout.html.
var pageNames = []string{"signin", "runs", "run", "checkpoint", "delete", "sessions", "usage", "limits", "deployments", "access", "error"}

var funcs = template.FuncMap{
	"time": func(ts *timestamppb.Timestamp) string {
		if ts == nil || (ts.GetSeconds() == 0 && ts.GetNanos() == 0) {
			return "-"
		}
		return ts.AsTime().UTC().Format("2006-01-02 15:04:05")
	},
	"bytes": func(n int64) string {
		switch {
		case n >= 1<<30:
			return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
		case n >= 1<<20:
			return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
		case n >= 1<<10:
			return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%d B", n)
	},
	// short is a hash's first 12 hex digits ("sha256:0123456789ab…"), "-" for none.
	"short": func(h string) string {
		if h == "" {
			return "-"
		}
		if len(h) > len("sha256:")+12 {
			return h[:len("sha256:")+12] + "…"
		}
		return h
	},
	"duration": func(d *durationpb.Duration) string {
		return d.AsDuration().Round(time.Millisecond).String()
	},
	// list is a repeated string field as "a, b, c" ("-" for none).
	"list": func(v []string) string {
		if len(v) == 0 {
			return "-"
		}
		return strings.Join(v, ", ")
	},
	"q":        url.QueryEscape,
	"kind":     checkpointKind,
	"usage":    usageKind,
	"limit":    limitText,
	"ckstatus": checkpointStatus,
}

func parsePages() map[string]*template.Template {
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		out[name] = template.Must(template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}

// layout is what templates/layout.html reads around every page.
type layout struct {
	Title     string
	Nav       string
	Workspace string
	CSRF      string
	// Refresh is the live parts' refresh interval in milliseconds.
	Refresh int64
	// Deployments is whether the server serves deployments (the nav shows them only then).
	Deployments bool
	Page        any
}

// render writes a whole page.
func (c *Console) render(w http.ResponseWriter, status int, name, title, nav string, s *session, page any) {
	l := layout{Title: title, Nav: nav, Refresh: c.opts.RefreshInterval.Milliseconds(), Deployments: c.svc.Deployments != nil, Page: page}
	if s != nil {
		l.Workspace, l.CSRF = s.workspace, s.csrf
	}
	c.execute(w, status, c.pages[name], "layout", l)
}

// renderFragment writes one named template of a page (a live part, fetched by console.js).
func (c *Console) renderFragment(w http.ResponseWriter, page, fragment string, data any) {
	c.execute(w, http.StatusOK, c.pages[page], fragment, data)
}

func (c *Console) execute(w http.ResponseWriter, status int, t *template.Template, name string, data any) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, data); err != nil {
		c.log.Error("console: rendering a page", slog.String("template", name), slog.Any("err", err))
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page with a status and a message that says what to do.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, status, "error", http.StatusText(status), "", sessionOf(r), msg)
}

func itoa(n int) string { return strconv.Itoa(n) }

// ---- sign-in ----

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, http.StatusOK, "signin", "Sign in", "", nil, "")
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		// Login CSRF: another site signing this browser in to the site's own workspace.
		c.render(w, http.StatusForbidden, "signin", "Sign in", "", nil, "the sign-in form was sent from another site: sign in on this page")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.render(w, http.StatusBadRequest, "signin", "Sign in", "", nil, "the form could not be read: submit it again")
		return
	}
	key := strings.TrimSpace(r.PostForm.Get("api_key"))
	client := c.opts.Proxies.ClientAddr(r)
	ws, err := c.opts.Authenticate(key)
	if errors.Is(err, auth.ErrUnknownKey) {
		if terr := c.opts.Throttle.Failed(client); terr != nil {
			err = terr
		}
	} else if err == nil {
		err = c.opts.Throttle.Check(client)
	}
	var te *auth.ThrottledError
	switch {
	case errors.As(err, &te):
		w.Header().Set(errs.HeaderRetryAfter, errs.RetryAfterValue(te.RetryAfter))
		c.render(w, http.StatusTooManyRequests, "signin", "Sign in", "", nil, err.Error())
		return
	case err != nil:
		c.render(w, http.StatusUnauthorized, "signin", "Sign in", "", nil, err.Error())
		return
	}
	s, err := c.sessions.create(key, ws)
	if err != nil {
		c.render(w, http.StatusTooManyRequests, "signin", "Sign in", "", nil, err.Error())
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: s.id, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.opts.Proxies.HTTPS(r)})
	http.Redirect(w, r, Root, http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request, s *session) error {
	c.sessions.remove(s.id)
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.opts.Proxies.HTTPS(r)})
	http.Redirect(w, r, SignInPath, http.StatusSeeOther)
	return nil
}

// ---- runs ----

// runRow is a line of the runs table.
type runRow struct {
	Run    *loopsv1.TrainingRun
	Status string
}

type runsView struct {
	Runs      []runRow
	Total     int64
	Next      string
	PageToken string
}

func runStatus(r *loopsv1.TrainingRun) string {
	switch {
	case r.GetUnloadReason() != "":
		return "ended: " + r.GetUnloadReason()
	case r.GetCorrupted():
		return "corrupted"
	}
	return "live"
}

func (c *Console) listRuns(r *http.Request) (runsView, error) {
	tok := r.URL.Query().Get("page")
	resp, err := c.svc.Training.ListTrainingRuns(r.Context(), &loopsv1.ListTrainingRunsRequest{Limit: PageSize, PageToken: tok})
	if err != nil {
		return runsView{}, err
	}
	v := runsView{Total: resp.GetTotalCount(), Next: resp.GetNextPageToken(), PageToken: tok}
	for _, run := range resp.GetTrainingRuns() {
		v.Runs = append(v.Runs, runRow{Run: run, Status: runStatus(run)})
	}
	return v, nil
}

func (c *Console) runsPage(w http.ResponseWriter, r *http.Request, s *session) error {
	v, err := c.listRuns(r)
	if err != nil {
		return err
	}
	c.render(w, http.StatusOK, "runs", "Training runs", "runs", s, v)
	return nil
}

func (c *Console) runsLive(w http.ResponseWriter, r *http.Request, s *session) error {
	v, err := c.listRuns(r)
	if err != nil {
		return err
	}
	c.renderFragment(w, "runs", "runs-table", v)
	return nil
}

// ---- one run ----

type runView struct {
	Run      *loopsv1.TrainingRun
	Status   string
	Alerts   []runhealth.Alert
	Charts   []chartView
	EMA, Log bool
	// LiveURL is the live fragment's address with the chart toggles.
	LiveURL     string
	Checkpoints []*loopsv1.Checkpoint
	CkTotal     int64
	CkNext      string
	CkPage      string
	// Deleted names the checkpoint just deleted (after the confirmation's redirect).
	Deleted string
	Now     time.Time
	// Costs are the run's storage and pool costs in the last 30 days, beside its training
	// cost (the cost chart); unpriced ones show nothing.
	Costs []runCost
}

// runCost is one line of a run's costs: what, and its cost in USD ("?" when it did not sum).
type runCost struct{ What, USD string }

// liveView fills what the live fragment shows: the run, its alerts and its charts.
func (c *Console) liveView(r *http.Request) (*runView, error) {
	ctx := r.Context()
	q := r.URL.Query()
	v := &runView{EMA: q.Get("ema") == "1", Log: q.Get("log") == "1", Now: c.opts.Now()}
	run, err := c.svc.Training.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: r.PathValue("id")})
	if err != nil {
		return nil, err
	}
	v.Run, v.Status = run, runStatus(run)
	all, err := c.svc.Training.GetTrainingRunMetrics(ctx, &loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run.GetId(), MaxPoints: ChartPoints})
	if err != nil {
		return nil, err
	}
	recent, err := c.svc.Training.GetTrainingRunMetrics(ctx, &loopsv1.GetTrainingRunMetricsRequest{
		TrainingRunId: run.GetId(), FromStep: max(run.GetOptimSteps()+1-AlertSteps, 1)})
	if err != nil {
		return nil, err
	}
	v.Alerts = runhealth.Check(recent.GetSteps())
	o := chartOptions{EMA: v.EMA, Log: v.Log}
	if v.Charts, err = c.drawer.draw(ctx, keyOf(auth.Workspace(ctx), run.GetId(), all.GetSteps(), o), all.GetSteps()); err != nil {
		return nil, err
	}
	if c.svc.Evals != nil {
		res, err := c.svc.Evals.ListEvalResults(ctx, &loopsv1.ListEvalResultsRequest{TrainingRunId: run.GetId()})
		if err != nil {
			return nil, err
		}
		if len(res.GetResults()) > 0 { // beside the loss, the first chart
			ev := evalChart(res.GetResults(), o)
			v.Charts = append(v.Charts[:1:1], append([]chartView{ev}, v.Charts[1:]...)...)
		}
	}
	lq := url.Values{}
	if v.EMA {
		lq.Set("ema", "1")
	}
	if v.Log {
		lq.Set("log", "1")
	}
	v.LiveURL = Prefix + "runs/" + url.PathEscape(run.GetId()) + "/live"
	if len(lq) > 0 {
		v.LiveURL += "?" + lq.Encode()
	}
	return v, nil
}

func (c *Console) runPage(w http.ResponseWriter, r *http.Request, s *session) error {
	v, err := c.liveView(r)
	if err != nil {
		return err
	}
	tok := r.URL.Query().Get("ckpage")
	cks, err := c.svc.Checkpoints.ListCheckpoints(r.Context(), &loopsv1.ListCheckpointsRequest{TrainingRunId: v.Run.GetId(), Limit: PageSize, PageToken: tok})
	if err != nil {
		return err
	}
	v.Checkpoints, v.CkTotal, v.CkNext, v.CkPage = cks.GetCheckpoints(), cks.GetTotalCount(), cks.GetNextPageToken(), tok
	if d := r.URL.Query().Get("deleted"); len(d) <= 200 {
		v.Deleted = d
	}
	usage, err := c.svc.Usage.GetUsage(r.Context(), &loopsv1.GetUsageRequest{}) // the last 30 days
	if err != nil {
		return err
	}
	rc := runcost.Of(usage.GetBuckets(), v.Run.GetId(), v.Run.GetSessionId())
	for _, l := range []struct {
		what string
		t    *money.Tally
	}{
		{"Checkpoint storage, last 30 days", &rc.Storage},
		{"Session checkpoint storage metered before runs were metered apart", &rc.SessionStorage},
		{"Dedicated pool time, last 30 days", &rc.Pool},
	} {
		if l.t.Priced > 0 {
			v.Costs = append(v.Costs, runCost{l.what, costText(l.t)})
		}
	}
	c.render(w, http.StatusOK, "run", "Run "+v.Run.GetId(), "runs", s, v)
	return nil
}

func (c *Console) runLive(w http.ResponseWriter, r *http.Request, s *session) error {
	v, err := c.liveView(r)
	if err != nil {
		return err
	}
	c.renderFragment(w, "run", "run-live", v)
	return nil
}

// ---- checkpoints ----

func checkpointKind(k loopsv1.CheckpointKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "CHECKPOINT_KIND_"))
}

// checkpointStatus is "public" or "private", and when it expires.
func checkpointStatus(ck *loopsv1.Checkpoint) string {
	s := "private"
	if ck.GetPublic() {
		s = "public"
	}
	if ck.GetExpireTime() != nil {
		s += ", expires " + ck.GetExpireTime().AsTime().UTC().Format("2006-01-02 15:04")
	}
	return s
}

type checkpointView struct {
	Checkpoint *loopsv1.Checkpoint
	// Message reports the last action (after a redirect).
	Message string
}

// formPath is the checkpoint path of a request (query or form), checked for shape only:
// the service resolves it within the workspace.
func formPath(r *http.Request) (string, error) {
	p := r.FormValue("path")
	if p == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("no checkpoint path: open the checkpoint from its run's page"))
	}
	if len(p) > 1024 {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("checkpoint path is over 1024 bytes: open the checkpoint from its run's page"))
	}
	return p, nil
}

func (c *Console) checkpointPage(w http.ResponseWriter, r *http.Request, s *session) error {
	p, err := formPath(r)
	if err != nil {
		return err
	}
	ck, err := c.svc.Checkpoints.GetCheckpoint(r.Context(), &loopsv1.GetCheckpointRequest{Path: p})
	if err != nil {
		return err
	}
	msg := r.URL.Query().Get("done")
	if len(msg) > 200 {
		msg = ""
	}
	c.render(w, http.StatusOK, "checkpoint", "Checkpoint "+ck.GetName(), "runs", s, checkpointView{Checkpoint: ck, Message: msg})
	return nil
}

// backToCheckpoint redirects to the checkpoint's page, with a note of what was done.
func backToCheckpoint(w http.ResponseWriter, r *http.Request, path, done string) {
	http.Redirect(w, r, Prefix+"checkpoint?"+url.Values{"path": {path}, "done": {done}}.Encode(), http.StatusSeeOther)
}

func (c *Console) setPublic(w http.ResponseWriter, r *http.Request, s *session) error {
	p, err := formPath(r)
	if err != nil {
		return err
	}
	public := r.PostForm.Get("public") == "true"
	if _, err := c.svc.Checkpoints.SetCheckpointPublic(r.Context(), &loopsv1.SetCheckpointPublicRequest{Path: p, Public: public}); err != nil {
		return err
	}
	done := "unpublished"
	if public {
		done = "published"
	}
	backToCheckpoint(w, r, p, done)
	return nil
}

// maxTTLHours bounds the TTL form (ten years).
const maxTTLHours = 10 * 366 * 24

func (c *Console) setTTL(w http.ResponseWriter, r *http.Request, s *session) error {
	p, err := formPath(r)
	if err != nil {
		return err
	}
	req := &loopsv1.SetCheckpointTTLRequest{Path: p}
	done := "expiry removed"
	if h := strings.TrimSpace(r.PostForm.Get("ttl_hours")); h != "" {
		n, err := strconv.ParseInt(h, 10, 64)
		if err != nil || n < 1 || n > maxTTLHours {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("TTL %q: give a whole number of hours between 1 and %d, or leave it empty to keep the checkpoint until deleted", h, maxTTLHours))
		}
		req.TtlSeconds = proto.Int64(n * 3600)
		done = fmt.Sprintf("expires in %d h", n)
	}
	if _, err := c.svc.Checkpoints.SetCheckpointTTL(r.Context(), req); err != nil {
		return err
	}
	backToCheckpoint(w, r, p, done)
	return nil
}

// download asks for a short-lived archive link and sends the browser to it. Issuing a link
// takes one of the server's bounded link slots, so it is a POST with the CSRF token.
func (c *Console) download(w http.ResponseWriter, r *http.Request, s *session) error {
	p, err := formPath(r)
	if err != nil {
		return err
	}
	resp, err := c.svc.Checkpoints.GetCheckpointArchiveURL(r.Context(), &loopsv1.GetCheckpointArchiveURLRequest{Path: p})
	if err != nil {
		return err
	}
	http.Redirect(w, r, resp.GetUrl(), http.StatusSeeOther)
	return nil
}

func (c *Console) deleteConfirmPage(w http.ResponseWriter, r *http.Request, s *session) error {
	p, err := formPath(r)
	if err != nil {
		return err
	}
	ck, err := c.svc.Checkpoints.GetCheckpoint(r.Context(), &loopsv1.GetCheckpointRequest{Path: p})
	if err != nil {
		return err
	}
	c.render(w, http.StatusOK, "delete", "Delete "+ck.GetName()+"?", "runs", s, checkpointView{Checkpoint: ck})
	return nil
}

func (c *Console) deleteCheckpoint(w http.ResponseWriter, r *http.Request, s *session) error {
	p, err := formPath(r)
	if err != nil {
		return err
	}
	if r.PostForm.Get("confirm") != "yes" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("the deletion was not confirmed: use the Delete button on the confirmation page"))
	}
	ck, err := c.svc.Checkpoints.GetCheckpoint(r.Context(), &loopsv1.GetCheckpointRequest{Path: p})
	if err != nil {
		return err
	}
	if _, err := c.svc.Checkpoints.DeleteCheckpoint(r.Context(), &loopsv1.DeleteCheckpointRequest{Path: p}); err != nil {
		return err
	}
	http.Redirect(w, r, Prefix+"runs/"+url.PathEscape(ck.GetTrainingRunId())+"?"+url.Values{"deleted": {ck.GetName()}}.Encode(), http.StatusSeeOther)
	return nil
}

// ---- sessions ----

type sessionRow struct {
	Session  *loopsv1.Session
	Samplers []*loopsv1.Sampler
	// More is how many samplers are not looked up (beyond SamplersPerSession).
	More int
}

type sessionsView struct {
	Sessions []sessionRow
	Total    int64
	Next     string
}

func (c *Console) sessionsPage(w http.ResponseWriter, r *http.Request, s *session) error {
	resp, err := c.svc.Sessions.ListSessions(r.Context(), &loopsv1.ListSessionsRequest{Limit: PageSize, PageToken: r.URL.Query().Get("page")})
	if err != nil {
		return err
	}
	v := sessionsView{Total: resp.GetTotalCount(), Next: resp.GetNextPageToken()}
	for _, ss := range resp.GetSessions() {
		row := sessionRow{Session: ss}
		ids := ss.GetSamplerIds()
		for _, id := range ids[:min(len(ids), SamplersPerSession)] {
			sm, err := c.svc.Sampling.GetSampler(r.Context(), &loopsv1.GetSamplerRequest{Id: id})
			if err != nil {
				sm = &loopsv1.Sampler{Id: id} // gone since the session listed it
			}
			row.Samplers = append(row.Samplers, sm)
		}
		row.More = len(ids) - len(row.Samplers)
		v.Sessions = append(v.Sessions, row)
	}
	c.render(w, http.StatusOK, "sessions", "Sessions and samplers", "sessions", s, v)
	return nil
}

// ---- usage ----

func usageKind(k loopsv1.UsageKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "USAGE_KIND_"))
}

// usageRange is one of the usage page's choices: how far back, and the bucket width.
type usageRange struct {
	Name          string
	Since, Bucket time.Duration
}

// usageRanges are the usage page's choices; the first is the default.
var usageRanges = []usageRange{
	{"24h", 24 * time.Hour, time.Hour},
	{"7d", 7 * 24 * time.Hour, 24 * time.Hour},
	{"30d", 30 * 24 * time.Hour, 24 * time.Hour},
}

type usageRow struct {
	Start  time.Time
	Model  string
	Kind   loopsv1.UsageKind
	Amount int64
	// Cost is what the priced part of Amount cost in USD ("" when none was priced; "*"
	// after it when only part was).
	Cost string
}

type usageView struct {
	Range  string
	Ranges []string
	By     string
	Rows   []usageRow
	Totals []usageRow
	// Priced: some usage has a cost (the server has a price sheet); MonthCost is the
	// workspace's cost this UTC month.
	Priced    bool
	MonthCost string
}

// costText is a tally's cost as the usage page shows it: "?" when a cost did not sum.
func costText(t *money.Tally) string {
	if t.Err != nil {
		return "?"
	}
	return t.Text("")
}

func (c *Console) usagePage(w http.ResponseWriter, r *http.Request, s *session) error {
	name := r.URL.Query().Get("range")
	i := slices.IndexFunc(usageRanges, func(u usageRange) bool { return u.Name == name })
	if i < 0 {
		i = 0
	}
	rg := usageRanges[i]
	end := c.opts.Now()
	resp, err := c.svc.Usage.GetUsage(r.Context(), &loopsv1.GetUsageRequest{StartTime: timestamppb.New(end.Add(-rg.Since)), EndTime: timestamppb.New(end)})
	if err != nil {
		return err
	}
	v := usageView{Range: rg.Name, By: "hour"}
	if rg.Bucket == 24*time.Hour {
		v.By = "day"
	}
	for _, u := range usageRanges {
		v.Ranges = append(v.Ranges, u.Name)
	}
	type key struct {
		start time.Time
		model string
		kind  loopsv1.UsageKind
	}
	sums := map[key]*money.Tally{}
	totals := map[loopsv1.UsageKind]*money.Tally{}
	for _, b := range resp.GetBuckets() {
		k := key{b.GetStartTime().AsTime().UTC().Truncate(rg.Bucket), b.GetBaseModel(), b.GetKind()}
		if sums[k] == nil {
			sums[k] = &money.Tally{}
		}
		if totals[k.kind] == nil {
			totals[k.kind] = &money.Tally{}
		}
		sums[k].Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
		totals[k.kind].Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
		v.Priced = v.Priced || b.GetCostUsd() != ""
	}
	for k, n := range sums {
		v.Rows = append(v.Rows, usageRow{k.start, k.model, k.kind, n.Amount, costText(n)})
	}
	if v.Priced { // the workspace's month so far
		t := end.UTC()
		month, err := c.svc.Usage.GetUsage(r.Context(), &loopsv1.GetUsageRequest{
			StartTime: timestamppb.New(time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)), EndTime: timestamppb.New(end)})
		if err != nil {
			return err
		}
		var m money.Tally
		for _, b := range month.GetBuckets() {
			m.Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
		}
		v.MonthCost = m.Cost.String() // summed over kinds, unpriced ones adding nothing
		if m.Err != nil {
			v.MonthCost = "?"
		}
	}
	slices.SortFunc(v.Rows, func(a, b usageRow) int {
		if c := b.Start.Compare(a.Start); c != 0 {
			return c // newest first
		}
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return int(a.Kind) - int(b.Kind)
	})
	for k, n := range totals {
		v.Totals = append(v.Totals, usageRow{Kind: k, Amount: n.Amount, Cost: costText(n)})
	}
	slices.SortFunc(v.Totals, func(a, b usageRow) int { return int(a.Kind) - int(b.Kind) })
	c.render(w, http.StatusOK, "usage", "Usage", "usage", s, v)
	return nil
}

// ---- limits ----

// limitText shows a limit, 0 being "no limit of its own".
func limitText(n int32) string {
	if n == 0 {
		return "no workspace limit"
	}
	return strconv.Itoa(int(n))
}

func (c *Console) limitsPage(w http.ResponseWriter, r *http.Request, s *session) error {
	ws, err := c.svc.Workspace.GetWorkspace(r.Context(), &loopsv1.GetWorkspaceRequest{})
	if err != nil {
		return err
	}
	c.render(w, http.StatusOK, "limits", "Workspace limits", "limits", s, ws)
	return nil
}

// ---- deployments (only when the server serves them) ----

func (c *Console) deploymentsPage(w http.ResponseWriter, r *http.Request, s *session) error {
	if c.svc.Deployments == nil {
		c.fail(w, r, http.StatusNotFound, "this server serves no deployments")
		return nil
	}
	resp, err := c.svc.Deployments.ListDeployments(r.Context(), &loopsv1.ListDeploymentsRequest{})
	if err != nil {
		return err
	}
	c.render(w, http.StatusOK, "deployments", "Deployments", "deployments", s, resp.GetDeployments())
	return nil
}
