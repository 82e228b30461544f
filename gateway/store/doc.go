// Package store defines the gateway's durable state: the Store interface and the records it
// keeps.
//
// A Store holds what must survive a restart of the gateway: sessions, training runs,
// checkpoints (their records, not their weights), samplers and operations, each scoped to
// the workspace of the API key that created it. Queues of work in flight, waiters and other
// transient state live in memory in the gateway and are never written here; at start-up the
// gateway calls FailUnfinishedOperations so that work lost with the previous process shows up
// as failed instead of pending forever.
//
// Store is the interface every backend implements: package store/sqlite is the embedded
// single-node backend (the default), package store/postgres keeps the same records in
// PostgreSQL (loops serve --database postgres://…); both share their SQL through
// store/internal/sqlstore. Store is composed of small interfaces (SessionStore, RunReader,
// BatchWriter, …): a consumer depends on the ones it uses. Package store/storetest is the
// contract suite every implementation must pass.
//
// Fencing: gateways that share a PostgreSQL database elect a leader with a lease (package
// lease). The leader gives its store a Fence (its term of the lease), and every write then
// checks, inside its own transaction, that the term still holds the lease: a leader paused
// past its lease (a long GC, a frozen VM, a write in flight) cannot commit anything once
// another gateway has taken over; its writes fail with ErrFenced, and it steps down.
package store
