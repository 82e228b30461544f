package openai

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/loops-dev/loops/compat"
	"github.com/loops-dev/loops/compat/inference"
	"github.com/loops-dev/loops/compat/internal/infer"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
	"github.com/loops-dev/loops/internal/semantics"
)

// Prefix is the path under which the gateway mounts the handler.
const Prefix = "/oai/api/v1/"

// Services are the core handlers the adapter translates onto. All must be non-nil.
type Services struct {
	Sampling    loopsv1connect.SamplingServiceHandler
	Operations  loopsv1connect.OperationServiceHandler
	Models      loopsv1connect.ModelServiceHandler
	Checkpoints loopsv1connect.CheckpointServiceHandler
	// Deployments, when set, adds the workspace's deployments (and those shared with it) to
	// GET /models.
	Deployments loopsv1connect.DeploymentServiceHandler
}

// Options tune the OpenAI surface. The zero value gives the defaults noted per field.
type Options struct {
	// MaxBodyBytes caps a request body. Default compat.DefaultMaxBodyBytes, 64 MiB (the
	// gateway passes its Limits.MaxBodyBytes, the cap of every surface).
	MaxBodyBytes int64
	// MaxSamplesPerRequest caps n (the core's Options.MaxSamplesPerRequest, which the
	// gateway passes). Default semantics.MaxNumSamples.
	MaxSamplesPerRequest int
	// MaxSamplers bounds the samplers the adapter remembers, one per (workspace, model): past
	// it the least recently used is forgotten (its next request creates a new sampler). The
	// gateway passes the core's Limits.MaxSamplersInMemory. Default
	// semantics.MaxSamplersInMemory, the core's default too.
	MaxSamplers int
	// Logger receives debug logs and errors. Default slog.Default().
	Logger *slog.Logger
	// Workspace returns the authenticated caller's workspace (the gateway's
	// auth.Workspace): the sampler cache is keyed by it. Default: one shared key, which is
	// only right when the core serves one workspace.
	Workspace func(ctx context.Context) string
	// Now returns the current time (the "created" field). Default time.Now.
	Now func() time.Time
	// Engine is the sampling engine shared with the other inference APIs
	// (compat/inference); MaxSamplers and Workspace are then the engine's. Default: an
	// engine of this handler's own.
	Engine *inference.Engine
}

const (
	defaultMaxBodyBytes = compat.DefaultMaxBodyBytes
	defaultMaxSamplers  = semantics.MaxSamplersInMemory
)

func (o Options) withDefaults() Options {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = defaultMaxBodyBytes
	}
	if o.MaxSamplesPerRequest <= 0 {
		o.MaxSamplesPerRequest = semantics.MaxNumSamples
	}
	if o.MaxSamplers <= 0 {
		o.MaxSamplers = defaultMaxSamplers
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Workspace == nil {
		o.Workspace = func(context.Context) string { return "" }
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// server holds what every route needs.
type server struct {
	svc    Services
	opt    Options
	log    *slog.Logger
	engine *infer.Engine
	// edge answers the routes' errors and panics in OpenAI's shape.
	edge *httpedge.Surface
}

// NewHandler returns the handler for every path under Prefix. The gateway mounts it after
// authenticating the request (Authorization: Bearer <key> or X-API-Key) and passes
// r.Context(), with the caller's workspace, to the core as it is.
func NewHandler(s Services, o Options) http.Handler {
	o = o.withDefaults()
	eng := o.Engine
	if eng == nil {
		eng = inference.New(inference.Services{Sampling: s.Sampling, Operations: s.Operations, Models: s.Models},
			inference.Options{MaxSamplers: o.MaxSamplers, Workspace: o.Workspace})
	}
	srv := &server{svc: s, opt: o, log: o.Logger, engine: eng, edge: errorSurface(o.Logger)}
	mux := http.NewServeMux()
	srv.edge.Handle(mux, "POST "+Prefix+"chat/completions", srv.chatCompletions)
	srv.edge.Handle(mux, "POST "+Prefix+"completions", srv.completions)
	srv.edge.Handle(mux, "GET "+Prefix+"models", srv.listModels)
	srv.edge.Handle(mux, "GET "+Prefix+"models/{model...}", srv.getModel)
	srv.edge.Handle(mux, "POST "+Prefix+"embeddings", srv.embeddings)
	srv.edge.Handle(mux, Prefix, func(_ http.ResponseWriter, r *http.Request) error {
		return &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, code: "unknown_route",
			message: r.Method + " " + r.URL.Path + " is not an OpenAI-compatible route served by Loops (POST chat/completions, POST completions, POST embeddings, GET models)"}
	})
	return srv.edge.Recover(infer.WithSessions(mux))
}

// errorSurface returns the HTTP edge (internal/httpedge) that answers errors and panics in
// OpenAI's error shape, logging to log.
func errorSurface(log *slog.Logger) *httpedge.Surface {
	return &httpedge.Surface{Name: "openai", Logger: log, Classify: answerOf,
		EncodeFailure: []byte(`{"error":{"message":"internal error: cannot encode the response","type":"server_error","param":null,"code":"internal"}}`)}
}

// OpenAI's error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typePermission     = "permission_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// apiError is an error the adapter answers itself (a field it rejects, a route it does not
// serve), with OpenAI's fields.
type apiError struct {
	status  int
	typ     string
	param   string
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

// badField returns a 400 that names the request field param.
func badField(param, format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: param, code: "invalid_value",
		message: fmt.Sprintf(format, args...)}
}

// unsupported returns the 400 for a field Loops does not implement.
func unsupported(param, hint string) error {
	msg := fmt.Sprintf("%s is not supported by Loops' OpenAI-compatible API", param)
	if hint != "" {
		msg += "; " + hint
	}
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: param, code: "unsupported_parameter", message: msg}
}

// errorBody is OpenAI's error object.
type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// typeOf names OpenAI's error type for an HTTP status.
func typeOf(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return typeAuthentication
	case status == http.StatusForbidden:
		return typePermission
	case status == http.StatusTooManyRequests:
		return typeRateLimit
	case status >= 500:
		return typeServer
	}
	return typeInvalidRequest
}

// classify maps err to its status and OpenAI error object through the one error table
// (internal/errs): the status is the table's TinkerStatus (a permanent error is never a 409
// or 5xx, which OpenAI clients retry), internal errors are masked to "internal error, id
// <id>" and id is set to log them under.
func classify(err error) (status int, body errorBody, id string) {
	var ie *infer.Error
	if errors.As(err, &ie) {
		err = &apiError{status: ie.Status, typ: typeOf(ie.Status), param: ie.Param, code: ie.Code, message: ie.Message}
	}
	var ae *apiError
	if errors.As(err, &ae) {
		b := errorBody{Message: ae.message, Type: ae.typ}
		if ae.param != "" {
			b.Param = &ae.param
		}
		if ae.code != "" {
			b.Code = &ae.code
		}
		return ae.status, b, ""
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		code := strings.ToLower(errs.ReasonBodyTooLarge)
		return http.StatusRequestEntityTooLarge, errorBody{Type: typeInvalidRequest, Code: &code,
			Message: fmt.Sprintf("request body is larger than the server's limit of %d bytes", mbe.Limit)}, ""
	}
	out, msg := httpedge.Public(err)
	code := strings.ToLower(errs.Reason(out.Err))
	st := out.Entry.TinkerStatus
	return st, errorBody{Message: msg, Type: typeOf(st), Code: &code}, out.ID
}

// errorEnvelope is the JSON body of an OpenAI error answer.
type errorEnvelope struct {
	Error errorBody `json:"error"`
}

// answerOf is classify as the HTTP edge (internal/httpedge) takes it.
func answerOf(err error) httpedge.Answer {
	status, body, id := classify(err)
	return httpedge.Answer{Status: status, Body: errorEnvelope{body}, ID: id, Message: body.Message}
}

// WriteError answers err in OpenAI's error shape without logging: the gateway's key check
// uses it for the refusals (401, 403, 429) of requests under Prefix, so OpenAI clients read
// them as they read this adapter's own errors.
func WriteError(w http.ResponseWriter, _ *http.Request, err error) {
	errorSurface(nil).Reply(w, err)
}

// readBody reads the whole body within MaxBodyBytes (infer.ReadBody).
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return infer.ReadBody(w, r, s.opt.MaxBodyBytes)
}
