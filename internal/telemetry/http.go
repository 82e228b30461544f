package telemetry

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// HTTPOptions tunes Handler.
type HTTPOptions struct {
	// SecretPrefixes begin paths whose rest is a credential (a trace link's or an
	// archive's token): their url.path attribute is the prefix and "{token}".
	SecretPrefixes []string
	// Untraced begin paths that get no span (probes and scrapes: /metrics, health).
	Untraced []string
}

// Handler continues the client's trace (W3C traceparent and baggage, or what
// OTEL_PROPAGATORS names) on every request to next, under a server span named by method
// (the route is not known before the mux). With tracing off (Enabled is false) next is
// returned as is.
func Handler(next http.Handler, o HTTPOptions) http.Handler {
	if !Enabled() {
		return next
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range o.SecretPrefixes {
			if rest, ok := strings.CutPrefix(r.URL.Path, p); ok && rest != "" {
				// A later value of a key replaces the earlier one on the span.
				trace.SpanFromContext(r.Context()).SetAttributes(semconv.URLPath(p + "{token}"))
				break
			}
		}
		next.ServeHTTP(w, r)
	})
	return otelhttp.NewHandler(inner, "http",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "HTTP " + r.Method }),
		otelhttp.WithFilter(func(r *http.Request) bool {
			for _, p := range o.Untraced {
				if strings.HasPrefix(r.URL.Path, p) {
					return false
				}
			}
			return true
		}))
}

// NameRoute names ctx's server span after the route that serves it (pattern, as
// http.ServeMux writes it: "POST /api/v1/forward_backward"), and sets http.route, so that
// spans group by route rather than by method only.
func NameRoute(ctx context.Context, pattern string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetName(pattern)
	if _, path, ok := strings.Cut(pattern, " "); ok {
		pattern = path
	}
	span.SetAttributes(semconv.HTTPRoute(pattern))
}
