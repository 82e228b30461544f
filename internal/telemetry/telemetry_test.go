package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/loops-dev/loops/internal/otlptest"
	"github.com/loops-dev/loops/internal/telemetry"
)

// clearEnv unsets every OTEL_* variable the tests use, for the test.
func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} {
		t.Setenv(k, "")
	}
}

// TestOffWhenUnset: without an exporter configured nothing is installed and the HTTP
// middleware is the handler itself; OTEL_TRACES_EXPORTER=none and OTEL_SDK_DISABLED win
// over an endpoint.
func TestOffWhenUnset(t *testing.T) {
	clearEnv(t)
	require.False(t, telemetry.Configured())
	shutdown, err := telemetry.Setup(t.Context(), "")
	require.NoError(t, err)
	require.False(t, telemetry.Enabled())
	require.NoError(t, shutdown(t.Context()))
	h := http.NewServeMux()
	require.Same(t, h, telemetry.Handler(h, telemetry.HTTPOptions{}))
	require.Nil(t, telemetry.ConnectInterceptor())
	_, span := telemetry.Tracer().Start(t.Context(), "x")
	require.False(t, span.IsRecording())

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	require.True(t, telemetry.Configured())
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	require.False(t, telemetry.Configured())
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	require.False(t, telemetry.Configured())
}

// TestSetupOverGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports to the receiver's gRPC
// trace service, with the service name and resource attributes of the environment.
func TestSetupOverGRPC(t *testing.T) {
	clearEnv(t)
	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.GRPCEndpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_SERVICE_NAME", "loops-eu-1")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
	shutdown, err := telemetry.Setup(t.Context(), "")
	require.NoError(t, err)
	require.True(t, telemetry.Enabled())
	_, span := telemetry.Tracer().Start(t.Context(), "over grpc")
	span.End()
	require.NoError(t, shutdown(t.Context()))
	require.False(t, telemetry.Enabled())
	spans := recv.Spans()
	require.Len(t, spans, 1)
	require.Equal(t, "over grpc", spans[0].GetName())
	require.Equal(t, "loops-eu-1", spans[0].Service)
	attrs := map[string]string{}
	for _, kv := range recv.Requests()[0].GetResourceSpans()[0].GetResource().GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	require.Equal(t, "test", attrs["deployment.environment.name"])
}

// TestHTTPSamplerHeadersAndSecretPaths: over http/protobuf with OTEL_EXPORTER_OTLP_HEADERS,
// the middleware continues the client's traceparent, and a path whose rest is a token is
// recorded without it; with OTEL_TRACES_SAMPLER=always_off nothing is exported.
func TestHTTPSamplerHeadersAndSecretPaths(t *testing.T) {
	clearEnv(t)
	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.HTTPEndpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-tenant=loops")
	shutdown, err := telemetry.Setup(t.Context(), "")
	require.NoError(t, err)
	var seen trace.SpanContext
	h := telemetry.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		seen = trace.SpanContextFromContext(r.Context())
	}), telemetry.HTTPOptions{SecretPrefixes: []string{"/v1/session_traces/"}, Untraced: []string{"/metrics"}})
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil)) // no span
	req := httptest.NewRequest(http.MethodGet, "/v1/session_traces/s3cr3t-token.json", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", seen.TraceID().String())
	require.NoError(t, shutdown(t.Context()))
	spans := recv.Spans()
	require.Len(t, spans, 1)
	require.Equal(t, "HTTP GET", spans[0].GetName())
	require.Equal(t, "00f067aa0ba902b7", spans[0].Parent())
	require.Equal(t, "/v1/session_traces/{token}", spans[0].Attr("url.path"))
	require.Equal(t, "loops", recv.Header().Get("x-collector-tenant"))
	require.Equal(t, telemetry.DefaultServiceName, spans[0].Service)

	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	shutdown, err = telemetry.Setup(t.Context(), "")
	require.NoError(t, err)
	_, span := telemetry.Tracer().Start(t.Context(), "dropped")
	span.End()
	require.NoError(t, shutdown(t.Context()))
	require.Len(t, recv.Spans(), 1, "always_off samples nothing")
}

// TestLogsAndExemplars: a record logged under a span's context carries its trace_id and
// span_id, one without carries none; an observation under a sampled span has its trace id
// as exemplar, and NoteError puts the error id on the span.
func TestLogsAndExemplars(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	log.ErrorContext(ctx, "request failed", "error_id", "abc")
	log.Info("no request")
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		require.NoError(t, json.Unmarshal(l, &m))
		lines = append(lines, m)
	}
	require.Equal(t, tid.String(), lines[0]["trace_id"])
	require.Equal(t, sid.String(), lines[0]["span_id"])
	require.Equal(t, "abc", lines[0]["error_id"])
	require.NotContains(t, lines[1], "trace_id")

	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: []float64{1}})
	telemetry.Observe(ctx, h, 0.5)
	telemetry.Observe(context.Background(), h, 0.5)
	var m dto.Metric
	require.NoError(t, h.Write(&m))
	ex := m.GetHistogram().GetBucket()[0].GetExemplar()
	require.NotNil(t, ex)
	require.Equal(t, "trace_id", ex.GetLabel()[0].GetName())
	require.Equal(t, tid.String(), ex.GetLabel()[0].GetValue())
	require.Equal(t, uint64(2), m.GetHistogram().GetSampleCount())
}
