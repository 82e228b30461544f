package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// task is one unit of ordered work on a run. A task with a nil op is a consumed seq_id (its
// request was rejected) and is skipped. fb is set for forward/backward work, which the lane
// batches across runs; everything else runs through exec.
type task struct {
	seq    int64
	op     *operation
	fb     *backendv1.ForwardBackwardItem
	tokens int
	exec   func(ctx context.Context) (func(*loopsv1.Operation), error)
	// creates is true for the task that creates the run's adapter.
	creates bool
	// adam: an optim_step's parameters (its step metrics).
	adam *loopsv1.AdamParams
	// attempts counts the times the task was run again after a lost replica (recovery.go).
	attempts int
}

// checkSeqID range-checks a seq_id from the wire.
func checkSeqID(seq int64) error {
	if err := sequencer.Check(seq); err != nil {
		return invalidArgument("%v", err)
	}
	return nil
}

// kindName is an operation kind as clients name the call (forward_backward, optim_step, …).
func kindName(k loopsv1.OperationKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "OPERATION_KIND_"))
}

// runSequencer orders a run's tasks by seq_id (package sequencer).
type runSequencer = sequencer.Sequencer[*task, loopsv1.OperationKind]

// run is a training run in memory: its ordered queue and whether its adapter is on the backend.
type run struct {
	c    *Core
	id   string
	ws   string
	lane *lane

	mu   sync.Mutex
	info *loopsv1.TrainingRun
	seq  *runSequencer
	// busy: the run's head task is running; queued: the run is in its lane's ready list.
	busy, queued bool
	gapTimer     *time.Timer
	adapterReady bool
	unloaded     string // why the run takes no more work; "" while it does
	// freeWhenIdle: the run was unloaded while a task ran; taskDone frees the adapter.
	freeWhenIdle bool
	// adapterStale: a backend call on the adapter passed its deadline; the backend may
	// still hold (and change) it, so it is deleted before being recreated.
	adapterStale bool
	// rec is the run's step recovery state (recovery.go); nil when its model keeps none.
	rec *stepRecovery
	// retry is a task whose replica was lost: it runs again, before the run's queue, once
	// the adapter is rebuilt.
	retry *task
	// pool is the run's dedicated pool ("" for the shared pools; dedicated.go), its GPUs
	// per replica, and the replica-seconds already metered.
	pool        string
	poolGPUs    int
	poolMetered int64
}

// newRun returns a run whose next seq_id is nextSeq (sequencer.Resync for a run recovered
// after a restart).
func (c *Core) newRun(ws string, info *loopsv1.TrainingRun, nextSeq int64, adapterReady bool) *run {
	return &run{
		c: c, id: info.GetId(), ws: ws, lane: c.laneFor(info.GetBaseModel()), info: info,
		seq:          sequencer.New[*task, loopsv1.OperationKind](nextSeq, c.opts.Limits.MaxPendingPerRun),
		adapterReady: adapterReady,
	}
}

// snapshot returns the run's current record.
func (r *run) snapshot() *loopsv1.TrainingRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info
}

// update changes the run's record under its lock and queues it for the store (write-behind,
// persister.go: it never waits for the store; queued under the lock so versions keep order).
func (r *run) update(_ context.Context, f func(*loopsv1.TrainingRun)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := proto.CloneOf(r.info)
	f(next)
	r.info = next
	r.c.ops.persist.run(r.ws, next)
}

// submit places work of the given kind at seq (0: after everything submitted so far). mk
// validates the request and builds the task; a client error from mk consumes the seq_id so
// the run does not stall on it. A repeated seq_id of the same kind returns the operation of
// its first submission; one of another kind is refused.
func (r *run) submit(ctx context.Context, seq int64, kind loopsv1.OperationKind, mk func(seq int64) (*task, error)) (*loopsv1.Operation, error) {
	r.mu.Lock()
	adm, err := r.seq.Admit(seq, kind)
	if err == nil && adm.Repeat {
		r.mu.Unlock() // the first operation may have to be read from the store
		o, err := r.c.ops.lookup(ctx, r.ws, adm.Op)
		if err != nil {
			return nil, err
		}
		return o.snapshot(), nil
	}
	defer r.mu.Unlock()
	switch {
	case err != nil: // refused without using the seq_id: a retry of it is accepted
		return nil, r.seqError(err, kind)
	case r.unloaded != "":
		return nil, failedPrecondition("training run %s takes no more work: %s", r.id, r.unloaded)
	case r.c.draining():
		return nil, errShuttingDown()
	}
	t, err := mk(adm.Seq)
	if err != nil {
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeNotFound, connect.CodeOutOfRange, connect.CodePermissionDenied:
			r.seq.Reject(adm.Seq, kind)
			r.kick()
		}
		return nil, err
	}
	t.seq = adm.Seq
	r.seq.Record(adm.Seq, kind, t.op.op.GetId(), t)
	r.kick()
	return t.op.snapshot(), nil
}

// seqError turns the sequencer's refusal of a request of kind into the client's error.
func (r *run) seqError(err error, kind loopsv1.OperationKind) error {
	var (
		reused *sequencer.ReusedError[loopsv1.OperationKind]
		late   *sequencer.LateError
		full   *sequencer.FullError
	)
	switch {
	case errors.As(err, &reused) && reused.First.Kind != kind:
		return invalidArgument("seq_id %d of training run %s was already used by a %s request; this %s needs a seq_id of its own (the next one)", reused.Seq, r.id, kindName(reused.First.Kind), kindName(kind))
	case errors.As(err, &reused):
		return invalidArgument("seq_id %d of training run %s was already used by a request that was rejected; use the next seq_id", reused.Seq, r.id)
	case errors.As(err, &late):
		return failedPrecondition("seq_id %d of training run %s arrived after the run had moved past it (next expected seq_id is %d); requests of a run must be sent in seq_id order", late.Seq, r.id, late.Next)
	case errors.As(err, &full):
		return r.c.limitReached(errs.ReasonQueueFull, "max_pending_per_run",
			"training run %s has %d operations queued, the limit per run (max_pending_per_run): wait for some to finish, then retry (the seq_id is still free)", r.id, full.Limit)
	case errors.Is(err, sequencer.ErrExhausted):
		return invalidArgument("training run %s has used every seq_id up to %d: start a new run from its last checkpoint", r.id, sequencer.MaxSeqID)
	default: // out of range
		return invalidArgument("%v", err)
	}
}

// kick makes the run's head runnable if it is, or arms the gap timer when the next seq_id
// is missing. Called with r.mu held.
func (r *run) kick() {
	if r.busy || r.queued {
		return
	}
	if _, ok := r.seq.Head(); ok || r.retry != nil {
		if r.gapTimer != nil {
			r.gapTimer.Stop()
			r.gapTimer = nil
		}
		r.queued = true
		r.lane.markReady(r)
		return
	}
	if r.seq.Waiting() && r.gapTimer == nil {
		expected := r.seq.Next()
		r.gapTimer = time.AfterFunc(r.c.opts.GapTimeout, func() { r.skipGap(expected) })
	}
}

// skipGap gives up on a seq_id that never arrived and moves on to the next one that did.
func (r *run) skipGap(expected int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gapTimer = nil
	if r.busy || r.queued {
		return
	}
	if from, to, ok := r.seq.SkipGap(expected); ok {
		r.c.log.Warn("skipping seq_ids that never arrived", slog.String("run", r.id), slog.Int64("from", from), slog.Int64("to", to))
	}
	r.kick()
}

// takeHead removes the head task for execution and marks the run busy.
func (r *run) takeHead() *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queued = false
	if t := r.retry; t != nil {
		r.retry = nil
		r.busy = true
		return t
	}
	t, ok := r.seq.Take()
	if !ok {
		return nil
	}
	r.busy = true
	return t
}

// release marks the run's running task done and makes its next one ready; it reports
// whether the run was unloaded meanwhile, so its adapter is now to be freed.
func (r *run) release() (free bool) {
	r.mu.Lock()
	r.busy = false
	free, r.freeWhenIdle = r.freeWhenIdle, false
	dropped, reason := r.retry, r.unloaded
	if reason != "" {
		r.retry = nil // a task waiting to run again after a lost replica ends with the run
	} else {
		dropped = nil
	}
	r.kick()
	r.mu.Unlock()
	if dropped != nil {
		r.c.ops.finish(dropped.op, nil, failedPrecondition("training run %s takes no more work: %s", r.id, reason))
	}
	return free
}

// hold marks the run busy without taking its head (its adapter is being moved), so that
// nothing else runs it and an unload waits for the move.
func (r *run) hold() {
	r.mu.Lock()
	r.queued, r.busy = false, true
	r.mu.Unlock()
}

// unqueue records that the run left its lane's ready list without its head being taken
// (it waits for an adapter slot).
func (r *run) unqueue() {
	r.mu.Lock()
	r.queued = false
	r.mu.Unlock()
}

// taskDone releases the run after its head task finished, and frees its adapter if the
// run was unloaded while the task ran.
func (r *run) taskDone() {
	if r.release() {
		r.c.freeAdapter(r.c.ctx, r)
	}
	r.c.slots.unpin(r)
}

// coreRunner is the core's side of a lane (taskRunner): it runs tasks on the backend and
// finishes their operations.
type coreRunner struct{ c *Core }

func (cr coreRunner) prepare(ctx context.Context, r *run, t *task) error {
	cr.c.ops.setRunning(t.op)
	return cr.c.ensureAdapter(ctx, r, t)
}

func (cr coreRunner) fail(r *run, t *task, err error) {
	if t != nil {
		cr.c.ops.finish(t.op, nil, err)
	}
	r.taskDone()
}

func (cr coreRunner) rebuild(ctx context.Context, r *run) error { return cr.c.rebuild(ctx, r) }

func (cr coreRunner) resume(r *run) {
	if r.release() { // unloaded while its adapter moved
		cr.c.freeAdapter(cr.c.ctx, r)
	}
}

func (cr coreRunner) run(ctx context.Context, r *run, t *task) {
	c := cr.c
	switch t.op.op.GetKind() {
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
		r.waitSnapshot(ctx) // it reads the weights and Adam state these change
	}
	start := time.Now()
	set, err := c.execTask(ctx, t)
	if err != nil && c.lostReplica(r, t, err) {
		r.taskDone() // the task runs again once the adapter is rebuilt
		return
	}
	stepped := false
	if err == nil {
		switch t.op.op.GetKind() {
		case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
			c.slots.setGrads(r, false) // applied, or replaced by the loaded state
		}
		if t.op.op.GetKind() == loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP {
			res := &loopsv1.Operation{}
			if set != nil {
				set(res)
			}
			r.recordStep(t.seq, optimStepMetrics(t.adam, res.GetOptimStep(), time.Since(start)))
			stepped = true
			c.afterOptimStep(r, t.seq, t.adam)
		}
	}
	r.touch(ctx, t.seq, stepped) // queued before the outcome: both go out in one journal write
	c.ops.finish(t.op, set, err)
	r.taskDone()
}

// execTask runs a task's work. A panic in it (backend calls are already guarded; this
// covers the core's own part) fails the task's operation with an internal error and keeps
// the lane and the process running.
func (c *Core) execTask(ctx context.Context, t *task) (set func(*loopsv1.Operation), err error) {
	defer func() {
		if v := recover(); v != nil {
			id := errs.NewID()
			c.log.Error("operation panicked", slog.String("operation", t.op.op.GetId()), slog.String("incident", id),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			set, err = nil, errs.Incident(id, fmt.Sprintf("the server failed unexpectedly (incident %s); the operation's effect is unknown: load the run's last checkpoint to continue", id))
		}
	}()
	return t.exec(ctx)
}

// forwardBackward sends one batch of forward/backward items to the backend and finishes
// each item's operation with its own outcome.
func (cr coreRunner) forwardBackward(ctx context.Context, batch []runTask) {
	c := cr.c
	req := &backendv1.ForwardBackwardRequest{Items: make([]*backendv1.ForwardBackwardItem, len(batch))}
	tokens := 0
	for i, rt := range batch {
		req.Items[i] = rt.t.fb
		tokens += rt.t.tokens
	}
	c.metrics.batchItems.Observe(float64(len(batch)))
	start := time.Now()
	resp, err := c.backend.Trainer().ForwardBackward(ctx, req)
	elapsed := time.Since(start)
	if err == nil && len(resp.GetResults()) != len(batch) {
		err = connect.NewError(connect.CodeInternal, errors.New("backend returned a result count that does not match the batch"))
	}
	for i, rt := range batch {
		var itemErr error
		var res *loopsv1.ForwardBackwardResult
		switch {
		case err != nil:
			itemErr = err
		case resp.GetResults()[i].GetError() != nil:
			e := resp.GetResults()[i].GetError()
			itemErr = connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage()))
		default:
			res = resp.GetResults()[i].GetResult()
		}
		if itemErr != nil && c.lostReplica(rt.r, rt.t, itemErr) {
			rt.r.taskDone() // the task runs again once the adapter is rebuilt
			continue
		}
		itemErr = rt.r.adapterLost(itemErr)
		if itemErr == nil {
			if !rt.t.fb.GetForwardOnly() {
				c.slots.setGrads(rt.r, true)
				c.recordCall(rt.r, replayCall{seq: rt.t.seq, fb: rt.t.fb})
			}
			c.metrics.tokens.WithLabelValues("train").Add(float64(rt.t.tokens))
			info := rt.r.snapshot()
			c.recordUsage(rt.r.ws, info.GetBaseModel(), info.GetSessionId(), store.UsageTraining, int64(rt.t.tokens))
			if !rt.t.fb.GetForwardOnly() {
				rt.r.recordStep(rt.t.seq, fbStepMetrics(rt.t.fb, res, rt.t.tokens, elapsed))
			}
		}
		rt.r.touch(ctx, rt.t.seq, false) // queued before the outcome: both go out in one journal write
		c.ops.finish(rt.t.op, func(op *loopsv1.Operation) {
			op.Result = &loopsv1.Operation_ForwardBackward{ForwardBackward: res}
		}, itemErr)
		rt.r.taskDone()
	}
}

// adapterLost handles a backend error for the run: NotFound means the backend no longer has
// the run's adapter (a worker restarted), so the next request recreates it and marks the run
// corrupted (ensureAdapter). Other errors pass through.
//
// DeadlineExceeded means the backend did not answer in time (backends.WithDeadlines): the
// adapter's state is unknown and the backend may still be working on it, so it is treated
// like a lost adapter, and the next request deletes whatever the backend holds before
// recreating it.
func (r *run) adapterLost(err error) error {
	if err != nil && connect.CodeOf(err) == connect.CodeDeadlineExceeded {
		r.mu.Lock()
		r.adapterReady, r.adapterStale = false, true
		r.mu.Unlock()
		r.c.log.Error("a backend call on a run passed its deadline", slog.String("run", r.id), slog.Any("err", err))
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s; training run %s's adapter state is unknown: the next request recreates it (the run is marked corrupted), so load the run's last checkpoint (load_state) to continue", connectMessage(err), r.id))
	}
	if err == nil || connect.CodeOf(err) != connect.CodeNotFound {
		return err
	}
	r.mu.Lock()
	r.adapterReady = false
	r.mu.Unlock()
	r.c.log.Warn("the backend lost a run's adapter", slog.String("run", r.id), slog.Any("err", err))
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the backend lost training run %s's adapter (%s); the next request recreates it, so load the run's last checkpoint (load_state) to continue", r.id, connectMessage(err)))
}

// touch records that the run did work now, and counts an optimizer step when stepped.
func (r *run) touch(ctx context.Context, seq int64, stepped bool) {
	r.update(ctx, func(info *loopsv1.TrainingRun) {
		info.LastRequestTime = timestamppb.New(r.c.now())
		info.LastSeqId = max(info.LastSeqId, seq)
		if stepped {
			info.OptimSteps++
		}
	})
}

// ensureAdapter recreates the adapter of a run recovered after a restart. Its unsaved state
// is gone, so the run is marked corrupted until a checkpoint is loaded.
func (c *Core) ensureAdapter(ctx context.Context, r *run, t *task) error {
	r.mu.Lock()
	ready, stale := r.adapterReady, r.adapterStale
	r.mu.Unlock()
	if ready || t.creates {
		return nil
	}
	if stale {
		// A call that passed its deadline may have left the adapter on the backend.
		if _, err := c.backend.Trainer().DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.id}); err != nil {
			return connect.NewError(connect.CodeUnavailable, errors.New("the run's adapter could not be reset after a backend call passed its deadline: "+connectMessage(err)))
		}
	}
	info := r.snapshot()
	_, err := c.backend.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{
		AdapterId: r.id, BaseModel: info.GetBaseModel(), Lora: info.GetLora(), Pool: r.runPool(),
	})
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, errors.New("the run's adapter could not be restored after a server restart: "+err.Error()))
	}
	r.mu.Lock()
	r.adapterReady, r.adapterStale = true, false
	r.mu.Unlock()
	pool := r.runPool()
	r.update(ctx, func(i *loopsv1.TrainingRun) {
		i.Corrupted = true
		// A dedicated pool named by a run recovered after a restart went with the backend
		// that held it: the run now trains on the shared pools.
		i.DedicatedPool = pool
	})
	c.startRecovery(r, nil, false) // from the new adapter on
	c.log.Warn("recreated a lost adapter; the run is marked corrupted until a checkpoint is loaded", slog.String("run", r.id))
	return c.failedOverRun(r.id, info, t)
}
