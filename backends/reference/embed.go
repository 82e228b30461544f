package reference

import (
	"context"

	"connectrpc.com/connect"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"

	"github.com/loops-dev/loops/backends/reference/nn"
)

// embed answers SampleRequest.embed: the mean over the prompt's tokens of the model's final
// hidden state (after its final norm, before the LM head), with the adapter applied, summed
// in float64 and returned as float32. prompt has been checked against the vocabulary. The
// prompt runs in forward steps of at most nn.PrefillChunk tokens, as sampling's prefill
// does: that bounds a step's attention scores (chunk · heads · the prompt's length) however
// long the prompt, and the request is checked for cancellation between steps.
func (e *Engine) embed(ctx context.Context, bm *baseModel, req *backendv1.SampleRequest, prompt []int) (*backendv1.SampleResponse, error) {
	switch {
	case len(prompt) > bm.m.Cfg.MaxSeq():
		return nil, invalid("the input of %d tokens exceeds the model's limit of %d tokens; shorten it", len(prompt), bm.m.Cfg.MaxSeq())
	case req.NumSamples > 1 || req.NumSamples < 0 || req.Params != nil:
		return nil, invalid("embed samples nothing: leave num_samples (or set it to 1) and params unset")
	case req.PromptLogprobs || req.TopkPromptLogprobs != 0 || req.TargetPromptTokens != nil || req.PromptAltTokensK != 0:
		return nil, invalid("embed returns no prompt log-probs: leave prompt_logprobs, topk_prompt_logprobs, target_prompt_tokens and prompt_alt_tokens_k unset")
	}
	var (
		ad  *nn.Adapter[float32]
		err error
	)
	if req.AdapterDir != "" {
		if ad, _, err = e.samplerAdapter(bm, req.AdapterDir); err != nil {
			return nil, err
		}
	}
	D := bm.m.Cfg.Hidden
	sum := make([]float64, D)
	cache := bm.m.NewCache()
	for start := 0; start < len(prompt); start += nn.PrefillChunk {
		if err := ctx.Err(); err != nil {
			return nil, connect.NewError(connect.CodeCanceled, err)
		}
		toks := prompt[start:min(start+nn.PrefillChunk, len(prompt))]
		pos := make([]int, len(toks))
		caches := make([]*nn.KVCache[float32], len(toks))
		for i := range toks {
			pos[i], caches[i] = start+i, cache
		}
		h := bm.m.Step(toks, pos, caches, ad)
		for i := range toks {
			for d, v := range h[i*D : (i+1)*D] {
				sum[d] += float64(v)
			}
		}
	}
	out := make([]float32, D)
	for d, v := range sum {
		out[d] = float32(v / float64(len(prompt)))
	}
	return &backendv1.SampleResponse{Result: &loopsv1.SampleResult{Embedding: out}}, nil
}
