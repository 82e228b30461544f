package core

import (
	"slices"
	"testing"
	"time"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestLightWorkspaceIsNotQueuedBehindAFlood: one workspace has eight runs' forward/backward
// work ready, another one run's; batches hold two items. Deficit round robin puts the
// light workspace's work in the first batch, not behind the eight.
func TestLightWorkspaceIsNotQueuedBehindAFlood(t *testing.T) {
	// One batch at a time and no express batch (ChunkTokens/8 = 2 tokens, below every step
	// here): the order the queue hands out work is what is checked (with two batches, the
	// flood's first starts beside the blocker before the light work arrives; with an express
	// batch of 128 tokens, the flood's 32 tokens would be small work too).
	h := newHarness(t, t.TempDir(), Options{MaxBatchTokens: 8, LaneConcurrency: 1, ChunkTokens: 16})
	heavyCtx, lightCtx := auth.WithWorkspace(t.Context(), "ws-heavy"), auth.WithWorkspace(t.Context(), "ws-light")
	create := func(ws string) string {
		saved := h.ctx
		h.ctx = auth.WithWorkspace(t.Context(), ws)
		defer func() { h.ctx = saved }()
		return h.newRun()
	}
	blocker := h.newRun() // in a third workspace, ws-a
	var heavy []string
	for range 8 {
		heavy = append(heavy, create("ws-heavy"))
	}
	light := create("ws-light")

	// Hold the lane in a batch of a third workspace while the others queue up.
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 1)
	first, err := h.fb(blocker, 0, datum(1, 2, 3, 4))
	require.NoError(t, err)
	<-h.fake.entered
	var ops []*loopsv1.Operation
	for _, run := range heavy {
		op, err := h.svc.Training.ForwardBackward(heavyCtx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 2, 3, 4)}})
		require.NoError(t, err)
		ops = append(ops, op)
	}
	op, err := h.svc.Training.ForwardBackward(lightCtx, &loopsv1.ForwardBackwardRequest{TrainingRunId: light, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 2, 3, 4)}})
	require.NoError(t, err)
	ops = append(ops, op)
	h.fake.entered = nil
	close(h.fake.gate)
	h.wait(first)
	for i, op := range ops {
		ctx := heavyCtx
		if i == len(ops)-1 {
			ctx = lightCtx
		}
		got, err := h.svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(5 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
	}
	h.fake.mu.Lock()
	calls := slices.Clone(h.fake.calls)
	h.fake.mu.Unlock()
	// calls: newRun's creations do not appear; the blocker first, then the queued work.
	pos := slices.Index(calls, light)
	require.GreaterOrEqual(t, pos, 1)
	require.LessOrEqual(t, pos, 2, "the light workspace's work ran at position %d of %v, behind the flood", pos, calls)
}
