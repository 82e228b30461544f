package core

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// gatedSaves is the fake backend with SaveAdapter held until release is closed.
type gatedSaves struct {
	*fakeBackend
	entered chan struct{}
	release chan struct{}
}

func (g *gatedSaves) Trainer() backends.Trainer { return g }
func (g *gatedSaves) Sampler() backends.Sampler { return g }

func (g *gatedSaves) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.fakeBackend.SaveAdapter(ctx, req)
}

// TestRunBarrierBlocksOnlyItsRun: while one run's save is held in the backend, another run
// on the same base model keeps training; the held run's later work waits for its save.
func TestRunBarrierBlocksOnlyItsRun(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	be := &gatedSaves{fakeBackend: newFakeBackend(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	c, err := New(t.Context(), st, be, Options{DataDir: dir})
	require.NoError(t, err)
	released := false
	t.Cleanup(func() {
		if !released {
			close(be.release)
		}
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{t: t, dir: dir, fake: be.fakeBackend, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	held, free := h.newRun(), h.newRun()

	save, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: held, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "s"})
	require.NoError(t, err)
	<-be.entered
	heldNext, err := h.fb(held, 0, datum(1, 2))
	require.NoError(t, err)

	// The other run's forward/backward and optimizer steps finish while the save is held.
	adam := &loopsv1.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
	for range 3 {
		fb, err := h.fb(free, 0, datum(3, 4, 5))
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(fb).GetState())
		step, err := h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: free, Adam: adam})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(step).GetState())
	}
	// The held run's own next request waits behind its save.
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: heldNext.GetId(), Timeout: durationpb.New(50 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, isDone(got), "a run's forward_backward overtook its own save")

	close(be.release)
	released = true
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(save).GetState())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(heldNext).GetState())
}

// twoSlotsGatedSaves is gatedSaves on a backend that holds two adapters, so a third run's
// admission offloads one (SaveAdapter, held).
type twoSlotsGatedSaves struct{ *gatedSaves }

func (g *twoSlotsGatedSaves) Trainer() backends.Trainer { return g }
func (g *twoSlotsGatedSaves) Sampler() backends.Sampler { return g }

func (g *twoSlotsGatedSaves) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	caps, err := g.fakeBackend.GetCapabilities(ctx, req)
	if err == nil {
		caps.MaxAdapters = 2
	}
	return caps, err
}

// TestAdapterOffloadBlocksOnlyItsRun: while one run's admission waits for another run's
// adapter to be offloaded (a backend call), a third run whose adapter is resident keeps
// training: the scheduler does not wait for slot moves.
func TestAdapterOffloadBlocksOnlyItsRun(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	be := &twoSlotsGatedSaves{&gatedSaves{fakeBackend: newFakeBackend(), entered: make(chan struct{}, 1), release: make(chan struct{})}}
	c, err := New(t.Context(), st, be, Options{DataDir: dir})
	require.NoError(t, err)
	released := false
	t.Cleanup(func() {
		if !released {
			close(be.release)
		}
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{t: t, dir: dir, fake: be.fakeBackend, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	victim, resident := h.newRun(), h.newRun() // both slots taken; victim is the least recently used

	third, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainMlp: true}})
	require.NoError(t, err)
	<-be.entered // the victim's offload is held in the backend

	for range 3 {
		fb, err := h.fb(resident, 0, datum(3, 4, 5))
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(fb).GetState(), "a resident run waited for another run's slot move")
	}
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: third.GetId(), Timeout: durationpb.New(20 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, isDone(got), "the third run was created before a slot was freed")

	close(be.release)
	released = true
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(third).GetState())
	require.NoError(t, be.has(third.GetTrainingRunId()))
	require.Error(t, be.has(victim), "the victim's adapter left the backend")
}

// twoSlotsFailingSaves holds two adapters and cannot save any (offloads fail).
type twoSlotsFailingSaves struct{ *fakeBackend }

func (g *twoSlotsFailingSaves) Trainer() backends.Trainer { return g }
func (g *twoSlotsFailingSaves) Sampler() backends.Sampler { return g }

func (g *twoSlotsFailingSaves) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	caps, err := g.fakeBackend.GetCapabilities(ctx, req)
	if err == nil {
		caps.MaxAdapters = 2
	}
	return caps, err
}

func (g *twoSlotsFailingSaves) SaveAdapter(_ context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("adapter %s is gone", req.GetAdapterId()))
}

// TestFailedOffloadDoesNotNameAnotherRun: when freeing a slot for one run fails on another
// run's adapter (maybe another workspace's), the waiting run's operation fails with a
// message about itself, never the other run's id or error.
func TestFailedOffloadDoesNotNameAnotherRun(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	be := &twoSlotsFailingSaves{newFakeBackend()}
	c, err := New(t.Context(), st, be, Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{t: t, dir: dir, fake: be.fakeBackend, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	victim := h.newRun()
	h.newRun()

	other := auth.WithWorkspace(t.Context(), "ws-b")
	op, err := h.svc.Training.CreateTrainingRun(other, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainMlp: true}})
	require.NoError(t, err)
	got, err := h.svc.Operations.WaitOperation(other, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "freeing one failed; retry")
	require.NotContains(t, got.GetError().GetMessage(), victim)
}
