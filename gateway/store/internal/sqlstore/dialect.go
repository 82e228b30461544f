package sqlstore

// Dialect is what differs between the SQL of the two stores.
type Dialect struct {
	// TableOptions end a CREATE TABLE (SQLite's " STRICT").
	TableOptions string
	// LockRows ends a SELECT of rows that the transaction then updates (PostgreSQL's
	// " FOR UPDATE"; SQLite's single writer holds the whole database already).
	LockRows string
	// InsertStepMetrics is the step metrics insert (see stepmetrics.go): its casts name
	// each database's types.
	InsertStepMetrics string
	// WeightsAccessTokenColumns are the six values a token's insert selects
	// (CreateWeightsAccessToken), cast to each database's types.
	WeightsAccessTokenColumns string
	// AccessRequestColumns are the eight values an access request's insert selects
	// (PutAccessRequest), cast to each database's types.
	AccessRequestColumns string
	// InsertReceiptStep is the receipt step insert (see receipts.go).
	InsertReceiptStep string
}

// SQLite is the dialect of store/sqlite.
var SQLite = Dialect{
	TableOptions:              " STRICT",
	InsertStepMetrics:         insertStepMetrics("$1, $2, $3, $4, $5, $6, $7, $8"),
	WeightsAccessTokenColumns: "$1, $2, $3, $4, $5, $6",
	AccessRequestColumns:      "$1, $2, $3, $4, $5, $6, $7, $8",
	InsertReceiptStep:         insertReceiptStep("$1, $2, $3, $4"),
}

// Postgres is the dialect of store/postgres.
var Postgres = Dialect{
	LockRows:                  " FOR UPDATE",
	InsertStepMetrics:         insertStepMetrics("$1::text, $2::bigint, $3::text, $4::integer, $5::bigint, $6::bigint, $7::bigint, $8::bytea"),
	WeightsAccessTokenColumns: "$1::text, $2::text, $3::text, $4::bigint, $5::bigint, $6::bytea",
	AccessRequestColumns:      "$1::text, $2::text, $3::text, $4::text, $5::bigint, $6::bigint, $7::bigint, $8::bytea",
	InsertReceiptStep:         insertReceiptStep("$1::text, $2::bigint, $3::text, $4::bytea"),
}
