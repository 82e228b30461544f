package anthropic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/loops-dev/loops/compat"
	"github.com/loops-dev/loops/compat/inference"
	"github.com/loops-dev/loops/compat/internal/infer"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/httpedge"
)

// Prefix is the path under which the gateway mounts the handler: an Anthropic client's base
// URL is <server>/anthropic/api.
const Prefix = "/anthropic/api/"

// Services are the core handlers the adapter translates onto. All must be non-nil.
type Services struct {
	Sampling   loopsv1connect.SamplingServiceHandler
	Operations loopsv1connect.OperationServiceHandler
	Models     loopsv1connect.ModelServiceHandler
}

// Options tune the Anthropic surface. The zero value gives the defaults noted per field.
type Options struct {
	// MaxBodyBytes caps a request body. Default compat.DefaultMaxBodyBytes (the gateway
	// passes its Limits.MaxBodyBytes, the cap of every surface).
	MaxBodyBytes int64
	// MaxSamplers bounds the samplers the adapter remembers, one per (workspace, model)
	// (infer.Options.MaxSamplers). The gateway passes the core's Limits.MaxSamplersInMemory.
	MaxSamplers int
	// Logger receives debug logs and errors. Default slog.Default().
	Logger *slog.Logger
	// Workspace returns the authenticated caller's workspace (the gateway's
	// auth.Workspace): the sampler cache is keyed by it.
	Workspace func(ctx context.Context) string
	// Engine is the sampling engine shared with the other inference APIs
	// (compat/inference); MaxSamplers and Workspace are then the engine's. Default: an
	// engine of this handler's own.
	Engine *inference.Engine
}

type server struct {
	opt    Options
	log    *slog.Logger
	engine *infer.Engine
	// edge answers the routes' errors and panics in Anthropic's shape.
	edge *httpedge.Surface
}

// NewHandler returns the handler for every path under Prefix. The gateway mounts it after
// authenticating the request and passes r.Context(), with the caller's workspace, to the
// core as it is.
func NewHandler(s Services, o Options) http.Handler {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = compat.DefaultMaxBodyBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	eng := o.Engine
	if eng == nil {
		eng = inference.New(inference.Services{Sampling: s.Sampling, Operations: s.Operations, Models: s.Models},
			inference.Options{MaxSamplers: o.MaxSamplers, Workspace: o.Workspace})
	}
	srv := &server{opt: o, log: o.Logger, engine: eng, edge: errorSurface(o.Logger)}
	mux := http.NewServeMux()
	srv.edge.Handle(mux, "POST "+Prefix+"v1/messages", srv.messages)
	srv.edge.Handle(mux, "POST "+Prefix+"v1/messages/count_tokens", srv.countTokens)
	srv.edge.Handle(mux, Prefix, func(_ http.ResponseWriter, r *http.Request) error {
		return &apiError{status: http.StatusNotFound, typ: typeNotFound,
			message: r.Method + " " + r.URL.Path + " is not an Anthropic-compatible route served by Loops (POST v1/messages, POST v1/messages/count_tokens)"}
	})
	return srv.edge.Recover(infer.WithSessions(mux))
}

// errorSurface returns the HTTP edge (internal/httpedge) that answers errors and panics in
// Anthropic's error shape, logging to log.
func errorSurface(log *slog.Logger) *httpedge.Surface {
	return &httpedge.Surface{Name: "anthropic", Logger: log, Classify: answerOf,
		EncodeFailure: []byte(`{"type":"error","error":{"type":"api_error","message":"internal error: cannot encode the response"}}`)}
}

// Anthropic's error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typePermission     = "permission_error"
	typeNotFound       = "not_found_error"
	typeTooLarge       = "request_too_large"
	typeRateLimit      = "rate_limit_error"
	typeAPI            = "api_error"
	typeOverloaded     = "overloaded_error"
)

// apiError is an error the adapter answers itself, with Anthropic's fields.
type apiError struct {
	status  int
	typ     string
	message string
	details map[string]any // error.details, when set
}

func (e *apiError) Error() string { return e.message }

// unsupported returns the 400 for a field Loops does not implement.
func unsupported(param, hint string) error {
	msg := fmt.Sprintf("%s: this field is not supported by Loops' Anthropic-compatible API", param)
	if hint != "" {
		msg += "; " + hint
	}
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, message: msg}
}

// errorBody is Anthropic's error object.
type errorBody struct {
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// typeOf names Anthropic's error type for an HTTP status.
func typeOf(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return typeAuthentication
	case http.StatusForbidden:
		return typePermission
	case http.StatusNotFound:
		return typeNotFound
	case http.StatusRequestEntityTooLarge:
		return typeTooLarge
	case http.StatusTooManyRequests:
		return typeRateLimit
	case http.StatusServiceUnavailable:
		return typeOverloaded
	}
	if status >= 500 {
		return typeAPI
	}
	return typeInvalidRequest
}

// classify maps err to its status and Anthropic error object through the one error table
// (internal/errs): the status is the table's TinkerStatus (a permanent error is never a 409
// or 5xx, which clients retry), internal errors are masked to "internal error, id <id>" and
// id is set to log them under.
func classify(err error) (status int, body errorBody, id string) {
	var ie *infer.Error
	if errors.As(err, &ie) {
		msg := ie.Message
		if ie.Param != "" && !strings.HasPrefix(msg, ie.Param) {
			msg = ie.Param + ": " + msg
		}
		return ie.Status, errorBody{Type: typeOf(ie.Status), Message: msg}, ""
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, errorBody{Type: ae.typ, Message: ae.message, Details: ae.details}, ""
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, errorBody{Type: typeTooLarge,
			Message: fmt.Sprintf("request body is larger than the server's limit of %d bytes", mbe.Limit)}, ""
	}
	out, msg := httpedge.Public(err)
	st := out.Entry.TinkerStatus
	return st, errorBody{Type: typeOf(st), Message: msg}, out.ID
}

// answerOf is classify as the HTTP edge (internal/httpedge) takes it.
func answerOf(err error) httpedge.Answer {
	status, body, id := classify(err)
	return httpedge.Answer{Status: status, Body: errorEnvelope{Type: "error", Error: body}, ID: id, Message: body.Message}
}

// WriteError answers err in Anthropic's error shape without logging: the gateway's key
// check uses it for the refusals (401, 403, 429) of requests under Prefix, so Anthropic
// clients read them as they read this adapter's own errors.
func WriteError(w http.ResponseWriter, _ *http.Request, err error) {
	errorSurface(nil).Reply(w, err)
}

// errorEnvelope is the JSON body of an Anthropic error answer (and of a stream's error
// event).
type errorEnvelope struct {
	Type  string    `json:"type"`
	Error errorBody `json:"error"`
}

// readBody reads the whole body within MaxBodyBytes (infer.ReadBody).
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return infer.ReadBody(w, r, s.opt.MaxBodyBytes)
}
