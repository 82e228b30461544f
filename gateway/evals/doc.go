// Package evals is what an eval is, apart from where it runs: the JSONL dataset decoder
// (bounded by bytes, rows and field sizes, every bad row refused with its line number) and
// the scoring of one checkpoint on a decoded dataset through a Model (prompt log-probs and
// greedy generation), for each EvalKind: held-out NLL, multiple choice by log-likelihood,
// and generation scored by exact match, contains or an RE2 regular expression. The core
// (gateway/core, evals.go) stores evals, attaches them to runs and gives Score a Model that
// samples through its fair queue as work of the run's workspace. See docs/evals.md.
package evals
