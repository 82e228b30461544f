package telemetry

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Handler continues the client's trace (W3C traceparent and baggage, or what
// OTEL_PROPAGATORS names) on every request to next, under a server span named by method
// (the route is not known before the mux). Each of secretPrefixes begins paths whose rest
// is a credential (a trace link's or an archive's token): their url.path attribute is the
// prefix and "{token}". With tracing off (Enabled is false) next is returned as is.
func Handler(next http.Handler, secretPrefixes ...string) http.Handler {
	if !Enabled() {
		return next
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range secretPrefixes {
			if rest, ok := strings.CutPrefix(r.URL.Path, p); ok && rest != "" {
				// A later value of a key replaces the earlier one on the span.
				trace.SpanFromContext(r.Context()).SetAttributes(semconv.URLPath(p + "{token}"))
				break
			}
		}
		next.ServeHTTP(w, r)
	})
	return otelhttp.NewHandler(inner, "http",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "HTTP " + r.Method }))
}
