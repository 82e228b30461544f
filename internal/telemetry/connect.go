package telemetry

import (
	"context"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ConnectInterceptor is the connect-go interceptor of an RPC span per call, client or
// server side, propagating the trace in the call's headers (gRPC metadata), or nil with
// tracing off. Only a call already in a trace gets a span: one whose context holds a span
// context (the HTTP middleware's, Handler; the one Extract took from a trusted caller; an
// operation's, for the gateway's calls to its workers). Background calls (a worker's
// health and capability checks) start no traces of their own.
func ConnectInterceptor() connect.Interceptor {
	if !Enabled() {
		return nil
	}
	ic, err := otelconnect.NewInterceptor(otelconnect.WithoutMetrics(),
		otelconnect.WithFilter(func(ctx context.Context, _ connect.Spec) bool {
			return trace.SpanContextFromContext(ctx).IsValid()
		}))
	if err != nil { // only a meter provider's error: metrics are off
		return nil
	}
	return ic
}

// Extract puts the trace context each request carries (traceparent, baggage) in its
// context, for a server whose callers are trusted (a worker, called only by its gateway
// over mutual TLS): its spans are then the caller's children. With tracing off next is
// returned as is.
func Extract(next http.Handler) http.Handler {
	if !Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
