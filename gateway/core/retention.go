package core

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Checkpoint retention (docs/evals.md, "Retention"). A workspace whose policy sets
// checkpoint_keep_newest or checkpoint_keep_best keeps, per training run, the newest N
// checkpoints of each kind (training, sampler) and the N sampler checkpoints with the best
// succeeded result of the eval checkpoint_keep_best_eval; a deployed or public checkpoint is
// always kept, and so is an exported (external) one. The janitor's retention sweep marks each
// other checkpoint with retention_delete_time (now + the grace) in its stored record, and
// deletes it once that time has passed and it is still outside the kept set; a checkpoint
// kept again meanwhile has its mark cleared. The marks are in the store, so a restart
// neither forgets nor restarts a grace.

// Bounds of the retention sweep.
const (
	// retentionSweepEvery is how often the janitor sweeps (its interval when longer).
	retentionSweepEvery = time.Minute
	// retentionMaxCheckpoints bounds the checkpoints of one run the sweep considers (the
	// newest; older ones wait for the newer to go).
	retentionMaxCheckpoints = 5 * store.MaxPageLimit
	// defaultRetentionGrace is the grace when the policy gives none.
	defaultRetentionGrace = 24 * time.Hour
)

// retentionState remembers when the sweep last ran.
type retentionState struct{ last atomic.Int64 }

// maybeSweepRetention runs the retention sweep when it is due.
func (c *Core) maybeSweepRetention(ctx context.Context, now time.Time) {
	if last := c.retention.last.Load(); last != 0 && now.Sub(time.Unix(0, last)) < retentionSweepEvery {
		return
	}
	c.retention.last.Store(now.UnixNano())
	c.sweepRetention(ctx, now)
}

// sweepRetention applies every workspace's retention to its runs.
func (c *Core) sweepRetention(ctx context.Context, now time.Time) {
	runs, err := c.store.ListAllTrainingRuns(ctx)
	if err != nil {
		c.log.Error("retention: listing training runs", slog.Any("err", err))
		return
	}
	for _, r := range runs {
		lim := c.policy.Limits(r.Workspace)
		if !lim.Retains() {
			continue
		}
		if err := c.retainRun(ctx, r.Workspace, r.Run.GetId(), lim, now); err != nil {
			c.log.Error("retention: sweeping a run", slog.String("run", r.Run.GetId()), slog.Any("err", err))
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// retainRun marks, unmarks and deletes one run's checkpoints.
func (c *Core) retainRun(ctx context.Context, ws, runID string, lim policy.Limits, now time.Time) error {
	var cks []*loopsv1.Checkpoint
	page := store.Page{Limit: store.MaxPageLimit}
	for len(cks) < retentionMaxCheckpoints {
		list, _, err := c.store.ListCheckpoints(ctx, ws, runID, page)
		if err != nil {
			return err
		}
		cks = append(cks, list...)
		if len(list) < store.MaxPageLimit {
			break
		}
		page.After = store.CursorOf(list[len(list)-1])
	}
	keep := map[string]bool{}
	newest := map[loopsv1.CheckpointKind]int{}
	for _, ck := range cks { // newest first
		// Exported and published ones stay; one with a TTL goes at its TTL, and counts for
		// nothing here (ephemeral sampler saves have one).
		if k := ck.GetKind(); k == loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL || ck.GetPublic() || ck.GetExpireTime() != nil {
			keep[ck.GetId()] = true
		} else if newest[k] < lim.CheckpointKeepNewest {
			newest[k]++
			keep[ck.GetId()] = true
		}
	}
	if lim.CheckpointKeepBest > 0 {
		if err := c.keepBest(ctx, ws, runID, lim, keep); err != nil {
			return err
		}
	}
	grace := time.Duration(lim.CheckpointRetentionGraceSeconds) * time.Second
	if grace == 0 {
		grace = defaultRetentionGrace
	}
	for _, ck := range cks {
		marked := ck.GetRetentionDeleteTime() != nil
		if !keep[ck.GetId()] {
			deps, err := c.store.CheckpointDeployments(ctx, ws, runID, ck.GetId())
			if err != nil {
				return err
			}
			keep[ck.GetId()] = len(deps) > 0
		}
		switch {
		case keep[ck.GetId()] && marked:
			c.markRetention(ctx, ws, ck, nil)
		case keep[ck.GetId()]:
		case !marked:
			c.markRetention(ctx, ws, ck, timestamppb.New(now.Add(grace)))
		case !now.Before(ck.GetRetentionDeleteTime().AsTime()):
			if err := c.deleteCheckpoint(ctx, ws, runID, ck.GetId(), ck); err != nil && !isPinned(err) {
				c.log.Error("retention: deleting a checkpoint", slog.String("path", ck.GetTinkerPath()), slog.Any("err", err))
			} else if err == nil {
				c.log.Info("retention: checkpoint deleted", slog.String("workspace", ws), slog.String("path", ck.GetTinkerPath()))
			}
		}
	}
	return nil
}

// keepBest adds the run's best sampler checkpoints by the policy's eval to keep.
func (c *Core) keepBest(ctx context.Context, ws, runID string, lim policy.Limits, keep map[string]bool) error {
	e, err := c.store.GetEvalByName(ctx, ws, lim.CheckpointKeepBestEval)
	if errors.Is(err, store.ErrNotFound) {
		return nil // the workspace has no such eval (yet): no checkpoint is best
	}
	if err != nil {
		return err
	}
	results, err := c.store.ListEvalResults(ctx, ws, runID, "", e.GetId(), store.MaxEvalResultsListed)
	if err != nil {
		return err
	}
	results = slices.DeleteFunc(results, func(r *loopsv1.EvalResult) bool {
		return r.GetState() != loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED
	})
	slices.SortStableFunc(results, func(a, b *loopsv1.EvalResult) int {
		x, y := a.GetScore(), b.GetScore()
		if !e.GetHigherIsBetter() {
			x, y = -x, -y
		}
		switch {
		case x > y:
			return -1
		case x < y:
			return 1
		}
		return 0
	})
	for _, r := range results[:min(len(results), lim.CheckpointKeepBest)] {
		keep[r.GetCheckpointId()] = true
	}
	return nil
}

// markRetention sets (or, with t nil, clears) a checkpoint's retention_delete_time, under
// its lock and only if its record is still ck (a save or TTL change meanwhile wins; the
// next sweep looks again).
func (c *Core) markRetention(ctx context.Context, ws string, ck *loopsv1.Checkpoint, t *timestamppb.Timestamp) {
	defer c.ckpt.Lock(ws, ck.GetTrainingRunId(), ck.GetId())()
	cur, err := c.store.GetCheckpoint(ctx, ws, ck.GetTrainingRunId(), ck.GetId())
	if err != nil || !proto.Equal(cur, ck) {
		return
	}
	next := proto.CloneOf(cur)
	next.RetentionDeleteTime = t
	if err := c.store.PutCheckpoint(ctx, ws, next); err != nil {
		c.log.Error("retention: marking a checkpoint", slog.String("path", ck.GetTinkerPath()), slog.Any("err", err))
	}
}
