package backends

import (
	"context"
	"errors"

	"connectrpc.com/connect"
)

// errNoMerge answers a merge on a backend without the ability.
var errNoMerge = connect.NewError(connect.CodeFailedPrecondition, errors.New("this server's backend cannot merge adapters into base weights (the reference engine can): export with --format peft"))

// MergeRequest asks a backend to fold an adapter into its base model's weights.
type MergeRequest struct {
	// BaseModel is the served base model the adapter was trained on.
	BaseModel string
	// AdapterDir is a PEFT adapter folder (adapter_config.json, adapter_model.safetensors).
	AdapterDir string
	// OutDir is an existing empty folder that receives the merged Hugging Face model.
	OutDir string
	// MaxBytes caps what is written into OutDir; a merge that would write more is refused
	// before it starts.
	MaxBytes int64
}

// Merger is the optional ability of a Sampler to export a merged model: a complete Hugging
// Face model folder (config.json, float32 safetensors, the base model's tokenizer and
// generation files) whose linear weights are W + scale·B·A for every adapted module (the
// unembedding untied from the embedding when the adapter adapts it). The adapter is
// validated against the base model as a load is; a bad one is CodeInvalidArgument. The
// reference engine has it.
type Merger interface {
	MergeAdapter(ctx context.Context, req MergeRequest) (bytes int64, err error)
}

// MergeAdapter merges through the guarded sampler when it can.
func (g guardedSampler) MergeAdapter(ctx context.Context, req MergeRequest) (int64, error) {
	m, ok := g.s.(Merger)
	if !ok {
		return 0, errNoMerge
	}
	resp, err := call(ctx, g.log, "Sampler.MergeAdapter", func(ctx context.Context, req *MergeRequest) (*int64, error) {
		n, err := m.MergeAdapter(ctx, *req)
		return &n, err
	}, &req)
	if resp == nil {
		return 0, err
	}
	return *resp, err
}

// MergeAdapter merges through the sampler when it can; a merge is bounded by its context,
// not by the sampling deadlines.
func (g deadlinedSampler) MergeAdapter(ctx context.Context, req MergeRequest) (int64, error) {
	m, ok := g.s.(Merger)
	if !ok {
		return 0, errNoMerge
	}
	return m.MergeAdapter(ctx, req)
}

// AdapterCheck is what CheckAdapter found in a valid adapter folder.
type AdapterCheck struct {
	// Rank is the adapter's r; Alpha its lora_alpha.
	Rank  int
	Alpha float64
	// Attn, MLP and Unembed say which of the model's module groups it adapts (some modules
	// of the group at least).
	Attn, MLP, Unembed bool
}

// AdapterChecker is the optional ability of a Sampler to validate an adapter folder
// against a served base model without loading it anywhere: adapter_config.json (rank within
// the backend's limit, target modules it knows) and every tensor's name and shape against the
// model. A bad folder is CodeInvalidArgument with a message that names the mismatch. The
// reference engine has it.
type AdapterChecker interface {
	CheckAdapter(ctx context.Context, baseModel, dir string) (AdapterCheck, error)
}

// errNoCheck answers a check on a backend without the ability.
var errNoCheck = connect.NewError(connect.CodeFailedPrecondition, errors.New("this server's backend cannot validate imported adapters (the reference engine can)"))

// CheckAdapter checks through the guarded sampler when it can.
func (g guardedSampler) CheckAdapter(ctx context.Context, baseModel, dir string) (AdapterCheck, error) {
	c, ok := g.s.(AdapterChecker)
	if !ok {
		return AdapterCheck{}, errNoCheck
	}
	resp, err := call(ctx, g.log, "Sampler.CheckAdapter", func(ctx context.Context, dir *string) (*AdapterCheck, error) {
		r, err := c.CheckAdapter(ctx, baseModel, *dir)
		return &r, err
	}, &dir)
	if resp == nil {
		return AdapterCheck{}, err
	}
	return *resp, err
}

// CheckAdapter checks through the sampler when it can.
func (g deadlinedSampler) CheckAdapter(ctx context.Context, baseModel, dir string) (AdapterCheck, error) {
	c, ok := g.s.(AdapterChecker)
	if !ok {
		return AdapterCheck{}, errNoCheck
	}
	return c.CheckAdapter(ctx, baseModel, dir)
}
