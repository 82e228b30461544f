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
// Writes that span rows are transactions: ApplyBatch (the core's write-behind group commit)
// sends its upserts as one pipelined batch inside a transaction, in id order so that
// concurrent batches cannot deadlock, and FailUnfinishedOperations locks the rows it
// changes. A transaction aborted for a serialization failure or a deadlock is run again (up
// to three times). A list runs its count and its page in one read-only repeatable-read
// transaction, also one round trip; with store.Page.After it pages by key (create_time, id),
// so a deep page costs what the first does, and it only adds OFFSET when the caller asks for
// one.
//
// Open takes a postgres:// URL (or key=value connection string) and Options: pool size,
// connect timeout, statement_timeout and connection lifetimes; parameters pgx reads from the
// URL (pool_max_conns, connect_timeout, sslmode, …) apply too, and Options override them.
//
// The tests start their own throwaway server (package pgtest); they skip when the
// PostgreSQL binaries are missing, except under CI=true.
package postgres
