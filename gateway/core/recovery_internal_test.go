package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/loops-dev/loops/gateway/core/trainrun"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func (h *harness) step(run string) {
	h.t.Helper()
	op, err := h.fb(run, 0, datum(1, 2, 3))
	require.NoError(h.t, err)
	require.Equal(h.t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	op, err = h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 1e-3}})
	require.NoError(h.t, err)
	require.Equal(h.t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
}

// recoveryOf returns a copy of the run's recovery point and log length, after its snapshot
// in flight ended.
func (h *harness) recoveryOf(run string) (trainrun.Point, int, string) {
	h.t.Helper()
	r, err := h.core.runOf("ws-a", run)
	require.NoError(h.t, err)
	waitSnapshot(h.ctx, r)
	p, n, broken, ok := r.RecoveryState()
	require.True(h.t, ok)
	return p, n, broken
}

func (h *harness) corrupted(run string) bool {
	info, err := h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(h.t, err)
	return info.GetCorrupted()
}

// TestStepSnapshotsReplaceEachOther: every optim_step leaves one snapshot in the store, the
// run's recovery point, and the log holds only the calls after it; a lost adapter is rebuilt
// (created, loaded from the snapshot, the log replayed) and the call runs again, unseen.
func TestStepSnapshotsReplaceEachOther(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{RecoverSteps: true})
	run := h.newRun()
	h.step(run)
	first, n, _ := h.recoveryOf(run)
	require.NotEmpty(t, first.Key)
	require.Zero(t, n)
	h.step(run)
	second, _, _ := h.recoveryOf(run)
	require.NotEqual(t, first.Key, second.Key)
	keys, err := h.core.ckpt.Store().List(h.ctx, "")
	require.NoError(t, err)
	require.Equal(t, []string{second.Key}, keys, "the older snapshot is deleted")

	op, err := h.fb(run, 0, datum(4, 5))
	require.NoError(t, err)
	h.wait(op)
	_, n, _ = h.recoveryOf(run)
	require.Equal(t, 1, n)
	// the replica holding the adapter is lost: the next call rebuilds it, and replays
	_, err = h.fake.DeleteAdapter(h.ctx, &backendv1.DeleteAdapterRequest{AdapterId: run})
	require.NoError(t, err)
	h.fake.mu.Lock()
	h.fake.calls = nil
	h.fake.mu.Unlock()
	op, err = h.fb(run, 0, datum(6, 7))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	h.fake.mu.Lock()
	require.Equal(t, []string{run, run}, h.fake.calls, "the replayed call, then the failed one again")
	h.fake.mu.Unlock()
	require.False(t, h.corrupted(run))

	// the run's end deletes its snapshot
	op, err = h.svc.Training.UnloadTrainingRun(h.ctx, &loopsv1.UnloadTrainingRunRequest{Id: run})
	require.NoError(t, err)
	h.wait(op)
	keys, err = h.core.ckpt.Store().List(h.ctx, "")
	require.NoError(t, err)
	require.Empty(t, keys)
}

// TestRebuildThatCannotFinishMarksTheRunCorrupted: with no replica to rebuild on within
// the recovery timeout, the call fails saying so, and the run falls back to the path without
// step recovery (recreated empty, corrupted until a checkpoint loads).
func TestRebuildThatCannotFinishMarksTheRunCorrupted(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{RecoverSteps: true, RecoveryTimeout: 600 * time.Millisecond})
	run := h.newRun()
	h.step(run)
	_, err := h.fake.DeleteAdapter(h.ctx, &backendv1.DeleteAdapterRequest{AdapterId: run})
	require.NoError(t, err)
	h.fake.mu.Lock()
	h.fake.createErr = connect.NewError(connect.CodeUnavailable, errors.New("no replica serves"))
	h.fake.mu.Unlock()
	op, err := h.fb(run, 0, datum(1, 2))
	require.NoError(t, err)
	failed := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, failed.GetState())
	require.Contains(t, failed.GetError().GetMessage(), "could not be rebuilt")
	h.fake.mu.Lock()
	h.fake.createErr = nil
	h.fake.mu.Unlock()
	op, err = h.fb(run, 0, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	require.True(t, h.corrupted(run))
}

// TestReplayLogBound: a log past Limits.MaxReplayBytesPerRun is dropped, so a loss then
// takes the path without step recovery; the next stored snapshot makes the run
// recoverable again.
func TestReplayLogBound(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{RecoverSteps: true, Limits: Limits{MaxReplayBytesPerRun: 200}})
	run := h.newRun()
	big := datum(make([]int32, 40)...)
	op, err := h.fb(run, 0, big)
	require.NoError(t, err)
	h.wait(op)
	_, n, broken := h.recoveryOf(run)
	require.Zero(t, n)
	require.Contains(t, broken, "max_replay_bytes_per_run")
	_, err = h.fake.DeleteAdapter(h.ctx, &backendv1.DeleteAdapterRequest{AdapterId: run})
	require.NoError(t, err)
	op, err = h.fb(run, 0, datum(1, 2))
	require.NoError(t, err)
	failed := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, failed.GetState())
	require.Contains(t, failed.GetError().GetMessage(), "lost training run")
	// recreated empty (corrupted); a step and its snapshot make it recoverable again
	h.step(run)
	_, _, broken = h.recoveryOf(run)
	require.Empty(t, broken)
}

// TestSweepDeletesStaleSnapshots: the store sweep deletes step snapshots that no live run
// holds (left by a gateway that died) once past the grace, and keeps live ones.
func TestSweepDeletesStaleSnapshots(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{RecoverSteps: true, CheckpointSweepGrace: time.Millisecond})
	run := h.newRun()
	h.step(run)
	live, _, _ := h.recoveryOf(run)
	stale, err := h.core.snapshotKey("ws-a", "run-gone", 3)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), []byte("x"), 0o644))
	_, err = h.core.ckpt.Store().Put(h.ctx, stale, dir)
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	h.core.sweepStore(context.Background())
	keys, err := h.core.ckpt.Store().List(h.ctx, "")
	require.NoError(t, err)
	require.Equal(t, []string{live.Key}, keys)
}

// FuzzDedicatedAsk: a run's dedicated-mode metadata never panics, and what it accepts is in
// range (1-8 replicas, 0-8 sampler replicas); anything else is an InvalidArgument.
func FuzzDedicatedAsk(f *testing.F) {
	f.Add("true", "2", "1")
	f.Add("yes", "", "")
	f.Add("maybe", "9", "-1")
	f.Add("1", "99999999999999999999", "0x3")
	f.Fuzz(func(t *testing.T, ded, replicas, samplers string) {
		meta := map[string]string{MetaDedicated: ded}
		if replicas != "" {
			meta[MetaDedicatedReplicas] = replicas
		}
		if samplers != "" {
			meta[MetaDedicatedSamplerReplicas] = samplers
		}
		ask, shape, err := dedicatedAsk(meta)
		if err != nil {
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
			return
		}
		require.True(t, shape.replicas >= 1 && shape.replicas <= maxDedicatedReplicas, "%+v", shape)
		require.True(t, shape.samplers >= 0 && shape.samplers <= maxDedicatedReplicas, "%+v", shape)
		_ = ask
	})
}
