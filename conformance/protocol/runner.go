package protocol

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	conformancev1 "github.com/loops-dev/loops/gen/go/loops/conformance/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

type tinkerForm = *conformancev1.TinkerCall

// AllSurfaces are the surfaces in the order subtests are named and run.
var AllSurfaces = []conformancev1.Surface{
	conformancev1.Surface_SURFACE_CONNECT,
	conformancev1.Surface_SURFACE_GRPC,
	conformancev1.Surface_SURFACE_REST,
	conformancev1.Surface_SURFACE_TINKER,
}

// SurfaceName is the short name used in subtest names: connect, grpc, rest, tinker.
func SurfaceName(s conformancev1.Surface) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SURFACE_"))
}

// Options configure a run. APIKey is required.
type Options struct {
	// APIKey is the key of the workspace the cases run in.
	APIKey string
	// OtherAPIKey is a key of another workspace; cases that need one are skipped without it.
	OtherAPIKey string
	// OperatorAPIKey is an operator key (${operator_key}): cases that manage API keys
	// (KeyService) need one and are skipped without it.
	OperatorAPIKey string
	// BaseModel is ${base_model} (default "loops/tiny").
	BaseModel string
	// Surfaces limits the surfaces (default all).
	Surfaces []conformancev1.Surface
	// MaxBodyBytes is the server's request body limit; over-limit cases send one byte more.
	// Zero skips them.
	MaxBodyBytes int64
	// OpenMode says the server accepts any well-formed key by design; the unknown-key
	// cases are skipped.
	OpenMode bool
	// KnownFailing lists cases expected to fail (nil: none).
	KnownFailing *KnownFailing
	// Cases to run (default EmbeddedCases).
	Cases []*Case
	// HTTPClient is used for Connect, REST and Tinker (default: a client with a 2-minute
	// timeout).
	HTTPClient *http.Client
	// CaseTimeout bounds one case on one surface (default 2 minutes).
	CaseTimeout time.Duration
	// Parallel is how many cases Execute runs at once (default 4).
	Parallel int
	// Logger receives progress at debug level (default slog.Default()).
	Logger *slog.Logger
}

// Status is how a case ended on a surface.
type Status string

// The statuses of a Result.
const (
	StatusPass Status = "pass"
	StatusFail Status = "fail"
	// StatusSkip: the target lacks something the case requires.
	StatusSkip Status = "skip"
	// StatusKnownFailing: it failed and is listed as known-failing.
	StatusKnownFailing Status = "known_failing"
	// StatusUnexpectedPass: it is listed as known-failing but passed; remove the entry.
	StatusUnexpectedPass Status = "unexpected_pass"
)

// Failed reports whether the status should fail a run.
func (s Status) Failed() bool { return s == StatusFail || s == StatusUnexpectedPass }

// Result is one case on one surface.
type Result struct {
	// Name is "<file>/<case>/<surface>".
	Name     string        `json:"name"`
	Surface  string        `json:"surface"`
	Status   Status        `json:"status"`
	Reason   string        `json:"reason,omitempty"`
	Duration time.Duration `json:"duration_ns"`
}

// runner holds the clients of one run.
type runner struct {
	base string
	http *http.Client
	grpc *grpc.ClientConn
	opts Options
	log  *slog.Logger
}

func newRunner(baseURL string, opts Options) (*runner, error) {
	if opts.APIKey == "" {
		return nil, fmt.Errorf("protocol: APIKey is required")
	}
	if opts.BaseModel == "" {
		opts.BaseModel = "loops/tiny"
	}
	if len(opts.Surfaces) == 0 {
		opts.Surfaces = AllSurfaces
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 2 * time.Minute}
	}
	if opts.CaseTimeout <= 0 {
		opts.CaseTimeout = 2 * time.Minute
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Cases == nil {
		cs, err := EmbeddedCases()
		if err != nil {
			return nil, err
		}
		opts.Cases = cs
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("protocol: target %q is not an http(s) URL", baseURL)
	}
	r := &runner{base: strings.TrimSuffix(baseURL, "/"), http: opts.HTTPClient, opts: opts, log: opts.Logger}
	if slices.Contains(opts.Surfaces, conformancev1.Surface_SURFACE_GRPC) {
		creds := insecure.NewCredentials()
		if u.Scheme == "https" {
			creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
		}
		host := u.Host
		if u.Port() == "" {
			host += map[string]string{"http": ":80", "https": ":443"}[u.Scheme]
		}
		r.grpc, err = grpc.NewClient(host, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, fmt.Errorf("protocol: gRPC client: %w", err)
		}
	}
	return r, nil
}

func (r *runner) close() {
	if r.grpc != nil {
		_ = r.grpc.Close()
	}
}

// job is one case on one surface.
type job struct {
	c *Case
	s conformancev1.Surface
}

func (j job) name() string { return j.c.FullName() + "/" + SurfaceName(j.s) }

func (r *runner) jobs() []job {
	var out []job
	for _, c := range r.opts.Cases {
		for _, s := range surfacesOf(c) {
			if slices.Contains(r.opts.Surfaces, s) {
				out = append(out, job{c, s})
			}
		}
	}
	return out
}

// Run runs every case on every surface as a parallel subtest of t named
// "<file>/<case>/<surface>". A failing case fails its subtest; a known-failing one is
// skipped with its reason; a known-failing one that passes fails, so the list is kept short.
func Run(t *testing.T, baseURL string, opts Options) {
	t.Helper()
	r, err := newRunner(baseURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	for _, j := range r.jobs() {
		t.Run(j.name(), func(t *testing.T) {
			t.Parallel()
			res := r.result(t.Context(), j)
			switch res.Status {
			case StatusSkip:
				t.Skip(res.Reason)
			case StatusKnownFailing:
				t.Skipf("known failing: %s", res.Reason)
			case StatusFail, StatusUnexpectedPass:
				t.Error(res.Reason)
			}
		})
	}
}

// Execute runs every case on every surface and returns the results in case order.
func Execute(ctx context.Context, baseURL string, opts Options) ([]Result, error) {
	r, err := newRunner(baseURL, opts)
	if err != nil {
		return nil, err
	}
	defer r.close()
	jobs := r.jobs()
	out := make([]Result, len(jobs))
	sem := make(chan struct{}, r.opts.Parallel)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = r.result(ctx, j)
		}()
	}
	wg.Wait()
	return out, ctx.Err()
}

// result runs one job and classifies it against the requirements and the known failures.
func (r *runner) result(ctx context.Context, j job) Result {
	res := Result{Name: j.name(), Surface: SurfaceName(j.s)}
	for _, need := range needsOf(j.c) {
		switch {
		case need == RequiresOtherKey && r.opts.OtherAPIKey == "":
			res.Status, res.Reason = StatusSkip, "needs a second API key in another workspace"
			return res
		case need == RequiresOperatorKey && r.opts.OperatorAPIKey == "":
			res.Status, res.Reason = StatusSkip, "needs an operator key"
			return res
		case need == RequiresBodyLimit && r.opts.MaxBodyBytes <= 0:
			res.Status, res.Reason = StatusSkip, "needs the server's body limit"
			return res
		case need == RequiresKeyCheck && r.opts.OpenMode:
			res.Status, res.Reason = StatusSkip, "the server accepts any key by design (open mode)"
			return res
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.opts.CaseTimeout)
	err := r.runCase(ctx, j)
	cancel()
	res.Duration = time.Since(start)
	reason, known := r.opts.KnownFailing.Match(res.Name)
	switch {
	case err == nil && known:
		res.Status, res.Reason = StatusUnexpectedPass, "passes but is listed as known-failing ("+reason+"): remove the entry"
	case err == nil:
		res.Status = StatusPass
	case known:
		res.Status, res.Reason = StatusKnownFailing, reason+": "+err.Error()
	default:
		res.Status, res.Reason = StatusFail, err.Error()
	}
	r.log.Debug("conformance case done", slog.String("case", res.Name), slog.String("status", string(res.Status)), slog.Duration("took", res.Duration))
	return res
}

func (r *runner) runCase(ctx context.Context, j job) error {
	sc := newScope(map[string]string{
		"key":          r.opts.APIKey,
		"other_key":    r.opts.OtherAPIKey,
		"operator_key": r.opts.OperatorAPIKey,
		"base_model":   r.opts.BaseModel,
		"unique":       randomToken(),
		"surface":      SurfaceName(j.s),
	})
	for i, st := range j.c.GetSteps() {
		var err error
		if j.s == conformancev1.Surface_SURFACE_TINKER {
			err = r.tinkerStep(ctx, sc, st)
		} else {
			err = r.loopsStep(ctx, sc, st, j.s)
		}
		if err != nil {
			label := st.GetId()
			if label == "" {
				label = stepLabel(st, j.s)
			}
			return fmt.Errorf("step %d (%s): %w", i+1, label, err)
		}
	}
	return nil
}

func stepLabel(st *conformancev1.Step, s conformancev1.Surface) string {
	if s == conformancev1.Surface_SURFACE_TINKER {
		return st.GetTinker().GetPath()
	}
	m := st.GetCall().GetMethod()
	return m[strings.LastIndex(m, "/")+1:]
}

func randomToken() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// apiKey is the key a step sends.
func apiKey(sc *scope, st *conformancev1.Step) (string, error) {
	if st.ApiKey == nil {
		return sc.fixed["key"], nil
	}
	return sc.expand(st.GetApiKey())
}

// checkMessage requires every substring in want (case-insensitive) in got.
func checkMessage(got string, want []string) error {
	for _, w := range want {
		if !strings.Contains(strings.ToLower(got), strings.ToLower(w)) {
			return fmt.Errorf("message %q does not contain %q", got, w)
		}
	}
	return nil
}

// tinkerStatus is the Tinker status the core code maps to (compat's table).
func tinkerStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.AlreadyExists, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	}
	return runtime.HTTPStatusFromCode(c)
}

func (r *runner) loopsStep(ctx context.Context, sc *scope, st *conformancev1.Step, s conformancev1.Surface) error {
	key, err := apiKey(sc, st)
	if err != nil {
		return err
	}
	exp := st.GetExpect()
	want, _ := parseCode(exp.GetGrpcCode())
	call := st.GetCall()
	md, err := findMethod(call.GetMethod())
	if err != nil {
		return err
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		return err
	}
	req := mt.New().Interface()
	if call.GetRequest() != nil {
		st, err := sc.expandStruct(call.GetRequest())
		if err != nil {
			return err
		}
		j, err := protojson.Marshal(st)
		if err != nil {
			return err
		}
		if err := protojson.Unmarshal(j, req); err != nil {
			return fmt.Errorf("the case's request is not a valid %s: %w", md.Input().FullName(), err)
		}
	}
	res, err := r.invokeLoops(ctx, s, loopsCall{method: md, req: req, raw: call.GetRaw(), key: key})
	if err != nil {
		return err
	}
	if s == conformancev1.Surface_SURFACE_REST {
		ws := int(exp.GetHttpStatus())
		if ws == 0 {
			ws = runtime.HTTPStatusFromCode(want)
		}
		if res.status != ws {
			return fmt.Errorf("REST answered %d (%s: %q), want %d", res.status, res.code, res.message, ws)
		}
		if ws/100 != 2 {
			return checkMessage(res.message, exp.GetMessageContains())
		}
	} else {
		if res.code != want {
			return fmt.Errorf("answered %s (%q), want %s", res.code, res.message, want)
		}
		if want != codes.OK {
			return checkMessage(res.message, exp.GetMessageContains())
		}
	}
	out := res.out
	if st.GetWait() {
		op, ok := out.(*loopsv1.Operation)
		if !ok {
			return fmt.Errorf("wait: %s does not answer an Operation", md.FullName())
		}
		if op, err = r.waitLoops(ctx, s, op, key); err != nil {
			return err
		}
		if err := checkOutcome(exp, op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED || op.GetState() == loopsv1.OperationState_OPERATION_STATE_CANCELLED, op.GetError().GetMessage()); err != nil {
			return err
		}
		out = op
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(out)
	if err != nil {
		return err
	}
	doc, err := decodeDoc(b)
	if err != nil {
		return err
	}
	if err := sc.record(st.GetId(), doc, call.GetCapture()); err != nil {
		return err
	}
	return sc.checkDoc(doc, call.GetChecks())
}

// checkOutcome compares how an awaited operation ended with the expectation.
func checkOutcome(exp *conformancev1.Expect, failed bool, errMsg string) error {
	wantFailed := exp.GetOutcome() == conformancev1.Outcome_OUTCOME_FAILED
	switch {
	case failed && !wantFailed:
		return fmt.Errorf("the operation failed: %s", errMsg)
	case !failed && wantFailed:
		return fmt.Errorf("the operation succeeded, want it to fail")
	case failed:
		return checkMessage(errMsg, exp.GetMessageContains())
	}
	return nil
}

// waitLoops calls WaitOperation on the same surface until the operation is done.
func (r *runner) waitLoops(ctx context.Context, s conformancev1.Surface, op *loopsv1.Operation, key string) (*loopsv1.Operation, error) {
	md, _ := findMethod("loops.v1.OperationService/WaitOperation")
	for {
		switch op.GetState() {
		case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, loopsv1.OperationState_OPERATION_STATE_FAILED, loopsv1.OperationState_OPERATION_STATE_CANCELLED:
			return op, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("operation %s still %s when time ran out", op.GetId(), op.GetState())
		}
		res, err := r.invokeLoops(ctx, s, loopsCall{method: md, key: key,
			req: &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}})
		if err != nil {
			return nil, fmt.Errorf("WaitOperation: %w", err)
		}
		if res.code != codes.OK {
			return nil, fmt.Errorf("WaitOperation answered %s: %s", res.code, res.message)
		}
		op = res.out.(*loopsv1.Operation)
	}
}

func (r *runner) tinkerStep(ctx context.Context, sc *scope, st *conformancev1.Step) error {
	key, err := apiKey(sc, st)
	if err != nil {
		return err
	}
	tc := st.GetTinker()
	exp := st.GetExpect()
	want, _ := parseCode(exp.GetGrpcCode())
	path, err := sc.expand(tc.GetPath())
	if err != nil {
		return err
	}
	method := tc.GetMethod()
	if method == "" {
		method = http.MethodPost
	}
	body, ct, err := r.tinkerBody(sc, tc)
	if err != nil {
		return err
	}
	headers := map[string]string{}
	for k, v := range tc.GetHeaders() {
		if headers[k], err = sc.expand(v); err != nil {
			return err
		}
	}
	cl := &TinkerClient{BaseURL: r.base, APIKey: key, HTTP: r.http}
	var b any
	if body != nil {
		b = body
	}
	res, err := cl.Do(ctx, method, path, b, ct, headers)
	if err != nil {
		return err
	}
	ws := int(exp.GetTinkerStatus())
	if ws == 0 {
		ws = tinkerStatus(want)
	}
	msgs := exp.GetMessageContains()
	if len(tc.GetMessageContains()) > 0 {
		msgs = tc.GetMessageContains()
	}
	if res.Status != ws {
		return fmt.Errorf("%s %s answered %d (%.300s), want %d", method, path, res.Status, res.Message(), ws)
	}
	if ws/100 != 2 {
		return checkMessage(res.Message(), msgs)
	}
	doc := res.Doc
	if st.GetWait() {
		m, _ := doc.(map[string]any)
		rid, _ := m["request_id"].(string)
		if rid == "" {
			return fmt.Errorf("wait: the answer has no request_id: %.300s", res.Body)
		}
		fr, err := cl.Retrieve(ctx, rid, ResultType(path))
		if err != nil {
			return err
		}
		e := &conformancev1.Expect{Outcome: exp.GetOutcome(), MessageContains: msgs}
		if err := checkOutcome(e, fr.Failed, fr.Error); err != nil {
			return err
		}
		doc = fr.Doc
	}
	if err := sc.record(st.GetId(), doc, tc.GetCapture()); err != nil {
		return err
	}
	return sc.checkDoc(doc, tc.GetChecks())
}
