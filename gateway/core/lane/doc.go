// Package lane is the per-model scheduler of training work: a Lane executes the ready work
// of every run on one base model, fairly between workspaces, at any request size.
//
// A run is ready when its head task can run (trainrun.Run calls MarkReady). Each plan, the
// lane takes the ready runs' heads and the forward/backward tasks it is part-way through:
//
//   - A run's other tasks (create, save, load, optim_step, unload) are barriers for that run
//     only: each runs on a goroutine of its own beside the batches, and the run is ready
//     again when it is done.
//   - Forward/backward work is cut into pieces of at most a token budget by the request's
//     own content (trainrun.ChunkData: whole datums), so a big step holds the backend for
//     one piece at a time; between pieces the lane schedules again. A piece's bits depend
//     on its own data alone, so a step computes the same bits alone and beside a flood.
//   - Pieces of several runs go to the backend in one batch, chosen by deficit round robin
//     over workspaces weighted by tokens (Plan): each workspace with work gets an equal
//     share of a batch; what does not fit waits for the next batch with the credit it kept.
//   - Up to Config.Concurrency batches run at once, and a workspace has at most one of them
//     (its next piece waits for its batch to return). So a workspace that floods the model
//     keeps one batch busy, and another workspace's work starts on the next free one at
//     once, instead of waiting behind the flood's batch; a workspace with work waiting
//     gains no credit while its batch runs.
//   - One more batch, the express batch (Config.ExpressTokens, the core's ChunkTokens / 8),
//     is for small work: a workspace whose waiting pieces come to at most that many tokens
//     in all goes there when every batch is running, or instead of sharing a batch with
//     other workspaces' bigger pieces (Planner.Express). So a tenant sending small steps
//     waits neither for several flooding workspaces' batches nor for a flood's piece in its
//     own batch; a workspace whose many small steps add up to more is not small work.
//
// A run whose adapter must first be restored, moved or rebuilt does that on a goroutine of
// its own too: the lane's loop never waits for the backend. The lane knows nothing of
// operations, stores or backends: a Runner runs what it schedules and Slots keeps the
// backend's adapter slots; the core provides both.
//
// # Lock order
//
// Lane.mu guards the ready list, the pieces waiting to continue and the workspaces in flight;
// nothing is taken under it (its rank is the core's rankLane). A run's lock is taken only
// through trainrun.Run's methods, never while Lane.mu is held.
package lane
