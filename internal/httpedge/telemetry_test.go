package httpedge

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/loops-dev/loops/internal/telemetry"
)

// TestFailureIDInLogAndSpan: a 5xx's error id is in its log line, with the request's
// trace_id and span_id, and on its span, which is marked failed; a panic's too.
func TestFailureIDInLogAndSpan(t *testing.T) {
	log, lines := newTestLog(t)
	log = slog.New(telemetry.LogHandler(log.Handler()))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	s := testSurface(log)
	mux := http.NewServeMux()
	s.Handle(mux, "GET /fail", func(http.ResponseWriter, *http.Request) error {
		return errors.New("disk /srv/loops/x is full") // an internal error: masked, logged under an id
	})
	mux.HandleFunc("GET /panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	h := s.Recover(mux)
	for _, path := range []string{"/fail", "/panic"} {
		ctx, span := tp.Tracer("test").Start(t.Context(), "HTTP GET")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil))
		span.End()
		require.Equal(t, http.StatusInternalServerError, w.Code, path)

		got := lines()
		line := got[len(got)-1]
		id, _ := line["error_id"].(string)
		require.NotEmpty(t, id, "%s: %v", path, line)
		require.Equal(t, span.SpanContext().TraceID().String(), line["trace_id"])
		require.Equal(t, span.SpanContext().SpanID().String(), line["span_id"])
		require.Contains(t, w.Body.String(), id, "the client's answer names the id")

		ended := rec.Ended()
		ro := ended[len(ended)-1]
		require.Equal(t, codes.Error, ro.Status().Code)
		var spanID string
		for _, kv := range ro.Attributes() {
			if kv.Key == telemetry.ErrorIDKey {
				spanID = kv.Value.AsString()
			}
			require.NotContains(t, kv.Value.Emit(), "/srv/loops", "the error's text stays out of the span")
		}
		require.Equal(t, id, spanID, path)
	}
}
