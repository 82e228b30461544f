// Package compat serves the Tinker HTTP API (the routes under /api/v1/ that the `tinker`
// Python SDK calls) on top of the Loops core services.
//
// It is nothing but translation: every route decodes the SDK's request (JSON, protobuf
// tinker.public.v1 messages, optionally zstd-compressed), calls one or a few loops.v1 core
// handlers, and encodes the answer the SDK validates. Long-running work answers at once with
// {"request_id"} and its result is fetched with the long-polled retrieve_future route.
//
// Supported clients: tinker SDK 0.38.0 (protobuf forward_backward bodies and protobuf
// SampleResponse/ForwardBackwardOutput results) and the JSON-era SDKs up to 0.24 (JSON
// forward_backward/forward bodies and JSON results, chosen by the Accept header).
//
// Errors are JSON {"detail": ..., "code": ...} with a Content-Length; a client mistake that
// compat detects itself is always a 4xx. See NewHandler for the entry point.
package compat
