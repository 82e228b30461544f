package core

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// panickyBackend is the fake backend with one method that panics on its next call.
type panickyBackend struct {
	*fakeBackend
	mu      sync.Mutex
	panicOn string
}

func (p *panickyBackend) Trainer() backends.Trainer { return p }
func (p *panickyBackend) Sampler() backends.Sampler { return p }

// trip panics if method is armed, disarming it first.
func (p *panickyBackend) trip(method string) {
	p.mu.Lock()
	armed := p.panicOn == method
	if armed {
		p.panicOn = ""
	}
	p.mu.Unlock()
	if armed {
		var m map[string]int
		m[method] = 1 // a real runtime panic: assignment to a nil map
	}
}

func (p *panickyBackend) arm(method string) {
	p.mu.Lock()
	p.panicOn = method
	p.mu.Unlock()
}

func (p *panickyBackend) CreateAdapter(ctx context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	p.trip("CreateAdapter")
	return p.fakeBackend.CreateAdapter(ctx, req)
}

func (p *panickyBackend) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	p.trip("ForwardBackward")
	return p.fakeBackend.ForwardBackward(ctx, req)
}

func (p *panickyBackend) OptimStep(ctx context.Context, req *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	p.trip("OptimStep")
	return p.fakeBackend.OptimStep(ctx, req)
}

func (p *panickyBackend) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	p.trip("SaveAdapter")
	return p.fakeBackend.SaveAdapter(ctx, req)
}

func (p *panickyBackend) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	p.trip("LoadAdapter")
	return p.fakeBackend.LoadAdapter(ctx, req)
}

func (p *panickyBackend) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	p.trip("Sample")
	return p.fakeBackend.Sample(ctx, req)
}

// TestBackendPanicFailsOnlyItsOperation checks that a panic inside any backend call fails
// that operation with an internal error and leaves the process, the lane and the run
// working: the next request on the same run succeeds.
func TestBackendPanicFailsOnlyItsOperation(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	be := &panickyBackend{fakeBackend: newFakeBackend()}
	c, err := New(t.Context(), st, be, Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{t: t, dir: dir, fake: be.fakeBackend, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	save, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "ok"})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(save).GetState())
	adam := &loopsv1.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
	sampler, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{ModelPath: "tinker://" + run + "/weights/ok"})
	require.NoError(t, err)

	submit := map[string]func() (*loopsv1.Operation, error){
		"ForwardBackward": func() (*loopsv1.Operation, error) { return h.fb(run, 0, datum(1, 2, 3)) },
		"OptimStep": func() (*loopsv1.Operation, error) {
			return h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: adam})
		},
		"SaveAdapter": func() (*loopsv1.Operation, error) {
			return h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "boom"})
		},
		"LoadAdapter": func() (*loopsv1.Operation, error) {
			return h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: "tinker://" + run + "/weights/ok"})
		},
		"Sample": func() (*loopsv1.Operation, error) {
			return h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: sampler.GetId(), Prompt: []int32{1, 2}, NumSamples: 1})
		},
		"CreateAdapter": func() (*loopsv1.Operation, error) {
			return h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
		},
	}
	for method, do := range submit {
		t.Run(method, func(t *testing.T) {
			be.arm(method)
			op, err := do()
			require.NoError(t, err)
			got := h.wait(op)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
			require.EqualValues(t, 13, got.GetError().GetCode(), "internal: %s", got.GetError().GetMessage())
			require.Contains(t, got.GetError().GetMessage(), "incident")
			require.Equal(t, loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER, got.GetError().GetCategory())
			// The same method works again, and the run's lane still takes work.
			op, err = do()
			require.NoError(t, err)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState(), h.wait(op).GetError().GetMessage())
			op, err = h.fb(run, 0, datum(4, 5))
			require.NoError(t, err)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
		})
	}
}
