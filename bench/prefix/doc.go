// Package prefix holds the prefix-cache benchmark (issue 29, item 5): multi-turn
// tool-calling episodes shaped like the cookbook's tool_calling and sandboxed_agent
// recipes (each turn's prompt is the previous prompt, the previous completion and a tool
// result), sampled on the reference engine with its prefix cache on and off side by side:
// the share of prompt tokens served from the cache, the time to first token and the sample
// latency, and a check that both engines sample the same tokens and log-probs. Run with
//
//	go run ./bench/prefix/cmd/prefixbench
//
// Figures are recorded in README.md in this folder.
package prefix
