// Package workerdrop measures what a killed worker costs the runs on the healthy workers of
// the same model: a forward_backward batch whose items are on a worker that is killed and
// on one that is not, side by side with the same batch on two healthy workers. Workers are
// Go CPU workers (loops worker), started by hand at fixed addresses (remote workers) or by
// the local provider. See README.md; run with LOOPS_BENCH=1.
package workerdrop
