// Package trainrun is a training run in memory: a state machine with one owner and one lock.
//
// A Run holds everything about one run that changes while it trains: its record (the
// store's TrainingRun, written behind), its seq_id order (package sequencer), where its head
// task is (waiting, ready in its lane, running), whether its adapter is on the backend, why
// it takes no more work, the task kept to run again after a lost replica, its step-recovery
// state (recovery point, replay log, snapshot in flight) and its dedicated pool. All of it
// is behind the Run's own lock, and that lock is a leaf: no method calls out of the package,
// takes another lock, reads a store or talks to a backend while holding it. What a run
// needs from outside (the registry, checkpoints, the store, the policy) is resolved by the
// caller before it calls in, and what the run decides that others must act on (finish an
// operation, free an adapter, delete a snapshot, wake its lane) is returned to the caller,
// who acts after the call. The one thing a Run calls itself is its lane's wake-up, Config.Ready,
// always after releasing its lock.
//
// # States
//
// A run is in one of these states (Phase reports it):
//
//	                ┌────────────── Release (nothing runnable) ──────────────┐
//	                ▼                                                        │
//	New ──► Idle ──(head arrives: Commit, SkipGap, Wake)──► Ready ──TakeHead──► Busy
//	         ▲  ▲                                             │  ▲              │
//	         │  └──────────── Unqueue (parked for a slot) ◄───┘  │ Release      │ KeepForRetry
//	         │                                                   │ (retry kept) ▼
//	         │                                   Hold (adapter moving) ◄── Recovering
//	         │                                                     (rebuild, then Release)
//	 Unload, Fail (from any state: queued work returned to fail; a busy run's adapter is
//	 freed when its running task Releases) ──► Unloaded (refuses work; the reason is in
//	 the record, so it survives eviction and restarts)
//
// Idle: nothing runnable (no head, or a gap the gap timer will skip, or a claimed head being
// checked). Ready: in its lane's ready list. Busy: its head task runs, or its adapter is
// being moved or rebuilt (Hold), so nothing else runs it and an unload waits. Recovering:
// busy with a task kept to run again once the adapter is rebuilt from the recovery point.
// A run that is Idle or Unloaded, holds no adapter and has nothing queued may leave memory
// (Evictable); the registry reloads it from the store on demand.
//
// # Submitting work
//
// A request claims its seq_id under the lock (Admit), is checked and has its operation made
// without it (store reads, policy, the operation's record), and is then recorded, rejected
// or given back (Commit, Abandon). A repeat of a claimed seq_id waits for the claim.
//
// # Lock order
//
// Run.mu is the last lock in the core's order (gateway/core/doc.go): nothing is taken while
// it is held. In builds with the lockorder tag the order is checked at every Lock.
package trainrun
