package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// maxBody bounds one export request.
const maxBody = 64 << 20

// Span is one received span with its resource's service.name.
type Span struct {
	Service string
	*tracepb.Span
}

// TraceID is the span's trace id in hex.
func (s Span) TraceID() string { return hex.EncodeToString(s.GetTraceId()) }

// ID is the span's id in hex.
func (s Span) ID() string { return hex.EncodeToString(s.GetSpanId()) }

// Parent is the span's parent's id in hex ("" for a root).
func (s Span) Parent() string { return hex.EncodeToString(s.GetParentSpanId()) }

// Attr is the span's attribute key as a string ("" when absent; ints in decimal).
func (s Span) Attr(key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return valueString(kv.GetValue())
		}
	}
	return ""
}

func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	b, _ := proto.Marshal(v)
	return string(b)
}

// Receiver receives OTLP traces over HTTP and gRPC.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// HTTPEndpoint is the base URL for OTEL_EXPORTER_OTLP_ENDPOINT with http/protobuf;
	// GRPCEndpoint the one with grpc (both http://127.0.0.1:port).
	HTTPEndpoint, GRPCEndpoint string

	mu       sync.Mutex
	requests []*collectortrace.ExportTraceServiceRequest
	headers  http.Header
}

// Start starts a receiver that stops with the test.
func Start(t testing.TB) *Receiver {
	r := &Receiver{}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(gl) }()
	r.HTTPEndpoint = "http://" + hl.Addr().String()
	r.GRPCEndpoint = "http://" + gl.Addr().String()
	t.Cleanup(func() {
		_ = hs.Close()
		gs.Stop()
	})
	return r
}

// Export implements the collector's gRPC trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, req.Body, maxBody)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = io.LimitReader(zr, maxBody)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msg := &collectortrace.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(b, msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.headers = req.Header.Clone()
	r.mu.Unlock()
	r.add(msg)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	r.requests = append(r.requests, req)
	r.mu.Unlock()
}

// Header is the headers of the last export received over HTTP.
func (r *Receiver) Header() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.headers.Clone()
}

// Requests are the export requests received so far, as decoded.
func (r *Receiver) Requests() []*collectortrace.ExportTraceServiceRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*collectortrace.ExportTraceServiceRequest(nil), r.requests...)
}

// Spans are every span received so far.
func (r *Receiver) Spans() []Span {
	var out []Span
	for _, req := range r.Requests() {
		for _, rs := range req.GetResourceSpans() {
			svc := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					svc = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, Span{Service: svc, Span: s})
				}
			}
		}
	}
	return out
}

// Trace is every span received so far of trace id (hex).
func (r *Receiver) Trace(id string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// Wait waits up to timeout until ok holds of the spans received, and returns them.
func (r *Receiver) Wait(t testing.TB, timeout time.Duration, ok func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := r.Spans()
		if ok(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			require.FailNowf(t, "spans", "the spans wanted did not arrive in %v; %d arrived", timeout, len(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Hex is an id (trace or span) in hex.
func Hex(id []byte) string { return hex.EncodeToString(id) }
