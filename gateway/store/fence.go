package store

import (
	"errors"
	"time"
)

// ErrFenced is returned by a write of a store whose Fence no longer holds: the lease it names
// has passed to another holder (or a newer term), lapsed, or was released. The write changed
// nothing, and retrying it cannot succeed: the gateway that gets it is no longer the leader
// and must stop acting as one.
var ErrFenced = errors.New("store: write refused: this gateway no longer holds the leader lease (another gateway leads now)")

// ErrNoFence is returned by SetFence of a store that cannot check a lease: one gateway's own
// database (SQLite), which no other gateway writes.
var ErrNoFence = errors.New("store: this store cannot fence its writes: it is one gateway's own database; gateways that share a store need PostgreSQL")

// Fence is a term of a leader lease that every write must still hold (docs/two-gateways.md,
// "Fenced writes"): the lease named Lease held by Holder in term Term, not expired. It is the
// store's side of the lease's fencing, as a shard's range id is in Temporal: a leader paused
// past its lease (a long GC, a frozen VM, a write in flight) cannot commit anything once
// another gateway has taken over.
type Fence struct {
	// Lease names the lease (lease.DefaultName); Holder is the process that holds it.
	Lease, Holder string
	// Term is the term the holder took. No lease has term 0: a Fence with Term 0 refuses
	// every write (a standby's, until it leads).
	Term int64
	// IdleTimeout bounds how long a write transaction may wait for its process between two
	// of its round trips (a process stopped in the middle of one): the database then ends
	// it, so that its locks do not hold up the gateway that takes over. 0: no bound. A
	// leader sets a fraction of the lease's TTL.
	IdleTimeout time.Duration
	// Lost, when set, is called when a write is refused because the lease is no longer
	// held (it may be called more than once, from any goroutine, and must return at once):
	// the gateway steps down there.
	Lost func(error)
}

// Fencer is the part of a Store that checks a lease on every write. A store shared by several
// gateways (PostgreSQL) checks the fence inside the transaction of each write, under a lock
// that keeps the lease from changing hands until the write commits: a write either commits
// while the fence holds, or fails with ErrFenced and changes nothing. A store without a
// fence writes unchecked.
type Fencer interface {
	// SetFence makes every later write check f; writes in flight keep the fence they began
	// with. Stores that cannot check a lease return ErrNoFence and keep writing unchecked.
	SetFence(f Fence) error
}
