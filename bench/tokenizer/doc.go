// Package tokenizer measures what prompts cost to tokenize: in process, the time and the
// bytes allocated by the reference tokenizer's Encode (the one the OpenAI- and
// Anthropic-compatible routes use) on inputs of 1, 2 and 4 units of four kinds (dense chat
// markers, many chat messages, prose, one long word), whose ratios show whether it is
// linear; and on a real `loops serve` process, the time and the peak resident memory of
// answering the hostile prompts issue 24 found (a 60 MiB message, 302 KiB of chat markers,
// 20,000 messages). Run it with
//
//	LOOPS_BENCH=1 go test -count=1 -v ./bench/tokenizer/
//
// LOOPS_BIN runs a binary built elsewhere (an older commit, for a before/after) in the
// process benchmark, and LOOPS_BENCH_SCALE multiplies the in-process units (0.25 for a quadratic encoder). Figures are
// recorded in README.md in this folder, with how the "before" columns were made.
package tokenizer
