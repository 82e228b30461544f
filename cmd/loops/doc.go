// Command loops is the Loops server and its command-line client: `loops serve` runs the
// service; `loops models`, `loops runs` and `loops checkpoints` ask a running server.
package main
