// Package recovery measures step recovery (gateway/core/recovery.go): what keeping a run
// recoverable costs per step (a snapshot after every optim_step, written beside the next
// step), side by side with the same run on a core without it, and how long a run waits
// when the replica holding it is killed, by how many calls are replayed. Workers are Go
// CPU workers (loops worker) in a pool of two. See README.md; run with LOOPS_BENCH=1.
package recovery
