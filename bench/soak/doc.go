// Package soak runs many short sessions through a real server and watches its memory: each
// session creates a run on loops/tiny, takes two forward_backward steps and an optim_step,
// saves sampler weights and finishes, a few sessions at a time, through the loops.v1 Go
// client over Connect against an in-process server on 127.0.0.1:0 (reference engine). Every
// N sessions it samples the process's RSS, its live heap after a GC and its goroutines, and
// reports the least-squares slope after warm-up. It is a benchmark, not a timed test: run it
// with `LOOPS_BENCH=1 go test -count=1 -v -timeout 0 ./bench/soak/` (README.md has the
// figures and the knobs).
package soak
