// Package core is the one implementation of Loops' services: sessions, training runs,
// operations, checkpoints, samplers and models. It implements the loops.v1 Connect handler
// interfaces; the Connect/gRPC/REST surfaces and the Tinker compat layer all call it, so no
// logic exists twice.
//
// Work on a training run is an operation, answered at once and done later. Operations of a
// run execute strictly in seq_id order; repeats of a (run, seq_id) return the first
// operation; a seq_id whose request was rejected counts as consumed, and a gap that never
// fills is skipped after Options.GapTimeout. Ready forward/backward work of several runs on
// one base model goes to the backend in one batch; optimizer steps, saves and loads are
// barriers for their own run only. Waiters are woken by completion, never by polling.
//
// The parts, each in its own file with its own lock:
//   - sequencer (package gateway/core/sequencer): one run's seq_id order, de-duplication and
//     gaps; pure bookkeeping, tested without a Core.
//   - the run (queue.go): a sequencer, whether its head is running or waiting in its lane,
//     and its adapter's state; submit, kick and taskDone move it between those.
//   - the per-model scheduler (scheduler.go, fair.go, slots.go): a lane per base model picks
//     each round's tasks, shares batches fairly between workspaces and keeps the backend's
//     adapter slots; it reaches the rest of the core only through two small interfaces
//     (taskRunner, slotKeeper), so it is tested with fakes.
//   - the run registry (registry.go): the runs in memory, reloaded from the store on demand
//     and evicted when idle.
//   - operations (operations.go, persister.go, resultcache.go): outcomes, written behind in
//     group commits, and large results in a bounded cache.
//   - sampling (sampling.go, samplequeue.go): samplers and a fair queue per base model.
//
// What must survive a restart (sessions, runs, checkpoints, operation outcomes) is in the
// store; queues and adapters live in memory. At start-up, operations left unfinished by a
// crash are marked failed, and runs whose adapter state was lost are marked corrupted and
// get a fresh adapter, so a checkpoint can be loaded to continue.
package core
