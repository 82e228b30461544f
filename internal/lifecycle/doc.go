// Package lifecycle owns the goroutines of a server part: each is started through a
// Stopper (Go), under the same lock that refuses new ones once the Stopper quiesces, runs
// with a context the Stopper cancels when it stops, and is counted by name, so a stop that
// runs out of time says what is still running (CockroachDB's stopper is the model).
//
// Order of a shutdown: Quiesce (new goroutines are refused with ErrStopping; the caller
// fails the work it meant to start), then Stop (the context is cancelled and Stop waits for
// every goroutine, up to its own context's deadline, then returns a *StillRunningError that
// names what is left).
package lifecycle
