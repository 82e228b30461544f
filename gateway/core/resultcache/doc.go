// Package resultcache keeps the large results of operations in memory (docs/semantics.md,
// "Operations"): the per-token outputs of forward and forward_backward and the sequences of
// sample, in a cache bounded in bytes and in time. Entries leave oldest first: when they
// pass the TTL, or when newer results need the room. The store and the core's operation
// registry keep the small part only (Small: state, error, metrics); asking for a large result
// that has left the cache, or that a restart dropped, is answered FailedPrecondition with
// reason RESULT_EXPIRED (Cache.ErrExpired). Compat's encodings of a result (JSON, protobuf)
// are kept in its entry (Cache.Encoded) and count against the same budget.
package resultcache
