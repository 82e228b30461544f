package audit

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/internal/auditnote"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
)

// ReasonAuditFull is the reason of the 429 a mutating call gets while the audit buffer is
// full.
const ReasonAuditFull = "AUDIT_LOG_FULL"

// relayHeader carries, on the gRPC call grpc-gateway makes for a REST request, the
// server's relay token and the REST client's address: with the right token the call is
// recorded as REST, from that address (the REST request itself is then not recorded).
const relayHeader = "X-Loops-Audit-Relay"

// Surfaces, as events name them.
const (
	SurfaceTinker      = "tinker"
	SurfaceConnect     = "connect"
	SurfaceGRPC        = "grpc"
	SurfaceGRPCWeb     = "grpcweb"
	SurfaceREST        = "rest"
	SurfaceOpenAI      = "openai"
	SurfaceAnthropic   = "anthropic"
	SurfaceConsole     = "console"
	SurfaceCheckpoints = "checkpoints"
)

// Middleware records the calls Rules classify as recorded. It runs after authentication:
// every request it sees carries its workspace and caller (auth.CallerOf).
type Middleware struct {
	rec    *Recorder
	cls    *Classifier
	refuse func(w http.ResponseWriter, r *http.Request, code connect.Code, reason string, err error)
	token  string
	now    func() time.Time
}

// NewMiddleware returns the middleware that records into rec, classifying with Rules;
// refuse answers the calls it turns away (auth.Policy.Refuse).
func NewMiddleware(rec *Recorder, refuse func(http.ResponseWriter, *http.Request, connect.Code, string, error)) *Middleware {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &Middleware{rec: rec, cls: NewClassifier(Rules), refuse: refuse, token: hex.EncodeToString(b[:]), now: rec.opt.Now}
}

// Wrap returns next with recording: a recorded call takes a buffer slot before it runs
// (or is refused 429 while the buffer stays full), and its event is recorded when it has
// been answered.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws := auth.Workspace(r.Context())
		if ws == "" { // an operator's call without a workspace: no workspace log to write
			next.ServeHTTP(w, r)
			return
		}
		rule := m.cls.Classify(r)
		surface := surfaceOf(r.URL.Path, r.Header.Get("Content-Type"))
		caller := auth.CallerOf(r.Context())
		if surface == SurfaceGRPC {
			if addr, ok := m.relayed(r); ok {
				surface, caller.Addr = SurfaceREST, addr
			}
		}
		if !rule.Class.Recorded() {
			next.ServeHTTP(w, r)
			return
		}
		slot, err := m.rec.Admit(r.Context())
		if err != nil {
			code := connect.CodeResourceExhausted
			if errors.Is(err, ErrClosed) {
				code = connect.CodeUnavailable
			}
			m.refuse(w, r, code, ReasonAuditFull, err)
			return
		}
		start := m.now()
		ctx, note := auditnote.With(r.Context())
		sw := &httpedge.StatusWriter{ResponseWriter: w}
		defer func() {
			// A panic is answered 500 further out; its call is recorded as internal.
			if p := recover(); p != nil {
				if sw.Status == 0 {
					sw.Status = http.StatusInternalServerError
				}
				m.record(slot, ws, rule, surface, caller, start, note.Read(), sw, w, r)
				panic(p)
			}
		}()
		next.ServeHTTP(sw, r.WithContext(ctx))
		m.record(slot, ws, rule, surface, caller, start, note.Read(), sw, w, r)
	})
}

func (m *Middleware) record(slot *Slot, ws string, rule Rule, surface string, caller auth.Caller, start time.Time,
	n auditnote.Snapshot, sw *httpedge.StatusWriter, w http.ResponseWriter, r *http.Request) {
	if n.Relayed { // the gRPC call it became was recorded
		slot.Release()
		return
	}
	status, code := outcome(n.Code, sw.Status, w.Header(), r)
	action := rule.Pattern
	if n.Route != "" && rule.Class == Mutate && rule.Event == unclassified {
		action = n.Route
	}
	slot.Record(ws, storeEvent(start, caller, surface, action, rule, n.Target, status, code))
}

// relayed returns the REST client's address of a gRPC call that grpc-gateway made for it
// (the header with this server's token).
func (m *Middleware) relayed(r *http.Request) (string, bool) {
	for _, v := range r.Header.Values(relayHeader) {
		tok, addr, _ := strings.Cut(v, " ")
		if subtle.ConstantTimeCompare([]byte(tok), []byte(m.token)) == 1 {
			return addr, true
		}
	}
	return "", false
}

// RelayInterceptor is the client interceptor of grpc-gateway's connection to this server:
// it marks the REST request relayed and tells the gRPC call the REST client's address.
func (m *Middleware) RelayInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(m.relayContext(ctx), method, req, reply, cc, opts...)
	}
}

// RelayStreamInterceptor is RelayInterceptor for streaming calls.
func (m *Middleware) RelayStreamInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(m.relayContext(ctx), desc, cc, method, opts...)
	}
}

func (m *Middleware) relayContext(ctx context.Context) context.Context {
	auditnote.MarkRelayed(ctx)
	return metadata.AppendToOutgoingContext(ctx, strings.ToLower(relayHeader), m.token+" "+auth.CallerOf(ctx).Addr)
}

// outcome is the HTTP status and canonical code of an answered call: the code a loops.v1
// handler returned (the interceptor's note), else a gRPC status the response carries, else
// the HTTP status written.
func outcome(noted string, status int, h http.Header, r *http.Request) (int, string) {
	if status == 0 {
		status = http.StatusOK
		if errs.ClientGone(r.Context()) {
			status = errs.StatusClientClosedRequest
		}
	}
	if noted == "" && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		gs := h.Get("Grpc-Status")
		if gs == "" {
			gs = h.Get(http.TrailerPrefix + "Grpc-Status")
		}
		if n, err := strconv.Atoi(gs); err == nil && n > 0 && n <= 16 {
			noted = connect.Code(n).String()
		} else if gs == "0" {
			noted = "ok"
		}
	}
	if noted != "" {
		if noted == "ok" {
			return http.StatusOK, noted
		}
		var c connect.Code
		if err := c.UnmarshalText([]byte(noted)); err == nil {
			return errs.Lookup(c).HTTPStatus, noted
		}
		return status, noted
	}
	return status, codeOfStatus(status)
}

// codeOfStatus names an HTTP status as the canonical code the error table maps to it.
func codeOfStatus(status int) string {
	switch {
	case status < 400:
		return "ok"
	case status == errs.StatusClientClosedRequest:
		return connect.CodeCanceled.String()
	}
	for _, c := range errs.Codes() {
		if errs.Lookup(c).HTTPStatus == status {
			return c.String()
		}
	}
	if status >= 500 {
		return connect.CodeInternal.String()
	}
	return connect.CodeInvalidArgument.String()
}

// surfaceOf names the surface of a path.
func surfaceOf(path, contentType string) string {
	switch {
	case strings.HasPrefix(path, "/loops.v1."):
		switch {
		case strings.HasPrefix(contentType, "application/grpc-web"):
			return SurfaceGRPCWeb
		case strings.HasPrefix(contentType, "application/grpc"):
			return SurfaceGRPC
		}
		return SurfaceConnect
	case strings.HasPrefix(path, "/api/v1/"):
		return SurfaceTinker
	case strings.HasPrefix(path, "/oai/"):
		return SurfaceOpenAI
	case strings.HasPrefix(path, "/anthropic/"):
		return SurfaceAnthropic
	case strings.HasPrefix(path, "/v1/checkpoint_"):
		return SurfaceCheckpoints
	case strings.HasPrefix(path, "/v1/"):
		return SurfaceREST
	}
	return SurfaceConsole
}

// NoteInterceptor is the connect interceptor of loops.v1's handlers that notes, for the
// audit record, the id a call acted on (its request's, else its response's) and its code.
type NoteInterceptor struct{}

// WrapUnary implements connect.Interceptor.
func (NoteInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		if auditnote.From(ctx) != nil {
			t := TargetOf(req.Any())
			if t == "" && res != nil {
				t = TargetOf(res.Any())
			}
			auditnote.SetTarget(ctx, t)
			auditnote.SetCode(ctx, codeOf(err))
		}
		return res, err
	}
}

// WrapStreamingClient implements connect.Interceptor (a no-op on the server).
func (NoteInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor: it notes the code.
func (NoteInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		auditnote.SetCode(ctx, codeOf(err))
		return err
	}
}

func codeOf(err error) string {
	if err == nil {
		return "ok"
	}
	return connect.CodeOf(err).String()
}

// TargetOf is the id a message names: its first set string field (in field order) called
// id, tinker_path, path or name, or ending in _id.
func TargetOf(v any) string {
	m, ok := v.(proto.Message)
	if !ok || m == nil {
		return ""
	}
	r := m.ProtoReflect()
	if !r.IsValid() {
		return ""
	}
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.Kind() != protoreflect.StringKind || f.IsList() || f.IsMap() {
			continue
		}
		name := string(f.Name())
		if name != "id" && name != "tinker_path" && name != "path" && name != "name" && !strings.HasSuffix(name, "_id") {
			continue
		}
		if s := r.Get(f).String(); s != "" {
			return s
		}
	}
	return ""
}
