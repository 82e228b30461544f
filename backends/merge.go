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
