package core

// The core's lock order (doc.go says why there is one). Each lock is a rank type; a
// goroutine that holds a lock may take only locks ranked after it. Builds with the
// lockorder tag check it at every Lock (internal/lockorder).

// rankCore: Core.mu (the lanes and live sessions maps). Taken first; under it only a
// session's lock (expireSessions) and the lifecycle owner's (laneFor).
type rankCore struct{}

func (rankCore) Rank() (int, string) { return 100, "core.Core.mu" }

// rankSession: sessionState.mu (a live session's record and de-duplication tables).
type rankSession struct{}

func (rankSession) Rank() (int, string) { return 200, "core.sessionState.mu" }

// rankOnceTable: onceTable.mu (a de-duplication table of client sequence numbers).
type rankOnceTable struct{}

func (rankOnceTable) Rank() (int, string) { return 950, "core.onceTable.mu" }

// rankRegistry: runRegistry.mu (the runs in memory). Under it: runs' locks (evictIdle).
type rankRegistry struct{}

func (rankRegistry) Rank() (int, string) { return 300, "core.runRegistry.mu" }

// rankSamplers: samplers.mu (the samplers in memory). Under it: a sampler's lock.
type rankSamplers struct{}

func (rankSamplers) Rank() (int, string) { return 400, "core.samplers.mu" }

// rankSampler: samplerState.mu (a sampler's de-duplication table).
type rankSampler struct{}

func (rankSampler) Rank() (int, string) { return 410, "core.samplerState.mu" }

// rankSampleQueue: sampleQueue.mu (the fair sampling queue).
type rankSampleQueue struct{}

func (rankSampleQueue) Rank() (int, string) { return 450, "core.sampleQueue.mu" }

// rankSlots: slots.mu (the backend's adapter slots). Nothing is taken under it: runs
// waiting for a slot are woken after it is released.
type rankSlots struct{}

func (rankSlots) Rank() (int, string) { return 500, "core.slots.mu" }

// The lane's lock (lane.RankLane, rank 550) comes next: nothing is taken under it.

// rankOperations: operations.mu (the operations in memory).
type rankOperations struct{}

func (rankOperations) Rank() (int, string) { return 600, "core.operations.mu" }

// rankOperation: operation.mu (one operation's record).
type rankOperation struct{}

func (rankOperation) Rank() (int, string) { return 610, "core.operation.mu" }

// The workspace policy's lock (gateway/policy, rank 700) comes next: nothing of the core is
// taken under it.

// The write-behind persister's locks (gateway/core/writebehind: Persister.jmu, rank 800,
// then Persister.mu, rank 810) come next: under them only a run's lock.

// A run's lock (trainrun.Run.mu, rank 1000) is last: nothing is taken under it.
