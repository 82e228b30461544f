package telemetry_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/loops-dev/loops/internal/telemetry"
)

var (
	fuzzOnce sync.Once
	fuzzRec  *tracetest.SpanRecorder
)

// FuzzHandler: whatever traceparent, baggage and path a client sends, the middleware
// answers, and a path under a secret prefix never reaches a span with its token.
func FuzzHandler(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "team=a", "/v1/session_traces/tok.json")
	f.Add("ff-zz", "%%%;;,=", "/api/v1/forward_backward")
	f.Add("00-00000000000000000000000000000000-0000000000000000-00", strings.Repeat("k=v,", 200), "/v1/session_traces/")
	f.Fuzz(func(t *testing.T, traceparent, baggage, path string) {
		fuzzOnce.Do(func() {
			fuzzRec = tracetest.NewSpanRecorder()
			telemetry.Install(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(fuzzRec)), nil)
		})
		const prefix = "/v1/session_traces/"
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path = path
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("baggage", baggage)
		h := telemetry.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }),
			telemetry.HTTPOptions{SecretPrefixes: []string{prefix}})
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusNoContent, w.Code)
		token, secret := strings.CutPrefix(path, prefix)
		if !secret || token == "" {
			return
		}
		ended := fuzzRec.Ended()
		for _, kv := range ended[len(ended)-1].Attributes() {
			if kv.Key == "url.path" {
				require.Equal(t, prefix+"{token}", kv.Value.AsString())
			}
		}
	})
}
