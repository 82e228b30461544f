// Package sequencer puts one training run's requests in seq_id order. It is bookkeeping
// only: no locks, clocks, goroutines or I/O. Its caller (gateway/core's run) holds its own
// lock around every call, builds the operations, and arms the timer that skips a gap.
//
// The rules (docs/semantics.md, "Operations"):
//   - A run's requests execute in seq_id order. A request names its seq_id, or sends 0 for
//     "the next one after everything submitted so far".
//   - A repeat of a used seq_id with the same kind of request is answered with the first
//     request's operation; a repeat of another kind, or of a request that was rejected, is
//     refused.
//   - A seq_id whose request was rejected counts as consumed, so it never holds the run up.
//   - A seq_id below the next expected one that was never used arrived too late: refused.
//   - When the next expected seq_id is missing but later ones are queued, the caller waits
//     a while and then skips the gap (SkipGap).
//   - A run recovered after a restart does not know the client's position: it starts at
//     Resync, and the first request's seq_id becomes the position.
//
// Memory is bounded: at most maxPending requests are queued (Admit refuses more with
// FullError, without using the seq_id, so a retry is accepted later), and the table of
// used seq_ids keeps the newest Keep below the position once it holds twice as many.
package sequencer
