package core

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// TestCheckpointChangesDoNotWaitOnOtherCheckpoints: a save held inside its commit (its
// store write stalled) must not hold up changes to other checkpoints; only the same
// checkpoint waits.
func TestCheckpointChangesDoNotWaitOnOtherCheckpoints(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	runA, runB := h.newRun(), h.newRun()
	save := func(run, name string) *loopsv1.Operation {
		op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: name, Overwrite: true})
		require.NoError(t, err)
		return op
	}
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(save(runA, "a")).GetState())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(save(runB, "b")).GetState())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(save(runB, "b2")).GetState())

	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unstall := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unstall) // before the harness closes the core, even if the test fails
	var armed atomic.Bool
	armed.Store(true)
	h.core.ckFault = func(s ckStep) error {
		if s == stepSaveRecord && armed.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
		return nil
	}
	stalled := save(runA, "a")
	<-held

	done := make(chan error, 1)
	go func() {
		_, err := h.svc.Checkpoints.SetCheckpointTTL(h.ctx, &loopsv1.SetCheckpointTTLRequest{Path: "tinker://" + runB + "/weights/b", TtlSeconds: ptr(int64(3600))})
		if err == nil {
			_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: "tinker://" + runB + "/weights/b2"})
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a change to another run's checkpoint waited on a stalled save")
	}

	// The same checkpoint does wait for the stalled save.
	same := make(chan error, 1)
	go func() {
		_, err := h.svc.Checkpoints.SetCheckpointTTL(h.ctx, &loopsv1.SetCheckpointTTLRequest{Path: "tinker://" + runA + "/weights/a", TtlSeconds: ptr(int64(3600))})
		same <- err
	}()
	select {
	case err := <-same:
		t.Fatalf("a change to the checkpoint being saved did not wait for the save: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	unstall()
	require.NoError(t, <-same)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(stalled).GetState())
}
