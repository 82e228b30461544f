// Command loops is the Loops server and its command-line client: `loops serve` runs the
// service; `loops models`, `loops runs`, `loops checkpoints`, `loops usage`, `loops workspace` and
// `loops projects` ask a running server.
// `loops cookbook list|show|check|run` checks and runs the cookbook's Python recipes (cookbook/,
// embedded in the binary) against a server, in a cached venv.
package main
