// Package writebehind is the core's write-behind persister and its outcome journal
// (docs/semantics.md, "Restart").
//
// Operation records and training-run bookkeeping (last request time, last seq_id, the
// corrupted flag, last checkpoints) and step metrics are not written by the goroutine that
// changes them: they are queued on a Persister, and one goroutine takes everything queued so
// far as one group (a group commit whose batch is whatever arrived while the previous group
// was being written), appends it to the journal (one write(2)) and then publishes the
// group's outcomes; a second goroutine commits the journaled records to the store (one
// store.BatchWriter.ApplyBatch for whatever has been journaled since its previous one) and
// removes journal files whose records are all committed. Nothing on the scheduler's path,
// nothing under a run's or sampler's lock, and no acknowledgement waits for the store.
//
// Records are coalesced by id (an operation created and finished within one group is written
// once, in its final state; a run touched by many steps is written once). An operation's
// outcome is published to its waiters (Finish's publish) only after the group holding it is
// in the journal, so a client never sees an outcome that a crash of the process then loses:
// the records are in the kernel once the write returns. Everything queued before it (the
// run's bookkeeping of that step, say) is journaled by then too, in the same or an earlier
// group. When the journal cannot be written, or there is none (a store shared with a
// standby gateway, which could not replay this host's disk), the group is committed to the
// store before its outcomes are published.
//
// At start-up, Recover replays the journal files that a crash left (DataDir/journal) into
// the store, later records winning, before the core fails unfinished operations. Until the
// store holds a record, readers see it through a ReadStore, so a read never goes back behind
// what was published.
//
// A store that refuses a write because another gateway leads now (store.ErrFenced) stops
// the persister as a crash would: nothing it had not committed is published, and new work
// is refused (ErrStopped).
//
// # Lock order
//
// A Persister has two locks, ranked in the core's lock order (gateway/core/doc.go): the
// journal's order (Persister.jmu, 800), then the queued records (Persister.mu, 810). Under
// the second, the newest record of a changed run is taken (RecordSource.TakeRecord), so a
// run's lock comes after both. No store I/O runs under either; the journal is appended
// under jmu only.
package writebehind
