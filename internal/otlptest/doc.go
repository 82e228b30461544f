// Package otlptest is an OTLP trace receiver for tests: the collector's trace service over
// HTTP (POST /v1/traces, http/protobuf, gzip or not) and over gRPC, decoding the protobuf
// that exporters send, on 127.0.0.1:0. Tests point OTEL_EXPORTER_OTLP_ENDPOINT at it and read
// back every span they exported.
package otlptest
