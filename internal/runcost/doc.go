// Package runcost sums a training run's rows of the loops.v1 usage API (UsageBucket) into
// the costs that `loops runs show` and the console's run page show beside the run's
// training cost: its checkpoint storage, the storage its session was metered before
// storage was metered per run, and its dedicated pool's time. Sums are exact
// (money.Tally).
package runcost
