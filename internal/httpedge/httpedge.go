package httpedge

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/internal/auditnote"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/telemetry"
)

// Answer is how a surface answers one error.
type Answer struct {
	// Status is the HTTP status.
	Status int
	// Body is the protocol's error body, encoded as JSON.
	Body any
	// ID is set when the error's message was masked: the full error is logged under it.
	ID string
	// Reason, when set, is logged with the error (the machine-readable reason).
	Reason string
	// Message is what the client is told, logged with a refusal (a 4xx, a 503).
	Message string
}

// Public is what a client may see of err, through the one error table (errs.Edge): the
// status, reason and masking of a classify function's fallback case. An error without a
// connect code (a surface's own failure: an encoder's, say) is internal. msg is the message
// to send, never empty (the code's name when the error has none).
func Public(err error) (out errs.Outcome, msg string) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		err = connect.NewError(connect.CodeInternal, err)
	}
	out = errs.Edge(err)
	msg = out.Err.Message()
	if msg == "" {
		msg = out.Err.Code().String()
	}
	return out, msg
}

// HandlerFunc is a route that returns its error instead of writing it.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Surface answers the errors and panics of one protocol's routes. Classify is required;
// the other fields have defaults.
type Surface struct {
	// Name prefixes the surface's log messages ("openai: request failed").
	Name string
	// Logger receives the surface's logs. Default slog.Default().
	Logger *slog.Logger
	// Classify turns any error into the protocol's answer. It must not return a status
	// below 400.
	Classify func(error) Answer
	// EncodeFailure is the body answered, with a 500, when a response cannot be encoded
	// as JSON: the protocol's error shape. Default `{"error":"internal error: cannot
	// encode the response"}`.
	EncodeFailure []byte
	// OnHandle, when set, hears every pattern Handle registers (so that a surface can list
	// its routes, for the audit log's classification).
	OnHandle func(pattern string)
}

var defaultEncodeFailure = []byte(`{"error":"internal error: cannot encode the response"}`)

func (s *Surface) log() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}

// Handle registers h on mux under pattern: an error h returns is answered by WriteError.
func (s *Surface) Handle(mux *http.ServeMux, pattern string, h HandlerFunc) {
	if s.OnHandle != nil {
		s.OnHandle(pattern)
	}
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		auditnote.SetRoute(r.Context(), pattern)
		telemetry.NameRoute(r.Context(), pattern)
		auditnote.SetTarget(r.Context(), auditnote.PathTarget(pattern, r.PathValue))
		if err := h(w, r); err != nil {
			s.WriteError(w, r, err)
		}
	})
}

// WriteError answers err in the protocol's shape. An error whose message was masked is
// logged in full under its id, another 5xx (but 503) at Error, a refusal at Debug. When
// the client has gone away nothing is written and the outcome is logged as 499, except for
// a 408: a body that ran past the server's read deadline cancels the request's context
// (net/http cancels it on any read error of the connection), but that client is still
// there and gets its answer.
func (s *Surface) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	a := s.Classify(err)
	if s.clientGone(r, a) {
		s.logClientGone(r, err)
		return
	}
	attrs := []any{"method", r.Method, "path", r.URL.Path, "status", a.Status}
	if a.ID != "" {
		attrs = append(attrs, "error_id", a.ID)
	}
	if a.Reason != "" {
		attrs = append(attrs, "reason", a.Reason)
	}
	ctx := r.Context()
	if a.ID != "" {
		telemetry.NoteError(ctx, a.ID)
	}
	switch {
	case a.ID != "" || (a.Status >= 500 && a.Status != http.StatusServiceUnavailable):
		s.log().ErrorContext(ctx, s.Name+": request failed", append(attrs, "err", err)...)
	default:
		s.log().DebugContext(ctx, s.Name+": request rejected", append(attrs, "message", a.Message)...)
	}
	s.write(w, err, a)
}

// Reply answers err in the protocol's shape without logging and whether or not the client
// is still there: for refusals made before a request reaches the surface (the gateway's key
// check answers 401, 403 and 429 in the shape of the path's protocol).
func (s *Surface) Reply(w http.ResponseWriter, err error) {
	s.write(w, err, s.Classify(err))
}

// Recover returns next behind a panic handler. A panic (other than http.ErrAbortHandler,
// which passes through) is logged with its stack under a new error id and answered as the
// internal error errs.Incident through Classify, as any error is. If the response had
// begun (a status or bytes sent), nothing can be answered any more: the response is cut
// short (http.ErrAbortHandler), so that the client sees a failed response rather than a
// corrupted one.
func (s *Surface) Recover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(http.ErrAbortHandler)
			}
			id := errs.NewID()
			telemetry.NoteError(r.Context(), id)
			s.log().ErrorContext(r.Context(), s.Name+": panic serving request", "method", r.Method, "path", r.URL.Path,
				"error_id", id, "response_started", tw.started, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if tw.started {
				panic(http.ErrAbortHandler)
			}
			err := errs.Incident(id, "internal error, id "+id)
			a := s.Classify(err)
			if s.clientGone(r, a) {
				s.logClientGone(r, err)
				return
			}
			s.write(w, err, a)
		}()
		next.ServeHTTP(tw, r)
	})
}

// WriteJSON writes v as JSON with status, a Content-Length and X-Content-Type-Options:
// nosniff (a browser never reads an answer as anything but JSON); a v that cannot be
// encoded is answered 500 with EncodeFailure.
func (s *Surface) WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.log().Error(s.Name+": cannot encode the response", "err", err)
		status = http.StatusInternalServerError
		b = s.EncodeFailure
		if b == nil {
			b = defaultEncodeFailure
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Surface) clientGone(r *http.Request, a Answer) bool {
	return a.Status != http.StatusRequestTimeout && errs.ClientGone(r.Context())
}

func (s *Surface) logClientGone(r *http.Request, err error) {
	s.log().InfoContext(r.Context(), s.Name+": client closed request", "method", r.Method, "path", r.URL.Path,
		"status", errs.StatusClientClosedRequest, "err", err)
}

// write sends a, with Retry-After when err carries one and a is a 429 (clients wait that
// long before retrying), and X-Should-Retry: false when err is errs.Final.
func (s *Surface) write(w http.ResponseWriter, err error, a Answer) {
	if d, ok := errs.RetryAfter(err); ok && a.Status == http.StatusTooManyRequests {
		w.Header().Set(errs.HeaderRetryAfter, errs.RetryAfterValue(d))
	}
	if errs.IsFinal(err) {
		w.Header().Set(errs.HeaderShouldRetry, "false")
	}
	s.WriteJSON(w, a.Status, a.Body)
}

// trackingWriter records whether the response has begun. Flush and ReadFrom are passed on
// (connect-go needs an http.Flusher; io.Copy from a file keeps sendfile), and Unwrap keeps
// http.ResponseController (deadlines, hijacking) working through it.
type trackingWriter struct {
	http.ResponseWriter
	started bool
}

func (t *trackingWriter) WriteHeader(code int) {
	if code >= 200 { // 1xx are informational: the final status is still to come
		t.started = true
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.started = true
	return t.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (t *trackingWriter) Flush() { _ = t.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (t *trackingWriter) FlushError() error {
	t.started = true
	return http.NewResponseController(t.ResponseWriter).Flush()
}

// ReadFrom implements io.ReaderFrom.
func (t *trackingWriter) ReadFrom(src io.Reader) (int64, error) {
	t.started = true
	if rf, ok := t.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(writerOnly{t.ResponseWriter}, src)
}

// Unwrap returns the wrapped writer (for http.ResponseController).
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// writerOnly hides every method but Write, so io.Copy does not call ReadFrom again.
type writerOnly struct{ io.Writer }
