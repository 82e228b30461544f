package trainrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/core/sequencer"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/lockorder"
)

// RankRun is the rank of a Run's lock in the core's lock order: the last one.
type RankRun struct{}

// Rank places Run.mu last.
func (RankRun) Rank() (int, string) { return 1000, "trainrun.Run.mu" }

// Task is one unit of ordered work on a run, carrying the caller's operation O. FB is set
// for forward/backward work, which the lane batches across runs; anything else runs through
// Exec.
type Task[O any] struct {
	Seq    int64
	Op     O
	FB     *backendv1.ForwardBackwardItem
	Tokens int
	Exec   func(ctx context.Context) (func(*loopsv1.Operation), error)
	// Creates is true for the task that creates the run's adapter.
	Creates bool
	// Adam is an optim_step's parameters (its step metrics).
	Adam *loopsv1.AdamParams
	// Attempts counts the times the task was run again after a lost replica.
	Attempts int
	// Chunks cut forward/backward work (FB's data) into pieces of at most a server-wide
	// token budget, by the request's own content only (Chunk): the lane runs one piece
	// per batch and schedules between pieces. Next is the piece that runs next, and
	// Partial the result of the pieces run so far (the core's to fill in).
	Chunks  []Chunk
	Next    int
	Partial *loopsv1.ForwardBackwardResult
	// Spent is the backend time of the pieces run so far.
	Spent time.Duration
	// BatchHash is a forward_backward's batch hash (receipt.BatchHash), and DataRecorded
	// says that its batch was kept (record_data), for the run's receipt.
	BatchHash    string
	DataRecorded bool
}

// Chunk is a piece of a forward/backward task: its data FB.Data[From:To], Tokens tokens.
type Chunk struct {
	From, To, Tokens int
}

// ChunkData cuts data into pieces of consecutive datums of at most budget tokens each (a
// datum longer than budget is a piece of its own). The boundaries depend on the data alone,
// so a task's pieces, and the bits they compute, are the same whatever else the server
// runs. tokensOf gives a datum's tokens.
func ChunkData[D any](data []D, budget int, tokensOf func(D) int) []Chunk {
	var out []Chunk
	cur := Chunk{}
	for i, d := range data {
		n := tokensOf(d)
		if cur.To > cur.From && cur.Tokens+n > budget {
			out = append(out, cur)
			cur = Chunk{From: i, To: i}
		}
		cur.To, cur.Tokens = i+1, cur.Tokens+n
	}
	if cur.To > cur.From {
		out = append(out, cur)
	}
	return out
}

// Piece is the chunk of t that runs next (the whole task for a task without chunks).
func (t *Task[O]) Piece() Chunk {
	if len(t.Chunks) == 0 {
		return Chunk{To: len(t.FB.GetData()), Tokens: t.Tokens}
	}
	return t.Chunks[t.Next]
}

// Done reports whether every chunk of t has run.
func (t *Task[O]) Done() bool { return t.Next >= max(len(t.Chunks), 1) }

// Config makes a Run.
type Config[O any] struct {
	// Workspace owns the run.
	Workspace string
	// Record is the run's record (its id, base model and LoRA config never change).
	Record *loopsv1.TrainingRun
	// NextSeq is the seq_id that runs next (sequencer.Resync for a run recovered after a
	// restart, or reloaded from the store).
	NextSeq int64
	// MaxPending caps the tasks queued (and seq_ids claimed) on the run.
	MaxPending int
	// AdapterReady: the backend holds the run's adapter.
	AdapterReady bool
	// Unloaded is why the run takes no more work ("" while it does).
	Unloaded string
	// Creating: the run is being created and its creation task is not queued yet (the
	// creation records it in the store first). It does not leave memory until that task is
	// committed or the run fails: left, the task would create the adapter for a run nobody
	// holds, and the run reloaded from the store would find its adapter already there.
	Creating bool
	// GapTimeout is how long the run waits for a missing seq_id before skipping it.
	GapTimeout time.Duration
	// Ready puts the run in its lane's ready list. The run calls it after releasing its
	// lock, whenever its head became runnable.
	Ready func(*Run[O])
	// Draining reports a shutdown (an atomic read: it is called under the lock). Work is
	// refused once it reports true.
	Draining func() bool
	// Log receives the run's own reports (gaps skipped).
	Log *slog.Logger
}

// Run is a training run in memory. Its methods are safe for concurrent use.
type Run[O any] struct {
	id, ws, model string
	ready         func(*Run[O])
	draining      func() bool
	gapTimeout    time.Duration
	log           *slog.Logger

	mu     lockorder.Mutex[RankRun]
	record *loopsv1.TrainingRun
	// dirty: the record changed since the persister last took it (TakeRecord).
	dirty  bool
	seq    *sequencer.Sequencer[*Task[O], loopsv1.OperationKind]
	claims map[int64]chan struct{} // seq_id -> closed when its claim ends
	// queued: in the lane's ready list; busy: the head task runs or the adapter moves.
	queued, busy bool
	gapTimer     *time.Timer
	adapterReady bool
	// adapterStale: a backend call on the adapter passed its deadline or its replica was
	// lost; the backend may still hold it, so it is deleted before being recreated.
	adapterStale bool
	unloaded     string
	// freeWhenIdle: the run was unloaded while a task ran; Release then says to free it.
	freeWhenIdle bool
	// creating: its creation task is not committed yet (Config.Creating).
	creating bool
	// retry is a task whose replica was lost: it runs again, before the run's queue, once
	// the adapter is rebuilt.
	retry *Task[O]
	rec   *recovery
	pool  pool
}

// New returns a run in the Idle state (Unloaded if cfg.Unloaded is set).
func New[O any](cfg Config[O]) *Run[O] {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	draining := cfg.Draining
	if draining == nil {
		draining = func() bool { return false }
	}
	return &Run[O]{
		id: cfg.Record.GetId(), ws: cfg.Workspace, model: cfg.Record.GetBaseModel(),
		ready: cfg.Ready, draining: draining, gapTimeout: cfg.GapTimeout, log: log,
		record:       cfg.Record,
		seq:          sequencer.New[*Task[O], loopsv1.OperationKind](cfg.NextSeq, cfg.MaxPending),
		claims:       map[int64]chan struct{}{},
		adapterReady: cfg.AdapterReady,
		creating:     cfg.Creating,
		unloaded:     cfg.Unloaded,
	}
}

// ID is the run's id.
func (r *Run[O]) ID() string { return r.id }

// Workspace is the workspace that owns the run.
func (r *Run[O]) Workspace() string { return r.ws }

// BaseModel is the run's base model.
func (r *Run[O]) BaseModel() string { return r.model }

// Phase names a run's state (see the package doc).
type Phase string

// The phases of a run.
const (
	PhaseIdle       Phase = "idle"
	PhaseReady      Phase = "ready"
	PhaseBusy       Phase = "busy"
	PhaseRecovering Phase = "recovering"
	PhaseUnloaded   Phase = "unloaded"
)

// Phase reports the run's state.
func (r *Run[O]) Phase() Phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.busy && r.rec != nil && r.rec.lost:
		return PhaseRecovering
	case r.busy:
		return PhaseBusy
	case r.unloaded != "":
		return PhaseUnloaded
	case r.queued:
		return PhaseReady
	}
	return PhaseIdle
}

// Record returns the run's current record (shared: do not modify it).
func (r *Run[O]) Record() *loopsv1.TrainingRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.record
}

// Update changes the run's record (f edits a copy) and marks it for the store: the caller
// then tells the persister, which takes the newest record (TakeRecord) when it writes.
func (r *Run[O]) Update(f func(*loopsv1.TrainingRun)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := proto.CloneOf(r.record)
	f(next)
	r.record = next
	r.dirty = true
}

// TakeRecord returns the run's newest record for the store; changed is false when it did
// not change since the last TakeRecord.
func (r *Run[O]) TakeRecord() (rec *loopsv1.TrainingRun, changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed, r.dirty = r.dirty, false
	return r.record, changed
}

// ErrUnloaded is returned by Admit and Commit once the run takes no more work.
type ErrUnloaded struct {
	ID, Reason string
}

func (e *ErrUnloaded) Error() string {
	return fmt.Sprintf("training run %s takes no more work: %s", e.ID, e.Reason)
}

// ErrDraining is returned by Admit and Commit once the server is shutting down.
var ErrDraining = errors.New("the server is shutting down")

// Admitted is what Admit decided for a request.
type Admitted struct {
	// Seq is the seq_id the request claimed (the next one when it sent 0).
	Seq int64
	// Repeat: the request repeats one already recorded, whose operation is Op: answer
	// with it.
	Repeat bool
	Op     string
	// Wait, when not nil: another request holds the seq_id's claim; wait for it to end,
	// then admit again.
	Wait <-chan struct{}
}

// Admit decides whether a request of kind at seq (0: the next one) may go on and, if so,
// claims its seq_id: call Commit or Abandon for it. Errors are the sequencer's (the seq_id
// is left unused), *ErrUnloaded or ErrDraining.
func (r *Run[O]) Admit(seq int64, kind loopsv1.OperationKind) (Admitted, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	adm, err := r.seq.Admit(seq, kind)
	switch {
	case err != nil:
		return Admitted{}, err
	case adm.Repeat:
		return Admitted{Seq: adm.Seq, Repeat: true, Op: adm.Op}, nil
	case adm.Claimed:
		return Admitted{Seq: adm.Seq, Wait: r.claims[adm.Seq]}, nil
	case r.unloaded != "":
		return Admitted{}, &ErrUnloaded{ID: r.id, Reason: r.unloaded}
	case r.draining():
		return Admitted{}, ErrDraining
	}
	r.seq.Claim(adm.Seq, kind)
	r.claims[adm.Seq] = make(chan struct{})
	return Admitted{Seq: adm.Seq}, nil
}

// endClaimLocked ends seq's claim: its waiters admit again.
func (r *Run[O]) endClaimLocked(seq int64) {
	if ch, ok := r.claims[seq]; ok {
		close(ch)
		delete(r.claims, seq)
	}
}

// Commit records the task t of operation op for its claimed seq_id. If the run was unloaded
// or the server started draining meanwhile, the seq_id is consumed instead and the error
// says why: the caller fails the operation it made.
func (r *Run[O]) Commit(kind loopsv1.OperationKind, op string, t *Task[O]) error {
	r.mu.Lock()
	r.endClaimLocked(t.Seq)
	var err error
	switch {
	case r.unloaded != "":
		err = &ErrUnloaded{ID: r.id, Reason: r.unloaded}
	case r.draining():
		err = ErrDraining
	}
	if err != nil {
		r.seq.Reject(t.Seq, kind)
	} else {
		r.seq.Record(t.Seq, kind, op, t)
	}
	if t.Creates {
		r.creating = false
	}
	wake := r.kickLocked()
	r.mu.Unlock()
	r.wake(wake)
	return err
}

// Abandon ends a claim whose request failed before it was recorded: consume marks the
// seq_id used (the client's input was wrong, so a retry of it is refused and the run does
// not wait for it), otherwise it is given back and a retry of it is accepted.
func (r *Run[O]) Abandon(seq int64, kind loopsv1.OperationKind, consume bool) {
	r.mu.Lock()
	r.endClaimLocked(seq)
	if consume {
		r.seq.Reject(seq, kind)
	} else {
		r.seq.Unclaim(seq)
	}
	wake := r.kickLocked()
	r.mu.Unlock()
	r.wake(wake)
}

// kickLocked puts the run in its lane's ready list if its head can run (the caller calls
// wake with the answer once it released the lock), or arms the gap timer when the next
// seq_id is missing.
func (r *Run[O]) kickLocked() bool {
	if r.busy || r.queued {
		return false
	}
	if _, ok := r.seq.Head(); ok || r.retry != nil {
		if r.gapTimer != nil {
			r.gapTimer.Stop()
			r.gapTimer = nil
		}
		r.queued = true
		return true
	}
	if r.seq.Waiting() && r.gapTimer == nil && r.gapTimeout > 0 {
		expected := r.seq.Next()
		r.gapTimer = time.AfterFunc(r.gapTimeout, func() { r.skipGap(expected) })
	}
	return false
}

// wake calls the lane's Ready when kickLocked said so; never with the lock held.
func (r *Run[O]) wake(ready bool) {
	if ready && r.ready != nil {
		r.ready(r)
	}
}

// Wake makes the run ready if its head can run (a slot freed for a parked run).
func (r *Run[O]) Wake() {
	r.mu.Lock()
	wake := r.kickLocked()
	r.mu.Unlock()
	r.wake(wake)
}

// Cancel takes the queued task at seq out of the run's order before it runs (its seq_id is
// consumed, so the run goes on with the next one) and returns it; nil when the task is not
// queued any more (it runs, ran, or was never queued). The caller ends its operation.
func (r *Run[O]) Cancel(seq int64) *Task[O] {
	r.mu.Lock()
	t, ok := r.seq.Cancel(seq)
	if !ok {
		r.mu.Unlock()
		return nil
	}
	wake := r.kickLocked() // its successor may be the head now
	r.mu.Unlock()
	r.wake(wake)
	return t
}

// skipGap gives up on a seq_id that never arrived and moves on to the next one that did.
func (r *Run[O]) skipGap(expected int64) {
	r.mu.Lock()
	r.gapTimer = nil
	if r.busy || r.queued {
		r.mu.Unlock()
		return
	}
	from, to, skipped := r.seq.SkipGap(expected)
	wake := r.kickLocked()
	r.mu.Unlock()
	if skipped {
		r.log.Warn("skipping seq_ids that never arrived", slog.String("run", r.id), slog.Int64("from", from), slog.Int64("to", to))
	}
	r.wake(wake)
}

// Head describes a ready run's head task without taking it.
type Head struct {
	FB     bool // forward/backward work
	Tokens int
}

// PeekHead returns the run's head task's kind and size (the run is in its lane's ready
// list, so nothing else takes its head meanwhile).
func (r *Run[O]) PeekHead() Head {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.retry
	if t == nil {
		var ok bool
		if t, ok = r.seq.Head(); !ok {
			return Head{}
		}
	}
	if t.FB == nil {
		return Head{}
	}
	return Head{FB: true, Tokens: t.Piece().Tokens}
}

// TakeHead removes the head task for execution (a task kept for a retry first) and marks
// the run busy; nil when there is none (the run is then busy until Release).
func (r *Run[O]) TakeHead() *Task[O] {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queued = false
	r.busy = true
	if t := r.retry; t != nil {
		r.retry = nil
		return t
	}
	t, ok := r.seq.Take()
	if !ok {
		return nil
	}
	return t
}

// Hold marks the run busy without taking its head (its adapter is being moved or rebuilt),
// so that nothing else runs it and an unload waits for the move.
func (r *Run[O]) Hold() {
	r.mu.Lock()
	r.queued, r.busy = false, true
	r.mu.Unlock()
}

// Unqueue records that the run left its lane's ready list without its head being taken
// (it waits for an adapter slot).
func (r *Run[O]) Unqueue() {
	r.mu.Lock()
	r.queued = false
	r.mu.Unlock()
}

// Released is what the caller must do after Release.
type Released[O any] struct {
	// Free: the run was unloaded while it was busy: free its adapter now.
	Free bool
	// Dropped is a task kept for a retry that ends with the run (unloaded meanwhile): fail
	// its operation with Reason.
	Dropped *Task[O]
	Reason  string
}

// Release ends the busy state after the running task finished (or the adapter moved) and
// makes the run's next task ready.
func (r *Run[O]) Release() Released[O] {
	r.mu.Lock()
	r.busy = false
	out := Released[O]{Free: r.freeWhenIdle, Reason: r.unloaded}
	r.freeWhenIdle = false
	if r.unloaded != "" && r.retry != nil {
		out.Dropped, r.retry = r.retry, nil
	}
	wake := r.kickLocked()
	r.mu.Unlock()
	r.wake(wake)
	return out
}

// Adapter reports whether the backend holds the run's adapter, and whether a stale one may
// linger there (delete it before creating it again).
func (r *Run[O]) Adapter() (ready, stale bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adapterReady, r.adapterStale
}

// SetAdapter records the adapter's state on the backend.
func (r *Run[O]) SetAdapter(ready, stale bool) {
	r.mu.Lock()
	r.adapterReady, r.adapterStale = ready, stale
	r.mu.Unlock()
}

// Unloaded is why the run takes no more work ("" while it does).
func (r *Run[O]) Unloaded() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unloaded
}

// Unloading is what the caller must do after Unload or Fail.
type Unloading[O any] struct {
	// First: this call unloaded the run (false: it already was; nothing to do).
	First bool
	// Queued are the tasks that were waiting: fail their operations.
	Queued []*Task[O]
	// FreeNow: free the adapter now (the run is not busy, or the unload is its own running
	// task); otherwise Release says when.
	FreeNow bool
}

// Unload makes the run refuse work with reason and takes its queued work. ownTask is true
// when the unload is the run's running task.
func (r *Run[O]) Unload(reason string, ownTask bool) Unloading[O] {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unloaded != "" {
		return Unloading[O]{}
	}
	r.unloaded = reason
	out := Unloading[O]{First: true, Queued: r.seq.Drain()}
	if r.retry != nil && !r.busy { // a busy (rebuilding) run ends its retry when released
		out.Queued = append([]*Task[O]{r.retry}, out.Queued...)
		r.retry = nil
	}
	later := r.busy && !ownTask
	r.freeWhenIdle = later
	out.FreeNow = !later
	r.stopGapLocked()
	return out
}

// Fail makes a run whose creation failed refuse work with reason, and takes its queued
// work (its adapter was never made, so there is nothing to free).
func (r *Run[O]) Fail(reason string) []*Task[O] {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.creating = false
	if r.unloaded != "" {
		return nil
	}
	r.unloaded = reason
	r.stopGapLocked()
	return r.seq.Drain()
}

// DrainQueue takes the run's queued work, and its task kept for a retry unless a rebuild
// runs (a shutdown fails them).
func (r *Run[O]) DrainQueue() []*Task[O] {
	r.mu.Lock()
	defer r.mu.Unlock()
	queued := r.seq.Drain()
	if r.retry != nil && !r.busy {
		queued = append(queued, r.retry)
		r.retry = nil
	}
	r.stopGapLocked()
	return queued
}

func (r *Run[O]) stopGapLocked() {
	if r.gapTimer != nil {
		r.gapTimer.Stop()
		r.gapTimer = nil
	}
}

// Evictable reports whether the run may leave memory after idle without a request: it
// holds no adapter, nothing of it is queued, claimed or running, and idle passed its TTL
// (unloadedTTL for an unloaded run, liveTTL for one that still takes work).
func (r *Run[O]) Evictable(idle, unloadedTTL, liveTTL time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.creating || r.busy || r.queued || r.seq.Len() > 0 || r.gapTimer != nil || r.freeWhenIdle || r.adapterStale || r.retry != nil {
		return false
	}
	if r.unloaded != "" {
		return idle >= unloadedTTL
	}
	return !r.adapterReady && idle >= liveTTL
}

// Ahead is how many of the run's tasks are before the one at seq: queued or claimed ones,
// and the running one.
func (r *Run[O]) Ahead(seq int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.seq.Ahead(seq)
	if r.busy {
		n++
	}
	return n
}

// Pending is how many tasks are queued or claimed on the run (tests, metrics).
func (r *Run[O]) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq.Len()
}

// SeenLen is the size of the run's seq_id de-duplication table (tests).
func (r *Run[O]) SeenLen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq.SeenLen()
}
