// Package gateway measures what the gateway adds to each operation: the same small
// forward_backward and optim_step, called on the backend directly and through the server
// (loops.v1 over Connect, and Tinker's HTTP routes), side by side in one process. Run it
// with `LOOPS_BENCH=1 go test -v -run Overhead ./bench/gateway/`; sdk_latency.py measures
// the round trip through the real tinker SDK. TestTracingOverhead
// (`-run TracingOverhead`) measures OpenTelemetry tracing off against on at sampling 1.0.
package gateway
