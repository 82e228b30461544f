// Package telemetry is the process's OpenTelemetry tracing: a tracer provider configured
// by the standard OTEL_* environment variables (Setup), the HTTP middleware that continues
// a client's W3C traceparent and baggage on every surface of the listener (Handler), the
// slog handler that puts the current trace_id and span_id on every log line written with a
// context (LogHandler), the error-id note on a failed request's span (NoteError), and the
// trace-id exemplar of a Prometheus observation (Exemplar).
//
// Tracing is off unless an exporter is configured (OTEL_TRACES_EXPORTER other than none,
// or an OTLP endpoint): then the global provider stays OpenTelemetry's no-op, Handler
// returns its handler unwrapped, and the spans the code starts cost an interface call.
//
// No span carries a credential (API key, bearer token, a trace or archive link's token),
// prompt text or token ids: attributes are ids, kinds, counts, sizes and times
// (docs/operations.md, "Traces").
package telemetry
