// Package sqlstore is what the two SQL stores (store/sqlite and store/postgres) share: the
// migration runner, the SQL of every record's upsert, lookup, list and delete, the arguments
// each statement takes (the columns copied out of a record, its marshalled message last),
// the checks a Put makes, the planning of a batch (its writes in a fixed order, so that
// concurrent batches lock rows in the same order), keyset paging, and the decoding of rows.
//
// Its SQL is written once for both databases: parameters are $1, $2, … (PostgreSQL's; the
// SQLite driver binds $NNN to the NNNth argument too), booleans are TRUE and FALSE, and
// conflicts use ON CONFLICT. What differs (the types in casts, row locks) is in a Dialect.
// Each store keeps its own way of running statements (database/sql on one writer
// connection; pgx with pipelined batches).
package sqlstore
