package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/core/trainrun"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
)

// Step recovery: losing a replica loses no step. On a base model whose replicas may be lost
// (the backend says so through backends.Preemptible, or Options.RecoverSteps), the core
// keeps, for every run, what it takes to rebuild the run's adapter exactly:
//
//   - a recovery point: the run's weights and Adam state after its last optim_step, written
//     into the checkpoint store by a snapshot that starts when the optim_step has finished
//     (its result does not wait for it) and runs beside the run's next forward_backward
//     calls, which change only gradients; the next optim_step or load waits for it. Before
//     the first snapshot the point is the run's creation (a new adapter from its LoRA seed,
//     or the checkpoint it was created from) or the checkpoint it last loaded.
//   - the replay log: the state-changing backend calls since that point (forward_backward
//     items and optim_steps), in the order they ran. A committed snapshot drops the calls
//     it covers; the log is bounded by Limits.MaxReplayBytesPerRun.
//
// When a call of the run fails as a lost replica does (Unavailable, or NotFound for the
// adapter), its operation is not failed: the task is kept, and before the run's next task
// the adapter is rebuilt on whichever replica the backend picks — deleted wherever it may
// linger, created, loaded from the recovery point, and the log replayed — and then the
// task runs again. The results the script sees are those of an uninterrupted run. A rebuild
// that cannot finish within Options.RecoveryTimeout (no replica serves) fails the task and
// the run falls back to what happens without step recovery: the adapter is recreated empty
// and the run marked corrupted until it loads a checkpoint.
//
// The recovery state lives in the gateway's memory: it covers lost workers, not a lost
// gateway (docs/two-gateways.md covers that). Snapshots left by a gateway that died are
// deleted by the store sweep.

const (
	// maxRecoveryAttempts bounds how often one task is run again after losses.
	maxRecoveryAttempts = 3
)

// recoversSteps reports whether runs on model keep step recovery.
func (c *Core) recoversSteps(model string) bool {
	if c.opts.RecoverSteps {
		return true
	}
	return c.preemptible != nil && c.preemptible.Preemptible(model)
}

// startRecovery gives a run whose adapter was just created (from a checkpoint, or new) its
// recovery state, when its base model keeps one.
func (c *Core) startRecovery(r *run, from *checkpointOf, optimizer bool) {
	// dedicated runs keep it too: their pool may be scaled to zero while idle
	if !c.recoversSteps(r.BaseModel()) && r.Pool() == "" {
		return
	}
	c.dropSnapshot(r.StartRecovery(from, optimizer, c.replay))
}

// recordCall appends a state-changing call that succeeded to the run's replay log.
func (c *Core) recordCall(r *run, call trainrun.Call) {
	if broken := r.RecordCall(call, c.opts.Limits.MaxReplayBytesPerRun); broken != "" {
		c.metrics.recovery.WithLabelValues("log_dropped").Inc()
		c.log.Warn("a run's replay log passed its bound; a lost replica now costs the steps since its last checkpoint, until a snapshot is stored",
			slog.String("run", r.ID()), slog.String("why", broken))
	}
}

// replayBytes is what the replay logs of every run hold together (tests, metrics).
func (c *Core) replayBytes() int64 { return c.replay.Used() }

// afterOptimStep records a successful optim_step and starts the snapshot of the state it
// left, without waiting for it.
func (c *Core) afterOptimStep(r *run, seq int64, adam *loopsv1.AdamParams) {
	c.recordCall(r, trainrun.Call{Seq: seq, Adam: adam})
	c.snapshot(r, seq)
}

// afterLoad makes a checkpoint the run just loaded its recovery point.
func (c *Core) afterLoad(r *run, from *checkpointOf, optimizer bool) {
	c.dropSnapshot(r.ResetRecoveryPoint(from, optimizer))
}

// waitSnapshot waits for the run's snapshot in flight, if any (before a call that changes
// the weights or the Adam state it reads).
func waitSnapshot(ctx context.Context, r *run) {
	ch := r.SnapshotInFlight()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// snapshot writes the run's weights and Adam state, as the optim_step at seq left them, into
// the checkpoint store on a goroutine of its own, and makes it the recovery point once
// stored. The run's later forward_backward calls may run meanwhile (they only add
// gradients, which a snapshot leaves out); its next optim_step or load waits (waitSnapshot).
func (c *Core) snapshot(r *run, seq int64) {
	snap, ok := r.BeginSnapshot()
	if !ok {
		return
	}
	c.running.Add()
	err := c.life.Go("step snapshot", func(ctx context.Context) {
		defer c.running.Done()
		defer r.FinishSnapshot(snap)
		start := time.Now()
		key, err := c.writeSnapshot(ctx, r, seq)
		adopted, old := r.EndSnapshot(snap, key, seq, err)
		switch {
		case err != nil:
			c.metrics.recovery.WithLabelValues("snapshot_failed").Inc()
			c.log.Warn("storing a run's step snapshot failed; its replay log keeps the calls until the next one", slog.String("run", r.ID()), slog.Any("err", err))
		case !adopted:
			c.deleteSnapshotKey(key) // the run moved on (loaded, unloaded) meanwhile
		default:
			c.liveSnapshots.Store(key, struct{}{})
			c.dropSnapshot(old)
			c.metrics.recovery.WithLabelValues("snapshot").Inc()
			c.metrics.snapshotSeconds.Observe(time.Since(start).Seconds())
		}
	})
	if err != nil { // shutting down: no snapshot; the run keeps its log
		c.running.Done()
		r.FinishSnapshot(snap)
	}
}

// snapshotKey is the store key of a snapshot of run after the call at seq, taken now.
func (c *Core) snapshotKey(ws, runID string, seq int64) (string, error) {
	return ckfiles.SnapshotKey(ws, runID, seq, c.now().UnixNano())
}

// writeSnapshot stores the run's adapter and Adam state as a new snapshot key.
func (c *Core) writeSnapshot(ctx context.Context, r *run, seq int64) (string, error) {
	key, err := c.snapshotKey(r.Workspace(), r.ID(), seq)
	if err != nil {
		return "", err
	}
	if err := c.ckpt.Inside(key); err != nil {
		return "", err
	}
	if _, err := c.putAdapter(ctx, r, key, true, func(err error) error { return err }); err != nil {
		c.deleteSnapshotKey(key) // whatever part of it was written
		return "", err
	}
	return key, nil
}

// dropSnapshot forgets a snapshot that is no longer a recovery point and deletes it.
func (c *Core) dropSnapshot(key string) {
	if key == "" {
		return
	}
	c.liveSnapshots.Delete(key)
	c.deleteSnapshotKey(key)
}

// deleteSnapshotKey deletes a snapshot from the store; a failure leaves it to the sweep.
func (c *Core) deleteSnapshotKey(key string) {
	if err := c.ckpt.Store().Delete(context.WithoutCancel(c.ctx), key); err != nil && !errors.Is(err, ckstore.ErrNotFound) {
		c.log.Warn("deleting a step snapshot; the store sweep retries", slog.String("key", key), slog.Any("err", err))
	}
}

// endRecovery drops a run's recovery state when its adapter is freed.
func (c *Core) endRecovery(r *run) { c.dropSnapshot(r.EndRecovery()) }

// retryCreate runs again the creation of a run's adapter that failed as a lost replica
// does (err), deleting whatever the failed attempt left, up to maxRecoveryAttempts times
// within Options.RecoveryTimeout.
func (c *Core) retryCreate(ctx context.Context, r *run, create func() error, err error) error {
	deadline := time.Now().Add(c.opts.RecoveryTimeout)
	backoff := 200 * time.Millisecond
	for range maxRecoveryAttempts {
		if !transientLoss(err) || c.draining() || time.Now().Add(backoff).After(deadline) {
			return err
		}
		c.log.Warn("creating a run's adapter failed as a lost replica does; trying again", slog.String("run", r.ID()), slog.Any("err", err))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff *= 2
		if _, derr := c.backend.Trainer().DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.ID()}); derr != nil && connect.CodeOf(derr) != connect.CodeNotFound {
			err = derr
			continue
		}
		if err = create(); err == nil {
			return nil
		}
	}
	return err
}

// lostReplica decides, after a backend call of run r's task t failed with err, whether the
// failure is a lost replica that a rebuild repairs. If so the task is kept to run again
// after the rebuild (the caller then releases the run without finishing the operation).
func (c *Core) lostReplica(r *run, t *task, err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeNotFound:
	default:
		return false
	}
	if c.draining() || !r.KeepForRetry(t, maxRecoveryAttempts) {
		return false
	}
	c.log.Warn("a backend call of a run failed as a lost replica does; its adapter is rebuilt from its last snapshot and the call run again",
		slog.String("run", r.ID()), slog.String("operation", t.Op.op.GetId()), slog.Int("attempt", t.Attempts), slog.Any("err", err))
	return true
}

// transientLoss reports whether a rebuild step failed because no replica serves yet.
func transientLoss(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeNotFound, connect.CodeDeadlineExceeded, connect.CodeResourceExhausted:
		return true
	}
	return false
}

// rebuild restores a lost adapter: it waits for the snapshot in flight, then rebuilds the
// adapter from the recovery point and the replay log, retrying while no replica serves, up
// to Options.RecoveryTimeout. On failure the run falls back to a corrupted run (see
// ensureAdapter) and the error fails the task that was to run again.
func (c *Core) rebuild(ctx context.Context, r *run) error {
	if err := c.poolRefusal(r.ID()); err != nil {
		// Its dedicated pool was stopped at a budget (poollease.go): the run stays lost, and
		// is rebuilt, scaling the pool up, once its work is admitted again.
		return err
	}
	waitSnapshot(ctx, r)
	start := time.Now()
	deadline := start.Add(c.opts.RecoveryTimeout)
	backoff := 200 * time.Millisecond
	for {
		if c.draining() {
			return errShuttingDown()
		}
		replayed, err := c.rebuildOnce(ctx, r)
		if err == nil {
			r.Rebuilt(true)
			c.metrics.recovery.WithLabelValues("rebuilt").Inc()
			c.metrics.replayedCalls.Add(float64(replayed))
			c.metrics.rebuildSeconds.Observe(time.Since(start).Seconds())
			c.log.Info("rebuilt a lost adapter from its recovery point", slog.String("run", r.ID()),
				slog.Int("replayed_calls", replayed), slog.Duration("took", time.Since(start)))
			return nil
		}
		if !transientLoss(err) || ctx.Err() != nil || time.Now().Add(backoff).After(deadline) {
			c.metrics.recovery.WithLabelValues("rebuild_failed").Inc()
			c.log.Error("rebuilding a lost adapter failed; the run is recreated empty and marked corrupted", slog.String("run", r.ID()), slog.Any("err", err))
			r.Rebuilt(false)
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("training run %s's adapter was lost with its replica and could not be rebuilt within %v (%s); the next request recreates it empty (the run is marked corrupted), so load the run's last checkpoint (load_state) to continue",
				r.ID(), c.opts.RecoveryTimeout, connectMessage(err)))
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// rebuildOnce deletes the run's adapter wherever it may linger, creates it, loads the
// recovery point and replays the log. It returns the calls replayed.
func (c *Core) rebuildOnce(ctx context.Context, r *run) (int, error) {
	point, calls, err := r.RebuildPlan()
	if err != nil {
		return 0, err
	}
	info := r.Record()
	t := c.backend.Trainer()
	if _, err := t.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.ID()}); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		return 0, err
	}
	if _, err := t.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: r.ID(), BaseModel: info.GetBaseModel(), Lora: info.GetLora(), Pool: r.Pool()}); err != nil {
		return 0, err
	}
	switch {
	case point.Key != "":
		if err := c.loadKey(ctx, r, point.Key, true); err != nil {
			return 0, err
		}
	case point.From != nil:
		if err := c.loadAdapter(ctx, r, point.From.Owner, point.From.Checkpoint, point.Optimizer); err != nil {
			return 0, err
		}
	}
	for i, call := range calls {
		if call.FB != nil {
			resp, err := t.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{call.FB}})
			if err == nil && len(resp.GetResults()) != 1 {
				err = connect.NewError(connect.CodeInternal, errors.New("backend returned a result count that does not match the request"))
			}
			if err == nil && resp.GetResults()[0].GetError() != nil {
				e := resp.GetResults()[0].GetError()
				err = connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage()))
			}
			if err != nil {
				return i, err
			}
			continue
		}
		if _, err := t.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: r.ID(), Adam: semantics.AdamWithDefaults(call.Adam)}); err != nil {
			return i, err
		}
	}
	return len(calls), nil
}
