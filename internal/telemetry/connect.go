package telemetry

import (
	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
)

// ConnectInterceptor is the connect-go interceptor of an RPC span per call (client or
// server side), propagating the trace in the call's headers (gRPC metadata), or nil with
// tracing off. trustRemote makes a server's span the child of the caller's, for callers
// inside the trust boundary (the gateway calling its workers); otherwise a server span
// continues the trace the HTTP middleware (Handler) already continued, or starts a new one.
func ConnectInterceptor(trustRemote bool) connect.Interceptor {
	if !Enabled() {
		return nil
	}
	opts := []otelconnect.Option{otelconnect.WithoutMetrics()}
	if trustRemote {
		opts = append(opts, otelconnect.WithTrustRemote())
	}
	ic, err := otelconnect.NewInterceptor(opts...)
	if err != nil { // only a meter provider's error: metrics are off
		return nil
	}
	return ic
}
