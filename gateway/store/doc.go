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
// PostgreSQL (loops serve --database postgres://…). Package store/storetest is the contract
// suite every implementation must pass.
package store
