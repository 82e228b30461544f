package core

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// hangingBackend is the fake backend whose next ForwardBackward hangs, ignoring its
// context, until release is closed (a wedged worker or engine).
type hangingBackend struct {
	*fakeBackend
	hang    atomic.Bool
	release chan struct{}
}

func (b *hangingBackend) Trainer() backends.Trainer { return b }
func (b *hangingBackend) Sampler() backends.Sampler { return b }

func (b *hangingBackend) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	if b.hang.CompareAndSwap(true, false) {
		<-b.release
	}
	return b.fakeBackend.ForwardBackward(ctx, req)
}

// TestHungBackendCallFailsAtItsDeadline: a backend call that never returns fails its
// operation at the deadline its size gives, the lane keeps working for other runs, and the
// run recovers as after a worker crash (its adapter recreated, the run marked corrupted).
func TestHungBackendCallFailsAtItsDeadline(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	be := &hangingBackend{fakeBackend: newFakeBackend(), release: make(chan struct{})}
	c, err := New(t.Context(), st, be, Options{DataDir: dir, BackendDeadlines: backends.Deadlines{Base: 100 * time.Millisecond, PerToken: time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() {
		close(be.release)
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{t: t, dir: dir, fake: be.fakeBackend, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run, other := h.newRun(), h.newRun()

	be.hang.Store(true)
	start := time.Now()
	op, err := h.fb(run, 0, datum(1, 2, 3))
	require.NoError(t, err)
	got := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "did not finish ForwardBackward within 103ms (the deadline for 3 tokens")
	require.Contains(t, got.GetError().GetMessage(), "load the run's last checkpoint")
	require.Less(t, time.Since(start), 5*time.Second)

	// The lane is free: another run trains while the hung call is still stuck.
	op, err = h.fb(other, 0, datum(4, 5))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	// The run recovers: its adapter is recreated and the run marked corrupted.
	op, err = h.fb(run, 0, datum(1, 2, 3))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState(), h.wait(op).GetError().GetMessage())
	info, err := h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.True(t, info.GetCorrupted())
}
