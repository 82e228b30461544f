// Package hardening measures what hostile request bodies cost the server: the peak resident
// memory (VmHWM) of a real `loops serve` process, started in its own process on
// 127.0.0.1:0, while it answers 8 concurrent maximal compressed bodies (zstd on the Tinker
// route, gzip on loops.v1 Connect), against the decompressed-size limit as the baseline.
// Run it with
//
//	LOOPS_BENCH=1 go test -count=1 -v ./bench/hardening/
//
// LOOPS_BIN runs a binary built elsewhere (an older commit, for a before/after), and
// LOOPS_BENCH_CONCURRENCY changes the 8. Figures are recorded in README.md in this folder.
package hardening
