package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
	"github.com/loops-dev/loops/internal/telemetry"
)

// restUserAgent marks the gRPC calls grpc-gateway makes to this server's own listener, so
// the edge counts them as REST.
const restUserAgent = "loops-rest-gateway"

// Surfaces, as the requests metric labels them.
const (
	surfaceConnect = "connect"
	surfaceGRPC    = "grpc"
	surfaceGRPCWeb = "grpcweb"
	surfaceREST    = "rest"
	surfaceTinker  = "tinker"
)

// edge is the one error edge of loops.v1 (Connect, gRPC, gRPC-Web, and REST, whose calls
// come back over gRPC) and counts Tinker's answers: every error leaves with a reason
// (ErrorInfo, domain loops.dev), internal errors are masked to "internal error, id <id>"
// and logged in full under that id, and a call whose client went away is logged and
// counted as 499.
type edge struct {
	log      *slog.Logger
	requests *prometheus.CounterVec
}

func newEdge(log *slog.Logger, reg prometheus.Registerer) *edge {
	e := &edge{log: log, requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loops_requests_total",
		Help: "Requests answered by loops.v1 handlers and Tinker routes, by surface and HTTP status (the error table's; 499: the client went away).",
	}, []string{"surface", "status"})}
	if reg != nil {
		reg.MustRegister(e.requests)
	}
	return e
}

// WrapUnary implements connect.Interceptor.
func (e *edge) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, e.finish(ctx, req.Spec().Procedure, surfaceOf(req.Peer().Protocol, req.Header()), err)
	}
}

// WrapStreamingClient implements connect.Interceptor (a no-op: the edge is server side).
func (e *edge) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor.
func (e *edge) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		return e.finish(ctx, conn.Spec().Procedure, surfaceOf(conn.Peer().Protocol, conn.RequestHeader()), err)
	}
}

// finish logs, counts and rewrites a handler's outcome.
func (e *edge) finish(ctx context.Context, procedure, surface string, err error) error {
	if err == nil {
		e.requests.WithLabelValues(surface, "200").Inc()
		return nil
	}
	if errs.ClientGone(ctx) {
		e.clientGone(ctx, surface, procedure, err)
		return err // the answer goes nowhere
	}
	out := errs.Edge(err)
	e.logError(ctx, out, surface, procedure, err)
	e.requests.WithLabelValues(surface, strconv.Itoa(out.Entry.HTTPStatus)).Inc()
	return errs.WithRetryAfterHeader(out.Err) // a 429 carries Retry-After
}

func (e *edge) clientGone(ctx context.Context, surface, what string, err error) {
	e.log.InfoContext(ctx, "client closed request", slog.String("surface", surface), slog.String("call", what),
		slog.Int("status", errs.StatusClientClosedRequest), slog.Any("err", err))
	e.requests.WithLabelValues(surface, strconv.Itoa(errs.StatusClientClosedRequest)).Inc()
}

// logError logs a failed call under ctx (its trace_id and span_id); an internal error's id
// goes on its span too.
func (e *edge) logError(ctx context.Context, out errs.Outcome, surface, what string, err error) {
	switch {
	case out.ID != "":
		telemetry.NoteError(ctx, out.ID)
		e.log.ErrorContext(ctx, "request failed", slog.String("surface", surface), slog.String("call", what),
			slog.String("error_id", out.ID), slog.String("code", out.Entry.Code.String()), slog.Any("err", err))
	case out.Entry.Category == errs.Server:
		e.log.WarnContext(ctx, "request failed", slog.String("surface", surface), slog.String("call", what),
			slog.String("code", out.Entry.Code.String()), slog.String("reason", errs.Reason(out.Err)), slog.Any("err", err))
	default:
		e.log.DebugContext(ctx, "request rejected", slog.String("surface", surface), slog.String("call", what),
			slog.String("code", out.Entry.Code.String()), slog.String("reason", errs.Reason(out.Err)), slog.Any("err", err))
	}
}

func surfaceOf(protocol string, h http.Header) string {
	switch protocol {
	case connect.ProtocolGRPC:
		if strings.HasPrefix(h.Get("User-Agent"), restUserAgent) {
			return surfaceREST
		}
		return surfaceGRPC
	case connect.ProtocolGRPCWeb:
		return surfaceGRPCWeb
	}
	return surfaceConnect
}

// restErrorHandler answers grpc-gateway's errors. Errors from loops.v1 handlers passed the
// edge already (they carry a loops.dev ErrorInfo); grpc-gateway's own (a malformed body, a
// failed dial) pass it here. A client that went away gets nothing.
func (e *edge) restErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if errs.ClientGone(r.Context()) {
		// Counted by the interceptor when the call reached a handler.
		e.log.InfoContext(ctx, "client closed request", slog.String("surface", surfaceREST), slog.String("call", r.URL.Path),
			slog.Int("status", errs.StatusClientClosedRequest), slog.Any("err", err))
		return
	}
	ce := connectFromStatus(err)
	if errs.Info(ce) == nil {
		out := errs.Edge(ce)
		e.logError(ctx, out, surfaceREST, r.URL.Path, err)
		e.requests.WithLabelValues(surfaceREST, strconv.Itoa(out.Entry.HTTPStatus)).Inc()
		err = statusFromConnect(out.Err)
	}
	if d, ok := errs.RetryAfter(ce); ok {
		w.Header().Set(errs.HeaderRetryAfter, errs.RetryAfterValue(d))
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// connectFromStatus converts a gRPC status error (or any error) to a connect error, details
// included.
func connectFromStatus(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	st, ok := status.FromError(err)
	if !ok {
		return connect.NewError(connect.CodeUnknown, err)
	}
	ce = connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
	for _, a := range st.Proto().GetDetails() {
		if d, derr := connect.NewErrorDetail(a); derr == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// statusFromConnect converts a connect error to a gRPC status error, details included.
func statusFromConnect(ce *connect.Error) error {
	p := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		p.Details = append(p.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return status.FromProto(p).Err()
}

// countTinker counts the answers of Tinker's routes by status; a request that wrote nothing
// because its client went away is a 499.
func (e *edge) countTinker(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &httpedge.StatusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		st := sw.Status
		switch {
		case st == 0 && errs.ClientGone(r.Context()):
			st = errs.StatusClientClosedRequest
		case st == 0:
			st = http.StatusOK
		}
		e.requests.WithLabelValues(surfaceTinker, strconv.Itoa(st)).Inc()
	})
}
