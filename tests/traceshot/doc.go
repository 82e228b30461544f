// Package traceshot renders a session trace (Chrome trace event JSON, as TraceService and
// `tinker session export-trace` give it) to a PNG, offline: a small timeline page drawn in
// headless Chromium, laid out as trace viewers lay it out (a process per training run or
// sampler, a row per operation, its stages nested). It makes docs/images/trace-export.png:
//
//	LOOPS_TRACESHOT_IN=trace.json LOOPS_TRACESHOT_OUT=docs/images/trace-export.png \
//	  go test ./tests/traceshot -run TestRender -v
//
// The test is skipped without LOOPS_TRACESHOT_IN. Chromium: LOOPS_CHROMIUM or
// /usr/bin/chromium.
package traceshot
