// Package lockorder gives mutexes a rank and checks, in test builds, that every goroutine
// takes them in rank order: a goroutine that holds a mutex of rank n may only take mutexes
// of a higher rank. A package writes its lock order once, as rank types (one per lock, in
// its doc.go), and declares each mutex as Mutex[thatRank]; a take against the order is then
// found by any test that exercises it, not only by the rare interleaving that deadlocks.
//
// Without the build tag "lockorder" a Mutex is a sync.Mutex and checks nothing (no cost).
// With it (go test -tags lockorder), each Lock looks up the goroutine's held mutexes and
// panics with both locks' names when the order is broken. The check costs a stack read per
// Lock, so it is for tests only.
package lockorder
