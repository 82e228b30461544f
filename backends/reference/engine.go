package reference

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/prefix"
	"github.com/loops-dev/loops/backends/reference/tokenizer"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/constrain"
	"github.com/loops-dev/loops/internal/hfcache"
	"github.com/loops-dev/loops/internal/receipt"
	"github.com/loops-dev/loops/internal/semantics"
)

// Implementation is the name the engine reports in GetCapabilities.
const Implementation = "reference"

// Options configure an Engine.
type Options struct {
	// DataDir is where the built-in model is written (DataDir/models/loops-tiny). Empty
	// means a folder under the user cache directory.
	DataDir string
	// Models to serve: "loops/tiny", local Hugging Face folders, or Hugging Face ids found
	// in the local hub cache (ResolveModelDir, internal/hfcache). Empty means just
	// "loops/tiny".
	Models []string
	// MaxLoraRank caps adapter ranks (default 64).
	MaxLoraRank int
	// MaxAdapters caps the adapters held at once (default 256).
	MaxAdapters int
	// Threads is the number of goroutines the matrix kernels use (default runtime.NumCPU()).
	Threads int
	// MaxBatchSequences caps the sequences decoded together in one step across the
	// concurrent sampling requests of one base model (default DefaultMaxBatchSequences, 64).
	MaxBatchSequences int
	// MaxBatchKVBytes caps the key/value cache the sequences decoding together on one base
	// model may grow to, counting prompt + max_tokens positions for each (default
	// DefaultMaxBatchKVBytes, 1 GiB); see batch.go.
	MaxBatchKVBytes int64
	// PrefixCacheBytes is the prefix cache's budget: the keys and values of recent prompts
	// kept for later prompts that start the same way (prefixcache.go). 0 means
	// DefaultPrefixCacheBytes (256 MiB); negative turns the cache off.
	PrefixCacheBytes int64
}

// Engine is the pure-Go CPU trainer and sampler. It implements
// backendv1connect.TrainerServiceHandler, backends.Sampler and backends.TokenStreamer.
// Calls for different adapters may run concurrently; calls for one adapter are serialised.
type Engine struct {
	opts   Options
	models map[string]*baseModel
	order  []string

	mu       sync.Mutex
	adapters map[string]*adapterState

	samplerMu    sync.Mutex
	samplerCache map[string]*cachedAdapter
	samplerOrder []string

	prefix *prefix.Cache // nil when off
}

var (
	_ backendv1connect.TrainerServiceHandler = (*Engine)(nil)
	_ backends.Sampler                       = (*Engine)(nil)
	_ backends.TokenStreamer                 = (*Engine)(nil)
)

type baseModel struct {
	name string
	dir  string
	m    *nn.Model[float32]
	tok  *tokenizer.Tokenizer // nil when the folder has no usable tokenizer.json
	eos  []int
	info *loopsv1.ModelInfo
	dec  *decoder // batches the model's sampling requests (batch.go)

	vocabOnce sync.Once
	vocab     *constrain.Vocab // vocabOf
}

type adapterState struct {
	mu   sync.Mutex
	id   string
	base *baseModel
	ad   *nn.Adapter[float32]
}

type cachedAdapter struct {
	ad  *nn.Adapter[float32]
	key string
}

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// New loads the models and returns a ready engine.
func New(opts Options) (*Engine, error) {
	if opts.MaxLoraRank <= 0 {
		opts.MaxLoraRank = 64
	}
	if opts.MaxAdapters <= 0 {
		opts.MaxAdapters = 256
	}
	if opts.Threads <= 0 {
		opts.Threads = runtime.NumCPU()
	}
	if opts.MaxBatchSequences <= 0 {
		opts.MaxBatchSequences = DefaultMaxBatchSequences
	}
	if opts.MaxBatchKVBytes <= 0 {
		opts.MaxBatchKVBytes = DefaultMaxBatchKVBytes
	}
	if opts.PrefixCacheBytes == 0 {
		opts.PrefixCacheBytes = DefaultPrefixCacheBytes
	}
	nn.SetThreads(opts.Threads)
	if opts.DataDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			d = os.TempDir()
		}
		opts.DataDir = filepath.Join(d, "loops")
	}
	if len(opts.Models) == 0 {
		opts.Models = []string{tiny.Name}
	}
	e := &Engine{opts: opts, models: map[string]*baseModel{}, adapters: map[string]*adapterState{}, samplerCache: map[string]*cachedAdapter{}}
	if opts.PrefixCacheBytes > 0 {
		e.prefix = prefix.New(opts.PrefixCacheBytes)
	}
	for _, name := range opts.Models {
		if _, dup := e.models[name]; dup {
			continue
		}
		bm, err := e.loadModel(name)
		if err != nil {
			return nil, fmt.Errorf("reference: loading model %q: %w", name, err)
		}
		bm.dec = newDecoder(bm.m, opts.MaxBatchSequences, opts.MaxBatchKVBytes)
		e.models[name] = bm
		e.order = append(e.order, name)
	}
	return e, nil
}

// Trainer returns the engine as a TrainerService handler.
func (e *Engine) Trainer() backendv1connect.TrainerServiceHandler { return e }

// Sampler returns the engine as a sampler.
func (e *Engine) Sampler() backends.Sampler { return e }

// Close frees the engine's adapters.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.adapters = map[string]*adapterState{}
	e.mu.Unlock()
	return nil
}

// ResolveModelDir finds the folder of a model name: a local folder holding config.json,
// or a Hugging Face id in the local hub cache (hfcache.Find: models--Org--Name/snapshots/<rev>/).
func ResolveModelDir(name string) (dir, tokenizerID string, err error) {
	if st, err := os.Stat(filepath.Join(name, "config.json")); err == nil && !st.IsDir() {
		abs, err := filepath.Abs(name)
		return abs, abs, err
	}
	dir, err = hfcache.Find(name, "config.json")
	if err != nil {
		return "", "", fmt.Errorf("%q is neither a folder with config.json nor a model in the local Hugging Face cache (%w); download it first, e.g. `huggingface-cli download %s`", name, err, name)
	}
	return dir, name, nil
}

func (e *Engine) loadModel(name string) (*baseModel, error) {
	var dir, tokID string
	if name == tiny.Name {
		dir = filepath.Join(e.opts.DataDir, "models", "loops-tiny")
		if err := tiny.Write(dir); err != nil {
			return nil, err
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		dir, tokID = abs, abs
		// Best effort: clients on this machine can then load the tokenizer by name offline.
		if snap, err := tiny.RegisterInHubCache(dir); err != nil {
			slog.Warn("could not register loops/tiny in the local Hugging Face cache; SamplingClient.get_tokenizer() needs it there", slog.Any("err", err))
		} else {
			slog.Debug("registered loops/tiny in the local Hugging Face cache", slog.String("dir", snap))
		}
	} else {
		var err error
		if dir, tokID, err = ResolveModelDir(name); err != nil {
			return nil, err
		}
	}
	m, err := nn.Load[float32](dir)
	if err != nil {
		return nil, err
	}
	bm := &baseModel{name: name, dir: dir, m: m}
	if tok, err := tokenizer.LoadHF(filepath.Join(dir, "tokenizer.json")); err == nil {
		bm.tok = tok
	}
	seen := map[int]bool{}
	addEOS := func(ids []int) {
		for _, id := range ids {
			if id >= 0 && id < m.Cfg.Vocab && !seen[id] {
				seen[id] = true
				bm.eos = append(bm.eos, id)
			}
		}
	}
	addEOS(m.Cfg.EOSIds())
	if b, err := os.ReadFile(filepath.Join(dir, "generation_config.json")); err == nil {
		var gc nn.Config
		if jsonUnmarshal(b, &gc) == nil {
			addEOS(gc.EOSIds())
		}
	}
	bm.info = &loopsv1.ModelInfo{
		Name: name, MaxSequenceLength: int32(m.Cfg.MaxSeq()), VocabSize: int32(m.Cfg.Vocab),
		Architecture: m.Cfg.Arch(), TokenizerId: tokID, MaxLoraRank: int32(e.opts.MaxLoraRank),
		Backend: Implementation, HiddenSize: int32(m.Cfg.Hidden), LoraTargets: nn.LoraTargets(&m.Cfg),
		Modalities:     []string{"text"}, // the engine serves text decoders only
		TiedEmbeddings: m.Cfg.Tied,
		// replica planning (internal/replicaplan): the engine holds weights and activations in float32
		ParameterCount: int64(m.ParamCount()), WeightDtype: "float32", NumLayers: int32(m.Cfg.Layers),
		IntermediateSize: int32(m.Cfg.Inter), NumAttentionHeads: int32(m.Cfg.Heads), NumKeyValueHeads: int32(m.Cfg.KVHeads),
		HeadDim: int32(m.Cfg.HeadDim), LoraParametersPerRank: int64(m.LoraParamsPerRank()), LogitsChunkElements: int64(m.LogitsChunk()),
	}
	if f, ok := nn.Families[m.Cfg.ModelType]; ok {
		bm.info.Family, bm.info.Publisher, bm.info.Renderer = f.Name, f.Publisher, f.Renderer
	}
	if name == tiny.Name {
		bm.info.Renderer = tiny.Renderer
	}
	// The files' revision, for the receipts of runs on the model (docs/receipts.md).
	if bm.info.Revision, err = receipt.DirRevision(dir); err != nil {
		return nil, err
	}
	return bm, nil
}

// LossFunctions are the losses the engine implements.
var LossFunctions = []string{"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"}

// GetCapabilities lists the served models and losses.
func (e *Engine) GetCapabilities(context.Context, *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	resp := &backendv1.GetCapabilitiesResponse{LossFunctions: append([]string(nil), LossFunctions...),
		MaxAdapters: int32(e.opts.MaxAdapters), Implementation: Implementation, SavesGradients: true}
	for _, n := range e.order {
		resp.Models = append(resp.Models, e.models[n].info)
	}
	return resp, nil
}

func (e *Engine) model(name string) (*baseModel, error) {
	bm, ok := e.models[name]
	if !ok {
		return nil, invalid("base model %q is not served by this engine; served models: %v", name, e.order)
	}
	return bm, nil
}

func (e *Engine) adapter(id string) (*adapterState, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, ok := e.adapters[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("adapter %q does not exist; create it with CreateAdapter first", id))
	}
	return a, nil
}

func (e *Engine) checkLora(lc *loopsv1.LoraConfig) (nn.LoraConfig, error) {
	if lc == nil {
		return nn.LoraConfig{}, invalid("lora config is required")
	}
	if lc.Rank == 0 {
		return nn.LoraConfig{}, connect.NewError(connect.CodeFailedPrecondition, errors.New(
			"full fine-tuning (LoRA rank 0) is not served by the reference engine, which trains LoRA adapters only: "+
				"the torch worker serves it (loops serve --backend torch); or give a LoRA rank from 1 to "+fmt.Sprint(e.opts.MaxLoraRank)))
	}
	if lc.Rank < 1 || int(lc.Rank) > e.opts.MaxLoraRank {
		return nn.LoraConfig{}, invalid("LoRA rank %d is out of range: use a rank from 1 to %d", lc.Rank, e.opts.MaxLoraRank)
	}
	if !lc.TrainAttn && !lc.TrainMlp && !lc.TrainUnembed {
		return nn.LoraConfig{}, invalid("the adapter would train nothing: set at least one of train_attn, train_mlp, train_unembed")
	}
	return nn.LoraConfig{Rank: int(lc.Rank), Seed: lc.Seed, Attn: lc.TrainAttn, MLP: lc.TrainMlp, Unembed: lc.TrainUnembed}, nil
}

// CreateAdapter creates an adapter with A drawn from the seed and B zero.
func (e *Engine) CreateAdapter(_ context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	if req.AdapterId == "" {
		return nil, invalid("adapter_id is required")
	}
	bm, err := e.model(req.BaseModel)
	if err != nil {
		return nil, err
	}
	lc, err := e.checkLora(req.Lora)
	if err != nil {
		return nil, err
	}
	ad, err := nn.NewAdapter(bm.m, lc)
	if err != nil {
		return nil, invalid("%v", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.adapters[req.AdapterId]; ok {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("adapter %q already exists; delete it first or pick another id", req.AdapterId))
	}
	if len(e.adapters) >= e.opts.MaxAdapters {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the engine already holds %d adapters (its limit); delete one first", len(e.adapters)))
	}
	e.adapters[req.AdapterId] = &adapterState{id: req.AdapterId, base: bm, ad: ad}
	return &backendv1.CreateAdapterResponse{}, nil
}

// DeleteAdapter frees an adapter; unknown ids are not an error.
func (e *Engine) DeleteAdapter(_ context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	e.mu.Lock()
	delete(e.adapters, req.AdapterId)
	e.mu.Unlock()
	return &backendv1.DeleteAdapterResponse{}, nil
}

// OptimStep applies AdamW to the adapter's accumulated gradients and zeroes them.
func (e *Engine) OptimStep(_ context.Context, req *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	a, err := e.adapter(req.AdapterId)
	if err != nil {
		return nil, err
	}
	p := req.Adam
	if p == nil {
		return nil, invalid("adam params are required")
	}
	p = semantics.AdamWithDefaults(p) // proto3 cannot tell unset from zero
	ap := nn.AdamParams{LR: p.LearningRate, Beta1: p.Beta1, Beta2: p.Beta2, Eps: p.Eps, WeightDecay: p.WeightDecay, GradClipNorm: p.GradClipNorm}
	switch {
	case !(ap.LR >= 0):
		return nil, invalid("learning_rate must be >= 0, got %g", ap.LR)
	case !(ap.Beta1 >= 0 && ap.Beta1 < 1), !(ap.Beta2 >= 0 && ap.Beta2 < 1):
		return nil, invalid("beta1 and beta2 must be in [0, 1), got %g and %g", ap.Beta1, ap.Beta2)
	case !(ap.Eps >= 0):
		return nil, invalid("eps must be >= 0, got %g", ap.Eps)
	case !(ap.WeightDecay >= 0):
		return nil, invalid("weight_decay must be >= 0, got %g", ap.WeightDecay)
	case !(ap.GradClipNorm >= 0):
		return nil, invalid("grad_clip_norm must be >= 0 (0 turns clipping off), got %g", ap.GradClipNorm)
	}
	st := a.adamStep(ap)
	return &backendv1.OptimStepResponse{Result: &loopsv1.OptimStepResult{Metrics: map[string]float64{
		"grad_norm:mean":     st.GradNorm,
		"update_norm:mean":   st.UpdateNorm,
		"learning_rate:mean": ap.LR,
	}}}, nil
}

// adamStep runs one optimizer step under the adapter's lock, released even if the step
// panics (backends.Guard turns the panic into an error, so the adapter must stay usable).
func (a *adapterState) adamStep(ap nn.AdamParams) nn.OptimStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ad.AdamStep(ap)
}

func checkDir(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return invalid("dir must be an absolute path, got %q", dir)
	}
	return nil
}

// SaveAdapter writes a PEFT adapter folder (and optimizer.safetensors and
// gradients.safetensors when asked).
func (e *Engine) SaveAdapter(_ context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	if err := checkDir(req.Dir); err != nil {
		return nil, err
	}
	a, err := e.adapter(req.AdapterId)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n, err := nn.SaveAdapter(req.Dir, a.ad, a.base.info.TokenizerId, req.IncludeOptimizer)
	if err == nil && req.IncludeGradients {
		var g int64
		g, err = nn.SaveGradients(req.Dir, a.ad)
		n += g
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("saving adapter %q: %w", req.AdapterId, err))
	}
	return &backendv1.SaveAdapterResponse{SizeBytes: n}, nil
}

// LoadAdapter replaces an adapter's weights (and optimizer state when asked) from a folder.
// Without load_optimizer the optimizer state starts fresh; without load_gradients pending
// gradients are dropped (with it they are replaced by gradients.safetensors).
// If the adapter does not exist, it is created on the base model named by the folder's
// base_model_name_or_path when that model is served.
func (e *Engine) LoadAdapter(_ context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	if err := checkDir(req.Dir); err != nil {
		return nil, err
	}
	if req.AdapterId == "" {
		return nil, invalid("adapter_id is required")
	}
	a, err := e.adapter(req.AdapterId)
	var bm *baseModel
	if err != nil {
		pc, perr := nn.ReadPEFTConfig(req.Dir)
		if errors.Is(perr, fs.ErrNotExist) {
			return nil, err
		}
		if perr != nil {
			return nil, invalid("cannot load adapter from %s: %v", req.Dir, perr)
		}
		for _, n := range e.order {
			if m := e.models[n]; pc.BaseModel == n || pc.BaseModel == m.info.TokenizerId || pc.BaseModel == m.dir {
				bm = m
			}
		}
		if bm == nil {
			return nil, err
		}
	} else {
		bm = a.base
	}
	ad, lerr := nn.LoadAdapter(req.Dir, bm.m, req.LoadOptimizer, e.opts.MaxLoraRank)
	if lerr == nil && req.LoadGradients {
		lerr = nn.LoadGradients(req.Dir, ad)
	}
	if lerr != nil {
		return nil, invalid("cannot load adapter from %s: %v", req.Dir, lerr)
	}
	if a != nil {
		a.mu.Lock()
		a.ad = ad
		a.mu.Unlock()
		return &backendv1.LoadAdapterResponse{}, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.adapters[req.AdapterId]; !ok {
		if len(e.adapters) >= e.opts.MaxAdapters {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the engine already holds %d adapters (its limit); delete one first", len(e.adapters)))
		}
		e.adapters[req.AdapterId] = &adapterState{id: req.AdapterId, base: bm, ad: ad}
	}
	return &backendv1.LoadAdapterResponse{}, nil
}
