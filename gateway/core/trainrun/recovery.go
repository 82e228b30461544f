package trainrun

import (
	"errors"
	"fmt"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Step recovery state (the core's recovery.go says what it is for): a run's recovery point
// and the replay log of its state-changing calls since, bounded per run and, through a
// shared ReplayBudget, server-wide.

// CheckpointRef is a checkpoint record and its owner's workspace.
type CheckpointRef struct {
	Owner      string
	Checkpoint *loopsv1.Checkpoint
}

// Point is the state a rebuild starts from: a snapshot in the checkpoint store (Key), a
// checkpoint the run was created from or loaded (From, with its optimizer state if
// Optimizer), or neither (a new adapter).
type Point struct {
	Key       string
	From      *CheckpointRef
	Optimizer bool
}

// Call is a state-changing backend call of a run since its recovery point.
type Call struct {
	Seq  int64
	FB   *backendv1.ForwardBackwardItem // a forward_backward item, or
	Adam *loopsv1.AdamParams            // an optim_step's parameters
	// Bytes is the call's size in the log (set by RecordCall).
	Bytes int
}

// ReplayBudget bounds the replay logs of every run of a server together (bytes). Its zero
// value allows nothing; use NewReplayBudget.
type ReplayBudget struct {
	limit int64
	used  atomic.Int64
}

// NewReplayBudget returns a budget of limit bytes.
func NewReplayBudget(limit int64) *ReplayBudget { return &ReplayBudget{limit: limit} }

// Used is the bytes the replay logs hold now.
func (b *ReplayBudget) Used() int64 { return b.used.Load() }

// Limit is the budget's size.
func (b *ReplayBudget) Limit() int64 { return b.limit }

func (b *ReplayBudget) take(n int) bool {
	if b.used.Add(int64(n)) > b.limit {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

func (b *ReplayBudget) give(n int) {
	if n != 0 {
		b.used.Add(-int64(n))
	}
}

// recovery is a run's recovery state (under the run's lock).
type recovery struct {
	point  Point
	calls  []Call
	bytes  int
	budget *ReplayBudget
	// broken says why the log is incomplete (it passed a bound); droppedSeq is the newest
	// call left out. A snapshot taken after it makes the run recoverable again.
	broken     string
	droppedSeq int64
	// epoch changes when the point is replaced other than by a snapshot (a load, a rebuild
	// that gave up): a snapshot started in an older epoch is discarded.
	epoch int
	// snap is closed when the snapshot in flight ends; nil when none is.
	snap chan struct{}
	// lost: the adapter must be rebuilt before the run's next task (retry).
	lost bool
}

// dropCalls empties the log and gives its bytes back to the budget.
func (rec *recovery) dropCalls() {
	rec.budget.give(rec.bytes)
	clear(rec.calls)
	rec.calls, rec.bytes = nil, 0
}

// StartRecovery gives the run a fresh recovery state whose point is from (nil: a new
// adapter), its replay log bounded by budget. It returns the key of the snapshot the old
// state pointed at, for the caller to delete ("" if none).
func (r *Run[O]) StartRecovery(from *CheckpointRef, optimizer bool, budget *ReplayBudget) (oldKey string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.rec
	r.rec = &recovery{point: Point{From: from, Optimizer: optimizer}, budget: budget}
	if old != nil {
		old.dropCalls()
		r.rec.epoch = old.epoch + 1
		return old.point.Key
	}
	return ""
}

// Recovers reports whether the run keeps recovery state.
func (r *Run[O]) Recovers() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec != nil
}

// RecordCall appends a state-changing call that succeeded to the replay log. When the log
// would pass perRun bytes, or the server's budget, the log is dropped and broken names the
// bound it passed (for the caller to log): a lost replica then costs the steps since the
// last checkpoint, until a snapshot is stored.
func (r *Run[O]) RecordCall(call Call, perRun int) (broken string) {
	if call.FB != nil {
		call.Bytes = proto.Size(call.FB)
	} else {
		call.Bytes = proto.Size(call.Adam) + 64
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	if rec == nil {
		return ""
	}
	if rec.broken != "" {
		rec.droppedSeq = max(rec.droppedSeq, call.Seq)
		return ""
	}
	switch {
	case rec.bytes+call.Bytes > perRun:
		rec.broken = fmt.Sprintf("its replay log passed %d bytes (max_replay_bytes_per_run) before a snapshot was stored", perRun)
	case !rec.budget.take(call.Bytes):
		rec.broken = fmt.Sprintf("the replay logs of all runs passed %d bytes (max_replay_bytes_total) before its snapshot was stored", rec.budget.Limit())
	default:
		rec.calls = append(rec.calls, call)
		rec.bytes += call.Bytes
		return ""
	}
	rec.droppedSeq = call.Seq
	rec.dropCalls()
	return rec.broken
}

// ResetRecoveryPoint makes a checkpoint the run just loaded its recovery point (the log
// starts anew). It returns the old snapshot key for the caller to delete.
func (r *Run[O]) ResetRecoveryPoint(from *CheckpointRef, optimizer bool) (oldKey string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	if rec == nil {
		return ""
	}
	oldKey = rec.point.Key
	rec.point = Point{From: from, Optimizer: optimizer}
	rec.dropCalls()
	rec.broken, rec.droppedSeq = "", 0
	rec.epoch++
	return oldKey
}

// SnapshotInFlight returns a channel closed when the run's snapshot in flight ends (nil:
// none is in flight).
func (r *Run[O]) SnapshotInFlight() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec == nil || r.rec.snap == nil {
		return nil
	}
	return r.rec.snap
}

// Snapshot is a snapshot in flight (BeginSnapshot).
type Snapshot struct {
	rec   *recovery
	done  chan struct{}
	epoch int
}

// BeginSnapshot starts a snapshot of the run's state (ok false: the run keeps no recovery
// state, one is in flight, or it was unloaded). Call EndSnapshot when it is stored or failed.
func (r *Run[O]) BeginSnapshot() (s Snapshot, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	if rec == nil || rec.snap != nil || r.unloaded != "" {
		return Snapshot{}, false
	}
	rec.snap = make(chan struct{})
	return Snapshot{rec: rec, done: rec.snap, epoch: rec.epoch}, true
}

// EndSnapshot records s's outcome: when it was stored (err nil) as key after the call at
// seq and the run has not moved on (loaded, unloaded, rebuilt) meanwhile, key becomes the
// recovery point and the calls it covers leave the log; adopted says so and oldKey is the
// point it replaced (delete it). Otherwise the caller deletes key. Call FinishSnapshot
// once that is done.
func (r *Run[O]) EndSnapshot(s Snapshot, key string, seq int64, err error) (adopted bool, oldKey string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := s.rec
	if err != nil || r.rec != rec || rec.epoch != s.epoch || r.unloaded != "" {
		return false, ""
	}
	oldKey = rec.point.Key
	rec.point = Point{Key: key}
	kept := rec.calls[:0]
	bytes := 0
	for _, call := range rec.calls {
		if call.Seq > seq {
			kept = append(kept, call)
			bytes += call.Bytes
		}
	}
	clear(rec.calls[len(kept):])
	rec.budget.give(rec.bytes - bytes)
	rec.calls, rec.bytes = kept, bytes
	if rec.broken != "" && seq >= rec.droppedSeq {
		rec.broken = ""
	}
	return true, oldKey
}

// FinishSnapshot ends s: the run may start another, and whoever waits for it goes on.
func (r *Run[O]) FinishSnapshot(s Snapshot) {
	r.mu.Lock()
	if s.rec.snap == s.done {
		s.rec.snap = nil
	}
	r.mu.Unlock()
	close(s.done)
}

// EndRecovery drops the run's recovery state (its adapter is freed) and returns the key of
// its snapshot for the caller to delete.
func (r *Run[O]) EndRecovery() (oldKey string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	r.rec = nil
	if rec == nil {
		return ""
	}
	rec.dropCalls()
	return rec.point.Key
}

// KeepForRetry decides, after task t's backend call failed as a lost replica does, whether
// a rebuild can repair it: the run keeps recovery state with a whole log, is not unloaded,
// and t ran fewer than maxAttempts times. If so t is kept to run again once the adapter is
// rebuilt (the caller then releases the run without finishing t's operation).
func (r *Run[O]) KeepForRetry(t *Task[O], maxAttempts int) bool {
	if t == nil || t.Creates || t.Attempts >= maxAttempts {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec == nil || r.rec.broken != "" || r.unloaded != "" {
		return false
	}
	t.Attempts++
	r.rec.lost = true
	r.retry = t
	r.adapterReady, r.adapterStale = false, true
	return true
}

// Lost reports whether the run's adapter must be rebuilt before its next task.
func (r *Run[O]) Lost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec != nil && r.rec.lost
}

// ErrNoRecovery: a rebuild of a run that keeps no recovery state.
var ErrNoRecovery = errors.New("the run has no recovery state")

// RebuildPlan returns what a rebuild replays: the recovery point and the calls since.
func (r *Run[O]) RebuildPlan() (Point, []Call, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec == nil {
		return Point{}, nil, ErrNoRecovery
	}
	return r.rec.point, append([]Call(nil), r.rec.calls...), nil
}

// Rebuilt records the end of a rebuild: ok, the adapter is back; otherwise the run falls
// back to a recreated, empty adapter (its recovery point is abandoned).
func (r *Run[O]) Rebuilt(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec != nil {
		r.rec.lost = false
		if !ok {
			r.rec.epoch++
		}
	}
	r.adapterReady, r.adapterStale = ok, !ok
}

// RecoveryState reports the run's recovery point, the calls in its log and why the log is
// broken ("" if whole) (tests, run health).
func (r *Run[O]) RecoveryState() (p Point, calls int, broken string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec == nil {
		return Point{}, 0, "", false
	}
	return r.rec.point, len(r.rec.calls), r.rec.broken, true
}
