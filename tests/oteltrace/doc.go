// Package oteltrace holds the end-to-end test of OpenTelemetry tracing: a gateway with a
// local pool of Go worker processes, driven over Tinker's HTTP routes as the tinker SDK
// drives them and over the OpenAI-compatible route, exports its spans and the workers'
// to an OTLP receiver decoding the protobuf (internal/otlptest); the test follows one
// forward_backward from the client's traceparent to the worker and scans every span for
// secrets.
package oteltrace
