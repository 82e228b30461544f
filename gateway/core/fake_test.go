package core

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
)

// fakeBackend is a test-only backend: it records calls, can be held at a gate, and computes
// nothing real (the reference engine's own tests check numbers).
type fakeBackend struct {
	mu       sync.Mutex
	adapters map[string]bool
	calls    []string // adapter ids of forward/backward items, in execution order
	batches  []int    // items per ForwardBackward call
	gate     chan struct{}
	entered  chan struct{}
	// createErr, when set, fails CreateAdapter (no replica serves).
	createErr error
	// sampleHook, when set, runs at the start of every Sample.
	sampleHook func()
	// embeds makes Sample answer SampleRequest.embed with an embedding (prompt length, then
	// the prompt's first token), as an engine that computes hidden states; embedReqs keeps
	// the embedding requests it was given.
	embeds    bool
	embedReqs []*backendv1.SampleRequest
	// tiedEmbeddings is fake/model's ModelInfo.tied_embeddings.
	tiedEmbeddings bool
	// info, when set, is fake/model's ModelInfo instead.
	info *loopsv1.ModelInfo
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{adapters: map[string]bool{}}
}

func (f *fakeBackend) Trainer() backends.Trainer { return f }
func (f *fakeBackend) Sampler() backends.Sampler { return f }
func (f *fakeBackend) Close() error              { return nil }

func (f *fakeBackend) GetCapabilities(context.Context, *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	m := &loopsv1.ModelInfo{Name: "fake/model", MaxSequenceLength: 64, VocabSize: 100, MaxLoraRank: 16, TokenizerId: "/tmp/tok", TiedEmbeddings: f.tiedEmbeddings}
	if f.info != nil {
		m = proto.CloneOf(f.info)
	}
	return &backendv1.GetCapabilitiesResponse{
		Models:        []*loopsv1.ModelInfo{m},
		LossFunctions: []string{"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"},
	}, nil
}

func (f *fakeBackend) CreateAdapter(_ context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.createErr != nil {
		return nil, f.createErr
	}
	f.adapters[req.GetAdapterId()] = true
	return &backendv1.CreateAdapterResponse{}, nil
}

func (f *fakeBackend) DeleteAdapter(_ context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.adapters, req.GetAdapterId())
	return &backendv1.DeleteAdapterResponse{}, nil
}

func (f *fakeBackend) has(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.adapters[id] {
		return connect.NewError(connect.CodeNotFound, errors.New("no adapter "+id))
	}
	return nil
}

func (f *fakeBackend) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp := &backendv1.ForwardBackwardResponse{}
	f.mu.Lock()
	f.batches = append(f.batches, len(req.GetItems()))
	f.mu.Unlock()
	for _, it := range req.GetItems() {
		if err := f.has(it.GetAdapterId()); err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.calls = append(f.calls, it.GetAdapterId())
		f.mu.Unlock()
		res := &loopsv1.ForwardBackwardResult{Metrics: map[string]float64{"loss:sum": float64(len(it.GetData()))}}
		for _, d := range it.GetData() {
			lp := make([]float32, len(d.GetTokens()))
			res.Outputs = append(res.Outputs, &loopsv1.DatumOutput{Outputs: map[string]*loopsv1.Tensor{
				"logprobs": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: lp},
			}})
		}
		resp.Results = append(resp.Results, &backendv1.ForwardBackwardItemResult{Outcome: &backendv1.ForwardBackwardItemResult_Result{Result: res}})
	}
	return resp, nil
}

func (f *fakeBackend) OptimStep(_ context.Context, req *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	if err := f.has(req.GetAdapterId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.calls = append(f.calls, "optim:"+req.GetAdapterId())
	f.mu.Unlock()
	return &backendv1.OptimStepResponse{Result: &loopsv1.OptimStepResult{Metrics: map[string]float64{}}}, nil
}

func (f *fakeBackend) SaveAdapter(_ context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	if err := f.has(req.GetAdapterId()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(req.GetDir(), 0o755); err != nil {
		return nil, err
	}
	files := []string{"adapter_config.json", "adapter_model.safetensors"}
	if req.GetIncludeOptimizer() {
		files = append(files, "optimizer.safetensors")
	}
	for _, n := range files {
		if err := os.WriteFile(filepath.Join(req.GetDir(), n), []byte(req.GetAdapterId()), 0o644); err != nil {
			return nil, err
		}
	}
	return &backendv1.SaveAdapterResponse{}, nil
}

func (f *fakeBackend) LoadAdapter(_ context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	if err := f.has(req.GetAdapterId()); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(req.GetDir(), "adapter_model.safetensors")); err != nil {
		return nil, err
	}
	return &backendv1.LoadAdapterResponse{}, nil
}

func (f *fakeBackend) Sample(_ context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	if f.sampleHook != nil {
		f.sampleHook()
	}
	res := &loopsv1.SampleResult{}
	if req.GetEmbed() {
		f.mu.Lock()
		f.embedReqs = append(f.embedReqs, req)
		f.mu.Unlock()
		if f.embeds {
			res.Embedding = []float32{float32(len(req.GetPrompt())), float32(req.GetPrompt()[0])}
		}
	}
	for range req.GetNumSamples() {
		res.Sequences = append(res.Sequences, &loopsv1.SampledSequence{Tokens: []int32{1, 2}, Logprobs: []float32{-1, -1}, StopReason: loopsv1.StopReason_STOP_REASON_LENGTH})
	}
	// prompt scores: position i has log-prob -i and, with top-k, candidates i (log-prob -i)
	n := len(req.GetPrompt())
	if req.GetPromptLogprobs() {
		res.PromptLogprobs = []float32{float32(math.NaN())}
		for i := 1; i < n; i++ {
			res.PromptLogprobs = append(res.PromptLogprobs, -float32(i))
		}
	}
	if k := int(req.GetTopkPromptLogprobs()); k > 0 {
		tk := &loopsv1.TopKLogprobs{K: int32(k), Length: int32(n)}
		for i := range n * k {
			id, lp := int32(i/k), -float32(i/k)
			if i < k {
				id, lp = 0, -99999
			}
			tk.TokenIds, tk.Logprobs = append(tk.TokenIds, id), append(tk.Logprobs, lp)
		}
		res.TopkPromptLogprobs = tk
	}
	return &backendv1.SampleResponse{Result: res}, nil
}
