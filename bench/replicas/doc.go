// Package replicas measures sampling throughput over 1, 2 and 4 sampler replicas of one
// base model: the torch worker backend in pool mode (local provider), CPU workers with a
// fixed number of threads each, concurrent sampling requests spread by the backend's
// routing (backends/worker/route.go). It reports tokens/s per replica count and the ratio
// to one replica (goal ≥ 0.8 × N on a box with enough cores), with the cores used. See
// README.md; run with LOOPS_BENCH=1 and LOOPS_WORKER_PYTHON.
package replicas
