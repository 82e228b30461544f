package core

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// TestDrainThenClose: a drain refuses new work and fails queued work with Unavailable,
// running work finishes (WaitIdle), and Close may be called twice.
func TestDrainThenClose(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{GapTimeout: time.Hour})
	run := h.newRun()
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 1)
	running, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	<-h.fake.entered
	queued, err := h.fb(run, 2, datum(1, 2))
	require.NoError(t, err)
	sampler, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
	require.NoError(t, err)

	h.core.Drain(t.Context())
	got := h.wait(queued)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "shutting down")
	_, err = h.fb(run, 3, datum(1, 2))
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	_, err = h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: sampler.GetId(), Prompt: []int32{1}})
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))

	// The running call is not cut: WaitIdle waits for it.
	short, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, h.core.WaitIdle(short), context.DeadlineExceeded)
	close(h.fake.gate)
	require.NoError(t, h.core.WaitIdle(t.Context()))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(running).GetState())
	require.NoError(t, h.core.Close())
	require.NoError(t, h.core.Close())
}
