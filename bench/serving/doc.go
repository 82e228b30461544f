// Package serving measures the inference APIs' serving throughput end to end: a Go client
// streams completions from a real gateway (/oai/api/v1/completions, stream: true) on a
// loopback port at concurrency 1, 8 and 32 and reports output tokens/s, time to first token
// and inter-token latency p50/p99, and the batching gain over serial (concurrency 1, run in
// the same test). Models: loops/tiny (the base model, and 4 LoRA sampler checkpoints of it
// served round robin), and with LOOPS_BENCH_LARGE=1 a Qwen3-0.6B-shaped model written from a
// fixed seed. See README.md; run with LOOPS_BENCH=1.
package serving
