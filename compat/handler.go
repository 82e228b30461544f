package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"

	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/bounded"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
	"github.com/loops-dev/loops/internal/imagefetch"
)

// Services are the core handlers compat translates onto. All must be non-nil.
type Services struct {
	Sessions    loopsv1connect.SessionServiceHandler
	Training    loopsv1connect.TrainingServiceHandler
	Operations  loopsv1connect.OperationServiceHandler
	Checkpoints loopsv1connect.CheckpointServiceHandler
	Sampling    loopsv1connect.SamplingServiceHandler
	Models      loopsv1connect.ModelServiceHandler
	Usage       loopsv1connect.UsageServiceHandler
	// Audit serves the audit log and checkpoint storage (nil: those routes answer 501).
	Audit   loopsv1connect.AuditServiceHandler
	Weights loopsv1connect.WeightsAccessServiceHandler
	Clients loopsv1connect.SamplerClientServiceHandler
	// Traces serves trace_export; nil answers it 404 (not served).
	Traces loopsv1connect.TraceServiceHandler
}

// Options tune the Tinker surface. The zero value gives the defaults noted per field.
type Options struct {
	// MaxBodyBytes caps the request body as sent (compressed or not). Default 64 MiB.
	MaxBodyBytes int64
	// MaxDecompressedBytes caps a zstd body after decompression, and the dense size (in
	// bytes, 4 per element) of any tensor compat builds from a sparse or JSON encoding.
	// Default 256 MiB.
	MaxDecompressedBytes int64
	// DecompressBudget bounds the memory of zstd bodies being decompressed, or held
	// decompressed, at once: a body reserves its decompressed size before anything is
	// allocated and holds it until that buffer has been garbage collected (see
	// internal/bounded). The gateway shares one budget between every surface. Default: a
	// budget of MaxDecompressedBytes for this handler alone.
	DecompressBudget *bounded.Budget
	// ImageFetcher fetches the images of image_asset_pointer chunks from the hosts the
	// operator allows; nil: such chunks are refused (the client sends the bytes).
	ImageFetcher *imagefetch.Fetcher
	// LongPoll is how long retrieve_future waits for a result before answering try_again.
	// It must stay below the SDK's 45 s client timeout. Default 25 s.
	LongPoll time.Duration
	// Logger receives debug logs (telemetry, ignored fields) and errors. Default
	// slog.Default().
	Logger *slog.Logger
	// Owner returns the model_owner shown in TrainingRun JSON for the authenticated caller
	// (the gateway knows the workspace; compat does not). Default: the empty string.
	Owner func(ctx context.Context) string
	// DisableZstdForwardBackward makes client/config tell the SDK not to zstd-compress
	// forward_backward bodies (proto_compress_fwdbwd false). Compressed bodies are accepted
	// either way.
	DisableZstdForwardBackward bool
	// Keys serves the auth routes (auth/token, auth/apikey/me); nil: they answer 501 and
	// client/config keeps JWT auth off.
	Keys KeyRoutes
	// DisableJWTAuth keeps client/config's pjwt_auth_enabled off although Keys is set: SDKs
	// then send the API key itself on every request (auth/token is still served).
	DisableJWTAuth bool
}

// KeyRoutes are what the Tinker auth routes need (gateway/auth/keysvc).
type KeyRoutes interface {
	// Token exchanges the request's API key for an access token (a JWT).
	Token(ctx context.Context) (string, error)
	// Identity says who the request's key is.
	Identity(ctx context.Context) (*loopsv1.WhoAmIResponse, error)
	// RevokeSelf revokes the request's own key.
	RevokeSelf(ctx context.Context) error
}

// DecompressWait is how long a compressed body waits for room in the decompression budget
// (or less, if the client goes away first) before it is answered 429, which the SDK retries
// with backoff.
const DecompressWait = 10 * time.Second

const (
	// DefaultMaxBodyBytes is the default cap on a request body as sent: 64 MiB.
	DefaultMaxBodyBytes = 64 << 20
	// DefaultMaxDecompressedBytes is the default cap on a body after decompression: 256 MiB.
	DefaultMaxDecompressedBytes = 256 << 20

	defaultLongPoll  = 25 * time.Second
	contentTypeProto = "application/x-protobuf"
	contentTypeJSON  = "application/json"
)

// server holds what every route needs.
type server struct {
	svc Services
	opt Options
	log *slog.Logger
	// edge answers the routes' errors and panics in Tinker's shape.
	edge *httpedge.Surface
}

// NewHandler returns the handler for every path under /api/v1/. The gateway mounts it at
// "/api/v1/" after authenticating the request; compat passes r.Context() to the core as
// it is.
func NewHandler(s Services, o Options) http.Handler {
	o = o.withDefaults()
	srv := &server{svc: s, opt: o, log: o.Logger, edge: ErrorSurface("compat", o.Logger)}
	mux := http.NewServeMux()
	srv.routes(mux)
	return srv.edge.Recover(mux)
}

// Routes lists the pattern of every route NewHandler registers, the 501 ones and the
// catch-all included (the audit log classifies each: gateway/audit's test fails on one it
// does not know).
func Routes() []string {
	var out []string
	srv := &server{opt: Options{}.withDefaults(), edge: ErrorSurface("compat", slog.Default())}
	srv.log = srv.opt.Logger
	srv.edge.OnHandle = func(p string) { out = append(out, p) }
	srv.routes(http.NewServeMux())
	return out
}

// withDefaults fills in the documented defaults.
func (o Options) withDefaults() Options {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxDecompressedBytes <= 0 {
		o.MaxDecompressedBytes = DefaultMaxDecompressedBytes
	}
	if o.DecompressBudget == nil {
		o.DecompressBudget = bounded.NewBudget(o.MaxDecompressedBytes, DecompressWait)
	}
	if o.LongPoll <= 0 {
		o.LongPoll = defaultLongPoll
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Owner == nil {
		o.Owner = func(context.Context) string { return "" }
	}
	return o
}

// ErrorSurface returns the HTTP edge (internal/httpedge) that answers errors and panics in
// Tinker's shape ({"detail","code","reason"} with the status of the one error table),
// logging to log under name: compat's routes use it as "compat", and the gateway's
// outermost panic recovery as "gateway".
func ErrorSurface(name string, log *slog.Logger) *httpedge.Surface {
	return &httpedge.Surface{Name: name, Logger: log, Classify: answerOf,
		EncodeFailure: []byte(`{"detail":"internal error: cannot encode the response","code":"internal","reason":"INTERNAL"}`)}
}

// writeProto marshals m and writes it as application/x-protobuf.
func writeProto(w http.ResponseWriter, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode protobuf result: %w", err)
	}
	w.Header().Set("Content-Type", contentTypeProto)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil
}

// readBody reads the whole request body within MaxBodyBytes, into a buffer allocated once
// when the body has a Content-Length, and decompresses a zstd body within
// MaxDecompressedBytes and the decompression budget (held until the decompressed body has
// been garbage collected).
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, s.opt.MaxBodyBytes)
	raw, err := bounded.ReadAll(body, r.ContentLength, s.opt.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &apiError{status: http.StatusRequestTimeout, code: "deadline_exceeded", reason: errs.ReasonBodyReadTimeout,
				detail: "the request body did not arrive within the server's body read timeout; send it faster or in smaller requests"}
		}
		return nil, badRequest("cannot read the request body: %v", err)
	}
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity":
		return raw, nil
	case "zstd":
		return decompressZstd(r.Context(), raw, s.opt.MaxDecompressedBytes, s.opt.DecompressBudget)
	default:
		return nil, &apiError{status: http.StatusUnsupportedMediaType, code: "invalid_argument", reason: errs.ReasonUnsupportedEncoding,
			detail: fmt.Sprintf("Content-Encoding %q is not supported; send the body uncompressed or zstd-compressed", enc)}
	}
}

// decompressZstd decodes a zstd body of at most limit bytes with memory bounded by its
// size (see bounded.Zstd) and maps its errors onto Tinker's statuses: 413 over the limit,
// 429 when the budget has no room in time, 400 for a body that is not zstd.
func decompressZstd(ctx context.Context, raw []byte, limit int64, budget *bounded.Budget) ([]byte, error) {
	out, err := bounded.Zstd(ctx, raw, limit, budget)
	if err == nil {
		return out, nil
	}
	var tl *bounded.TooLargeError
	switch {
	case errors.As(err, &tl) && tl.Limit == limit:
		return nil, tooLarge("%s; send smaller forward_backward chunks", err.Error())
	case errors.As(err, &tl):
		return nil, tooLarge("%s", err.Error())
	case errors.Is(err, bounded.ErrBusy):
		return nil, errs.New(connect.CodeResourceExhausted, errs.ReasonDecompressBusy, err)
	}
	return nil, badRequest("%s (Content-Encoding: zstd)", err.Error())
}

// decodeJSONBody reads the body and decodes it into v. Unknown fields (including the
// SDK's "type" discriminator) are ignored; numbers decode into the typed fields of v
// without going through float64 for integers.
func (s *server) decodeJSONBody(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	return decodeJSON(b, v)
}

// decodeJSON decodes b into v; an empty body is an empty object.
func decodeJSON(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return badRequest("malformed JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("malformed JSON body: trailing data after the JSON value")
	}
	return nil
}

// isJSONContent reports whether the request declares a JSON body.
func isJSONContent(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == contentTypeJSON || strings.HasSuffix(mt, "+json")
}

// wantsProto reports whether the client accepts protobuf results.
func wantsProto(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(strings.ToLower(v), contentTypeProto) {
			return true
		}
	}
	return false
}

// queryInt parses an optional non-negative integer query parameter.
// queryPage reads the limit (default defLimit) and offset (default 0) query parameters of a
// listing.
func queryPage(r *http.Request, defLimit int) (limit, offset int, err error) {
	if limit, err = queryInt(r, "limit", defLimit); err != nil {
		return 0, 0, err
	}
	offset, err = queryInt(r, "offset", 0)
	return limit, offset, err
}

func queryInt(r *http.Request, name string, def int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 1<<30 {
		return 0, badRequest("query parameter %s=%q must be a non-negative integer", name, v)
	}
	return n, nil
}
