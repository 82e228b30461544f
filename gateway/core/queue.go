package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/core/lane"
	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/gateway/core/trainrun"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/telemetry"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// task is one unit of ordered work on a run (package trainrun), carrying its operation. A
// task with a nil Op is a consumed seq_id (its request was rejected) and is skipped.
type task = trainrun.Task[*operation]

// run is a training run in memory: a state machine with one owner and one lock (package
// trainrun). The core resolves what a run needs from outside before calling in, and acts on
// what it returns afterwards.
type run = trainrun.Run[*operation]

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

// newRun returns a run in memory whose next seq_id is nextSeq (sequencer.Resync for a run
// recovered after a restart), on its base model's lane. It fails once the core is shutting
// down (no new lane starts then).
func (c *Core) newRun(ws string, info *loopsv1.TrainingRun, nextSeq int64, adapterReady bool, unloaded string) (*run, error) {
	return c.runWith(trainrun.Config[*operation]{Workspace: ws, Record: info, NextSeq: nextSeq, AdapterReady: adapterReady, Unloaded: unloaded})
}

// newRunCreating is newRun for a run being created: it stays in memory until its creation
// task is queued (trainrun.Config.Creating).
func (c *Core) newRunCreating(ws string, info *loopsv1.TrainingRun) (*run, error) {
	return c.runWith(trainrun.Config[*operation]{Workspace: ws, Record: info, Creating: true})
}

// runWith makes a run of cfg on its base model's lane, with the core's limits and hooks.
func (c *Core) runWith(cfg trainrun.Config[*operation]) (*run, error) {
	l, err := c.laneFor(cfg.Record.GetBaseModel())
	if err != nil {
		return nil, err
	}
	cfg.MaxPending, cfg.GapTimeout = c.opts.Limits.MaxPendingPerRun, c.opts.GapTimeout
	cfg.Ready, cfg.Draining, cfg.Log = l.MarkReady, c.draining, c.log
	return trainrun.New(cfg), nil
}

// updateRun changes the run's record and queues it for the store (write-behind,
// package writebehind: it never waits for the store; the persister takes the newest record when it
// writes, so versions keep their order).
func (c *Core) updateRun(r *run, f func(*loopsv1.TrainingRun)) {
	r.Update(f)
	c.ops.persist.RunChanged(r)
}

// submit places work of the given kind on the run at seq (0: after everything submitted so
// far). The seq_id is claimed under the run's lock; then prepare validates the request and
// builds the task with its operation without that lock (store reads, policy, the
// operation's record); then the task is recorded. A client error from prepare consumes the
// seq_id so the run does not stall on it. A repeated seq_id of the same kind returns the
// operation of its first submission; one of another kind is refused.
func (c *Core) submit(ctx context.Context, r *run, seq int64, kind loopsv1.OperationKind, prepare func(seq int64) (*task, error)) (*loopsv1.Operation, error) {
	var adm trainrun.Admitted
	for {
		var err error
		if adm, err = r.Admit(seq, kind); err != nil {
			return nil, c.admitError(r, err, kind)
		}
		if adm.Repeat {
			o, err := c.ops.lookup(ctx, r.Workspace(), adm.Op)
			if err != nil {
				return nil, err
			}
			return c.ops.current(o)
		}
		if adm.Wait == nil {
			break
		}
		select { // a retry of a seq_id whose first request is still being checked
		case <-adm.Wait:
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
	// A run on a dedicated pool holds the pool's time ahead against its budgets (poollease.go).
	err := c.holdPool(ctx, r, "")
	var t *task
	if err == nil {
		t, err = prepare(adm.Seq)
	}
	if err != nil {
		r.Abandon(adm.Seq, kind, clientError(err) || seq == 0)
		return nil, err
	}
	t.Seq = adm.Seq
	if err := r.Commit(kind, t.Op.op.GetId(), t); err != nil {
		err = c.admitError(r, err, kind)
		c.ops.finish(t.Op, nil, err)
		return nil, err
	}
	return c.ops.current(t.Op) // the work may have finished already
}

// clientError reports whether err is the client's mistake: its request's seq_id is then
// consumed rather than left free for a retry.
func clientError(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeNotFound, connect.CodeOutOfRange, connect.CodePermissionDenied:
		return true
	}
	return false
}

// admitError turns a run's refusal of a request of kind into the client's error.
func (c *Core) admitError(r *run, err error, kind loopsv1.OperationKind) error {
	var (
		unloaded *trainrun.ErrUnloaded
		reused   *sequencer.ReusedError[loopsv1.OperationKind]
		late     *sequencer.LateError
		full     *sequencer.FullError
	)
	switch {
	case errors.As(err, &unloaded):
		return failedPrecondition("%v", unloaded)
	case errors.Is(err, trainrun.ErrDraining):
		return errShuttingDown()
	case errors.As(err, &reused) && reused.First.Kind != kind:
		return invalidArgument("seq_id %d of training run %s was already used by a %s request; this %s needs a seq_id of its own (the next one)", reused.Seq, r.ID(), kindName(reused.First.Kind), kindName(kind))
	case errors.As(err, &reused):
		return invalidArgument("seq_id %d of training run %s was already used by a request that was rejected; use the next seq_id", reused.Seq, r.ID())
	case errors.As(err, &late):
		return failedPrecondition("seq_id %d of training run %s arrived after the run had moved past it (next expected seq_id is %d); requests of a run must be sent in seq_id order", late.Seq, r.ID(), late.Next)
	case errors.As(err, &full):
		return c.limitReached(errs.ReasonQueueFull, "max_pending_per_run",
			"training run %s has %d operations queued, the limit per run (max_pending_per_run): wait for some to finish, then retry (the seq_id is still free)", r.ID(), full.Limit)
	case errors.Is(err, sequencer.ErrExhausted):
		return invalidArgument("training run %s has used every seq_id up to %d: start a new run from its last checkpoint", r.ID(), sequencer.MaxSeqID)
	default: // out of range
		return invalidArgument("%v", err)
	}
}

// release ends the run's busy state after its running task finished (or its adapter
// moved): a task kept for a retry of a run unloaded meanwhile is failed, and the adapter of
// a run unloaded while busy is freed.
func (c *Core) release(r *run) {
	rel := r.Release()
	if rel.Dropped != nil {
		c.ops.finish(rel.Dropped.Op, nil, failedPrecondition("training run %s takes no more work: %s", r.ID(), rel.Reason))
	}
	if rel.Free {
		c.freeAdapter(c.ctx, r)
	}
}

// taskDone releases the run after its head task finished and unpins its adapter slot.
func (c *Core) taskDone(r *run) {
	c.release(r)
	c.slots.Unpin(r)
}

// coreRunner is the core's side of a lane (taskRunner): it runs tasks on the backend and
// finishes their operations.
type coreRunner struct{ c *Core }

// Prepare refuses t when its run's dedicated pool was stopped at a budget, marks its
// operation running and recreates a lost adapter.
func (cr coreRunner) Prepare(ctx context.Context, r *run, t *task) error {
	if err := cr.c.poolRefusal(r.ID()); err != nil {
		return err // its dedicated pool was stopped at a budget (poollease.go)
	}
	cr.c.ops.setRunning(t.Op)
	return cr.c.ensureAdapter(ctx, r, t)
}

// Fail ends t (nil: none was taken) with err and releases r.
func (cr coreRunner) Fail(r *run, t *task, err error) {
	if t != nil && t.Op != nil {
		cr.c.ops.finish(t.Op, nil, err)
	}
	cr.c.taskDone(r)
}

// Rebuild restores r's adapter after its replica was lost (recovery.go).
func (cr coreRunner) Rebuild(ctx context.Context, r *run) error { return cr.c.rebuild(ctx, r) }

// Resume releases r after its adapter moved or was rebuilt.
func (cr coreRunner) Resume(r *run) { cr.c.release(r) }

// Run executes a task that is not batched, finishes its operation and releases r.
func (cr coreRunner) Run(ctx context.Context, r *run, t *task) {
	c := cr.c
	switch t.Op.op.GetKind() {
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
		waitSnapshot(ctx, r) // it reads the weights and Adam state these change
	}
	start, began := time.Now(), c.now()
	sctx, span := startBackendSpan(ctx, t.Op)
	set, err := c.execTask(sctx, t)
	endSpan(span, err)
	c.ops.noteBackend(t.Op, began, c.now(), 0)
	if err != nil && c.lostReplica(r, t, err) {
		c.taskDone(r) // the task runs again once the adapter is rebuilt
		return
	}
	stepped := false
	if err == nil {
		switch t.Op.op.GetKind() {
		case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
			c.slots.SetGradients(r, false) // applied, or replaced by the loaded state
		}
		if t.Op.op.GetKind() == loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP {
			res := &loopsv1.Operation{}
			if set != nil {
				set(res)
			}
			c.recordStep(r, t.Seq, optimStepMetrics(t.Adam, res.GetOptimStep(), time.Since(start)))
			stepped = true
			c.afterOptimStep(r, t.Seq, t.Adam)
		}
		if s := taskReceipt(t, set); s != nil {
			c.recordReceipt(r, s)
		}
	}
	c.touch(r, t.Seq, stepped) // queued before the outcome: both go out in one journal write
	c.ops.finish(t.Op, set, err)
	c.taskDone(r)
}

// execTask runs a task's work. A panic in it (backend calls are already guarded; this
// covers the core's own part) fails the task's operation with an internal error and keeps
// the lane and the process running.
func (c *Core) execTask(ctx context.Context, t *task) (set func(*loopsv1.Operation), err error) {
	defer func() {
		if v := recover(); v != nil {
			id := errs.NewID()
			c.log.Error("operation panicked", slog.String("operation", t.Op.op.GetId()), slog.String("incident", id),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			set, err = nil, errs.Incident(id, fmt.Sprintf("the server failed unexpectedly (incident %s); the operation's effect is unknown: load the run's last checkpoint to continue", id))
		}
	}()
	return t.Exec(ctx)
}

// forwardBackward sends one batch of forward/backward items to the backend and finishes
// each item's operation with its own outcome.
func (cr coreRunner) ForwardBackward(ctx context.Context, batch []lane.Item[*operation]) []bool {
	c := cr.c
	req := &backendv1.ForwardBackwardRequest{Items: make([]*backendv1.ForwardBackwardItem, len(batch))}
	for i, it := range batch {
		req.Items[i] = pieceItem(it.Task)
	}
	bctx, endBatch := startBatchSpans(ctx, batch)
	telemetry.Observe(bctx, c.metrics.batchItems, float64(len(batch)))
	start, began := time.Now(), c.now()
	resp, err := c.backend.Trainer().ForwardBackward(bctx, req)
	elapsed, ended := time.Since(start), c.now()
	endBatch(err)
	for _, it := range batch {
		c.ops.noteBackend(it.Task.Op, began, ended, len(batch))
	}
	if err == nil && len(resp.GetResults()) != len(batch) {
		err = connect.NewError(connect.CodeInternal, errors.New("backend returned a result count that does not match the batch"))
	}
	more := make([]bool, len(batch))
	for i, it := range batch {
		r, t := it.Run, it.Task
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
		if itemErr != nil && c.lostReplica(r, t, itemErr) {
			c.taskDone(r) // the task runs again from this piece once the adapter is rebuilt
			continue
		}
		itemErr = c.adapterLost(r, itemErr)
		piece := t.Piece()
		if itemErr == nil {
			if !t.FB.GetForwardOnly() {
				c.slots.SetGradients(r, true)
				c.recordCall(r, trainrun.Call{Seq: t.Seq, FB: req.Items[i]})
			}
			c.metrics.tokens.WithLabelValues("train").Add(float64(piece.Tokens))
			info := r.Record()
			c.recordOpUsage(t.Op, r.Workspace(), info.GetBaseModel(), info.GetSessionId(), "", store.UsageTraining, int64(piece.Tokens))
			t.Partial = mergeResults(t.Partial, res, piece.Tokens)
			t.Spent += elapsed
			if t.Next++; !t.Done() {
				more[i] = true // the run stays busy; the lane runs its next piece later
				continue
			}
			res = t.Partial
			delete(res.Metrics, weightKey)
			c.ops.setService(t.Op, t.Spent)
			if !t.FB.GetForwardOnly() {
				m := fbStepMetrics(t.FB, res, t.Tokens, t.Spent)
				m.CostUsd = t.Op.costUSD()
				c.recordStep(r, t.Seq, m)
				c.recordReceipt(r, fbReceipt(t, res))
			}
		}
		c.touch(r, t.Seq, false) // queued before the outcome: both go out in one journal write
		c.ops.finish(t.Op, func(op *loopsv1.Operation) {
			op.Result = &loopsv1.Operation_ForwardBackward{ForwardBackward: res}
		}, itemErr)
		c.taskDone(r)
	}
	return more
}

// pieceItem is the backend item of task t's next piece: its datums FB.Data[From:To] (the
// whole item for a task of one piece).
func pieceItem(t *task) *backendv1.ForwardBackwardItem {
	if len(t.Chunks) == 0 {
		return t.FB
	}
	p := t.Piece()
	it := proto.CloneOf(t.FB)
	it.Data = t.FB.GetData()[p.From:p.To]
	return it
}

// mergeResults adds the result of a piece of tokens tokens to what the earlier pieces of its
// task gave (nil before the first): the datums' outputs follow each other, and each metric
// combines by its reduction (name:reduction): sum adds, max and min keep the extreme, mean
// is weighted by tokens; any other keeps the newest.
func mergeResults(acc, piece *loopsv1.ForwardBackwardResult, tokens int) *loopsv1.ForwardBackwardResult {
	if acc == nil {
		out := proto.CloneOf(piece)
		if out.Metrics == nil {
			out.Metrics = map[string]float64{}
		}
		out.Metrics[weightKey] = float64(tokens)
		return out
	}
	acc.Outputs = append(acc.Outputs, piece.GetOutputs()...)
	before, w := acc.Metrics[weightKey], float64(tokens)
	for k, v := range piece.GetMetrics() {
		old, seen := acc.Metrics[k]
		switch _, red, _ := strings.Cut(k, ":"); {
		case !seen:
			acc.Metrics[k] = v
		case red == "sum":
			acc.Metrics[k] = old + v
		case red == "max":
			acc.Metrics[k] = max(old, v)
		case red == "min":
			acc.Metrics[k] = min(old, v)
		case red == "mean":
			acc.Metrics[k] = (old*before + v*w) / (before + w)
		default:
			acc.Metrics[k] = v
		}
	}
	acc.Metrics[weightKey] = before + w
	return acc
}

// weightKey holds, while a task's pieces run, the tokens its merged means are weighted by;
// it is deleted before the result is recorded or answered.
const weightKey = "\x00tokens"

// adapterLost handles a backend error for the run: NotFound means the backend no longer has
// the run's adapter (a worker restarted), so the next request recreates it and marks the run
// corrupted (ensureAdapter). Other errors pass through.
//
// DeadlineExceeded means the backend did not answer in time (backends.WithDeadlines): the
// adapter's state is unknown and the backend may still be working on it, so it is treated
// like a lost adapter, and the next request deletes whatever the backend holds before
// recreating it.
func (c *Core) adapterLost(r *run, err error) error {
	if err != nil && connect.CodeOf(err) == connect.CodeDeadlineExceeded {
		r.SetAdapter(false, true)
		c.log.Error("a backend call on a run passed its deadline", slog.String("run", r.ID()), slog.Any("err", err))
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s; training run %s's adapter state is unknown: the next request recreates it (the run is marked corrupted), so load the run's last checkpoint (load_state) to continue", connectMessage(err), r.ID()))
	}
	if err == nil || connect.CodeOf(err) != connect.CodeNotFound {
		return err
	}
	_, stale := r.Adapter()
	r.SetAdapter(false, stale)
	c.log.Warn("the backend lost a run's adapter", slog.String("run", r.ID()), slog.Any("err", err))
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the backend lost training run %s's adapter (%s); the next request recreates it, so load the run's last checkpoint (load_state) to continue", r.ID(), connectMessage(err)))
}

// touch records that the run did work now, and counts an optimizer step when stepped.
func (c *Core) touch(r *run, seq int64, stepped bool) {
	now := timestamppb.New(c.now())
	c.updateRun(r, func(info *loopsv1.TrainingRun) {
		info.LastRequestTime = now
		info.LastSeqId = max(info.LastSeqId, seq)
		if stepped {
			info.OptimSteps++
		}
	})
}

// ensureAdapter recreates the adapter of a run recovered after a restart. Its unsaved state
// is gone, so the run is marked corrupted until a checkpoint is loaded.
func (c *Core) ensureAdapter(ctx context.Context, r *run, t *task) error {
	ready, stale := r.Adapter()
	if ready || t.Creates {
		return nil
	}
	if stale {
		// A call that passed its deadline may have left the adapter on the backend.
		if _, err := c.backend.Trainer().DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.ID()}); err != nil {
			return connect.NewError(connect.CodeUnavailable, errors.New("the run's adapter could not be reset after a backend call passed its deadline: "+connectMessage(err)))
		}
	}
	info := r.Record()
	pool := r.Pool()
	_, err := c.backend.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{
		AdapterId: r.ID(), BaseModel: info.GetBaseModel(), Lora: info.GetLora(), Pool: pool,
	})
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, errors.New("the run's adapter could not be restored after a server restart: "+err.Error()))
	}
	r.SetAdapter(true, false)
	c.updateRun(r, func(i *loopsv1.TrainingRun) {
		i.Corrupted = true
		// A dedicated pool named by a run recovered after a restart went with the backend
		// that held it: the run now trains on the shared pools.
		i.DedicatedPool = pool
	})
	c.startRecovery(r, nil, false) // from the new adapter on
	c.log.Warn("recreated a lost adapter; the run is marked corrupted until a checkpoint is loaded", slog.String("run", r.ID()))
	return c.failedOverRun(r.ID(), info, t)
}
