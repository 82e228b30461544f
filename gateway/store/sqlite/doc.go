// Package sqlite implements store.Store on an SQLite database file, with the pure-Go driver
// modernc.org/sqlite (no cgo).
//
// Each record is kept as its marshalled loops.v1 protobuf message in a data column, next to
// copies of the fields needed for lookups, workspace scoping and ordering. The schema is
// created and upgraded by the embedded migrations in migrations/, and its version is kept in
// the schema_version table. The SQL, the migration runner and the decoding of rows are
// shared with store/postgres (store/internal/sqlstore). An SQLite database is one gateway's
// own: it takes no fence (SetFence returns store.ErrNoFence).
//
// The database runs in WAL mode: all writes go through one connection, so writers in this
// process queue in database/sql instead of failing with SQLITE_BUSY, while reads use a
// separate pool of read-only connections and never wait for writers. busy_timeout covers the
// remaining cases (another process, WAL checkpoints). synchronous=NORMAL means a commit
// survives a crash of the process but the last commits may be lost on power failure.
package sqlite
