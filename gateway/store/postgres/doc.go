// Package postgres implements store.Store on a PostgreSQL database, with pgx v5 and its
// connection pool (pgxpool).
//
// The schema is the SQLite store's (package store/sqlite), table for table: each record is
// kept as its marshalled loops.v1 protobuf message in a data column, next to copies of the
// fields needed for lookups, workspace scoping and ordering; times are unix nanoseconds;
// text columns use the "C" collation so that lists come back in the same (bytewise) order as
// SQLite's whatever the cluster's locale. The schema is created and upgraded by the embedded
// migrations in migrations/, which have the same names and versions as SQLite's, and its
// version is kept in the schema_version table. Migrations run in one transaction under an
// advisory lock, so gateways starting at once on one database migrate it once.
//
// Every write goes through one of two helpers (write.go). A write of one round trip (a Put,
// a delete, AddUsage, PutDeployment) sends its statements as one pipelined batch, which runs
// as one implicit transaction; a write of several (ApplyBatch, FailUnfinishedOperations,
// FailRunningJobs) sends BEGIN with its first statements and COMMIT with nothing else but
// the fence. ApplyBatch (the core's write-behind group commit) is two round trips: its
// upserts, in id order so that concurrent batches cannot deadlock, and the COMMIT.
// FailUnfinishedOperations locks the rows it changes. A transaction aborted for a
// serialization failure or a deadlock is run again (up to three times). A list runs its
// count and its page in one read-only repeatable-read transaction, also one round trip; with
// store.Page.After it pages by key (create_time, id), so a deep page costs what the first
// does, and it only adds OFFSET when the caller asks for one.
//
// Fencing (store.Fencer, docs/two-gateways.md): with a fence set, every write transaction
// ends with a check, in the same round trip as its COMMIT, that the fence's term still holds
// the lease (the table of package lease/pglease), under a FOR KEY SHARE lock of the lease's
// row: a takeover locks that row FOR UPDATE and so waits for the commit (the write is then
// before the takeover), a write after a takeover fails with store.ErrFenced and changes
// nothing, and renewals never wait for writes. A transaction of several round trips bounds
// how long it may stay idle (idle_in_transaction_session_timeout, Fence.IdleTimeout), so a
// process stopped in the middle of one does not hold its locks past a takeover. A write
// that fails otherwise (its connection ended, say) is reported as store.ErrFenced when the
// lease is no longer held.
//
// Open takes a postgres:// URL (or key=value connection string) and Options: pool size,
// connect timeout, statement_timeout and connection lifetimes; parameters pgx reads from the
// URL (pool_max_conns, connect_timeout, sslmode, …) apply too, and Options override them.
//
// The tests start their own throwaway server (package pgtest); they skip when the
// PostgreSQL binaries are missing, except under CI=true.
package postgres
