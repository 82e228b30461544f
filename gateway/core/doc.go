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
// The parts, each in its own file or package, with its own lock:
//   - sequencer (package gateway/core/sequencer): one run's seq_id order, de-duplication and
//     gaps; pure bookkeeping, tested without a Core.
//   - the run (package gateway/core/trainrun): a state machine with one owner, holding the
//     run's record, its sequencer, where its head task is, its adapter, recovery and pool
//     state behind one lock that is a leaf: nothing is called out and no other lock is
//     taken while it is held. queue.go is the core's side: submit resolves what a request
//     needs (the registry, checkpoints, the store, the policy) before and after claiming its
//     seq_id, never while holding the run's lock, and acts on what the run returns.
//   - the per-model scheduler (package gateway/core/lane; scheduler.go starts one per base
//     model): it runs forward/backward work in pieces of a token budget, in batches shared
//     by deficit round robin between workspaces, several batches at once with at most one
//     per workspace; it reaches the core only through two small interfaces (lane.Runner:
//     coreRunner in queue.go, lane.Slots: the slot table), so it is tested with fakes.
//   - the adapter slot table (package gateway/core/adapterslots): which runs' adapters the
//     backend holds within its max_adapters; it offloads the least recently used idle one
//     into DataDir/spill and restores it before the run's next task. It calls the backend's
//     adapter methods only, and reaches the core through a callback (Core.adapterLost).
//   - the run registry (registry.go): the runs in memory, reloaded from the store on demand
//     and evicted when idle.
//   - operations (operations.go): outcomes, written behind in group commits by the
//     write-behind persister and its journal (package gateway/core/writebehind), and large
//     results in a bounded cache (package gateway/core/resultcache).
//   - sampling (sampling.go, samplequeue.go): samplers and a fair queue per base model.
//   - request validation (package gateway/core/validate): pure checks of training and
//     sampling requests against the model and the server's limits, before work starts.
//   - deployments (deployments.go): named sets of checkpoints to sample from; the sampler
//     replicas they ask for are placed by package gateway/core/placement.
//   - checkpoints (checkpoints.go): saves, loads, deletes and the checkpoint API; the files
//     are kept by package gateway/core/ckfiles (store keys and generations, a lock per
//     checkpoint, local folders or presigned URLs for readers, the sweep of keys no record
//     references, the migration of the old folder layout), which reads records through a
//     one-method interface (ckfiles.Records).
//
// Client errors are made by package gateway/core/apierr (the core's invalidArgument,
// internal, … call it), so the extracted parts answer with the same codes.
//
// # Goroutines
//
// Every goroutine the core starts (lanes and the tasks, adapter moves, rebuilds and
// snapshots they start, sampling slots, the janitor, the placer, the store sweep) belongs to
// one lifecycle owner (Core.life, internal/lifecycle): it is started under the lock that
// refuses new ones once the core drains, runs with the owner's context, and Close stops it
// and names what is still running if it does not end. The persister's two goroutines are
// stopped after them (ops.close), once every outcome has been handed to it.
//
// # Lock order
//
// A goroutine that holds one of these locks takes only locks further down the list
// (lockorder.go has one rank type per lock; tests built with the lockorder tag check every
// Lock against it):
//
//	Core.mu (lanes, live sessions)
//	sessionState.mu
//	runRegistry.mu
//	samplers.mu
//	samplerState.mu
//	sampleQueue.mu
//	adapterslots.Table.mu (gateway/core/adapterslots)
//	lane.Lane.mu (gateway/core/lane)
//	operations.mu
//	operation.mu
//	policy.Enforcer.mu (gateway/policy)
//	writebehind.Persister.jmu (gateway/core/writebehind)
//	writebehind.Persister.mu
//	onceTable.mu
//	trainrun.Run.mu (last: nothing is taken under it)
//
// Locks not in the list (the usage meter, the result cache, the checkpoint files' tables
// (package ckfiles), archive tokens, the placer, busy counters, the lifecycle owner) are
// leaves: nothing is taken under them and no I/O runs under them. One checkpoint's own lock
// (ckfiles.Files.Lock) is held across the store calls of its record's read-check-write, by
// design, and is taken with none of the listed locks held; nothing of the core is taken
// under it. The usage meter's mu is taken before the budget book's (budget.go: a cost is
// metered and added to its spend in one step), and its flushMu serializes flushes, whose
// store writes run under it: it is taken with none of the listed locks held, and a
// workspace's spend is read from the store without it (loadSpend; with it only after three
// reads a flush disturbed), so otherwise only flushes (the
// janitor's, GetUsage's, Close's) wait for one another.
//
// What must survive a restart (sessions, runs, checkpoints, operation outcomes) is in the
// store; queues and adapters live in memory. At start-up, operations left unfinished by a
// crash are marked failed, and runs whose adapter state was lost are marked corrupted and
// get a fresh adapter, so a checkpoint can be loaded to continue.
package core
