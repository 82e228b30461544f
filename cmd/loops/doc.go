// Command loops is the Loops server and its command-line client: `loops serve` runs the
// service; `loops models`, `loops runs`, `loops checkpoints`, `loops usage` and `loops workspace` ask a running server.
package main
