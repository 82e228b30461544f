// Package reference holds the benchmarks of the pure-Go CPU engine (backends/reference):
// forward_backward and sampling throughput on the built-in tiny model and, when
// LOOPS_BENCH_LARGE=1, on a randomly initialised Qwen3-0.6B-shaped model. Run with
//
//	go test ./bench/reference -run '^$' -bench . -benchtime 3x
//
// Figures are recorded in README.md in this folder.
package reference
