package validate

import (
	"math"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/core/apierr"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/constrain"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/vision"
)

// Sample checks a sampling request against the model and maxSamples (the server's cap on
// num_samples, Options.MaxSamplesPerRequest) and returns its sampling parameters with the
// defaults filled in: temperature 1 and top_p 1 when none are given, and max_tokens
// semantics.DefaultMaxTokens, capped by the room the model's sequence length leaves.
func Sample(model *loopsv1.ModelInfo, req *loopsv1.SampleRequest, maxSamples int) (*loopsv1.SamplingParams, error) {
	n := len(req.GetPrompt())
	if n == 0 {
		return nil, apierr.InvalidArgument("prompt is empty: give at least one token")
	}
	if err := TokenIDs(model, req.GetPrompt(), "prompt"); err != nil {
		return nil, apierr.InvalidArgument("%v", err)
	}
	if _, err := vision.Check(model, req.GetPromptImages(), req.GetPrompt(), 0); err != nil {
		return nil, apierr.InvalidArgument("prompt: %v", err)
	}
	if req.GetEmbed() && len(req.GetPromptImages()) > 0 {
		return nil, apierr.InvalidArgument("an embedding takes a text prompt: send encoded_text chunks only")
	}
	if req.GetEmbed() { // empty params: an embedding samples nothing
		return &loopsv1.SamplingParams{}, embedding(model, req)
	}
	if ns := req.GetNumSamples(); ns < 0 || ns > int32(maxSamples) {
		return nil, apierr.InvalidArgument("num_samples %d is out of range [1, %d]", ns, maxSamples)
	}
	if k := req.GetTopkPromptLogprobs(); k < 0 || k > semantics.MaxTopKPromptLogprobs {
		return nil, apierr.InvalidArgument("topk_prompt_logprobs %d is out of range [0, %d]", k, semantics.MaxTopKPromptLogprobs)
	}
	if k := req.GetParams().GetTopLogprobs(); k < 0 || k > semantics.MaxTopLogprobs {
		return nil, apierr.InvalidArgument("top_logprobs %d is out of range [0, %d]", k, semantics.MaxTopLogprobs)
	}
	if err := promptExtras(model, req); err != nil {
		return nil, err
	}
	p := proto.CloneOf(req.GetParams())
	if p == nil {
		p = &loopsv1.SamplingParams{Temperature: 1, TopP: 1}
	}
	limit := int(model.GetMaxSequenceLength())
	if limit > 0 && n > limit {
		return nil, apierr.InvalidArgument("prompt of %d tokens is over %s's limit of %d", n, model.GetName(), limit)
	}
	switch {
	case p.GetMaxTokens() < 0:
		return nil, apierr.InvalidArgument("max_tokens must not be negative, got %d", p.GetMaxTokens())
	case p.GetMaxTokens() == 0:
		p.MaxTokens = semantics.DefaultMaxTokens
		if limit > 0 {
			p.MaxTokens = int32(min(semantics.DefaultMaxTokens, limit-n))
		}
	case limit > 0 && n+int(p.GetMaxTokens()) > limit:
		return nil, apierr.InvalidArgument("prompt (%d tokens) + max_tokens (%d) is over %s's limit of %d tokens: lower max_tokens", n, p.GetMaxTokens(), model.GetName(), limit)
	}
	t := float64(p.GetTemperature())
	if math.IsNaN(t) || t < 0 {
		return nil, apierr.InvalidArgument("temperature must be >= 0, got %v", p.GetTemperature())
	}
	if tp := float64(p.GetTopP()); math.IsNaN(tp) || tp < 0 || tp > 1 {
		return nil, apierr.InvalidArgument("top_p must be in (0, 1], got %v", p.GetTopP())
	} else if tp == 0 {
		p.TopP = 1
	}
	if err := TokenIDs(model, p.GetStopTokens(), "stop"); err != nil {
		return nil, apierr.InvalidArgument("%v", err)
	}
	for _, s := range p.GetStopStrings() {
		if s == "" {
			return nil, apierr.InvalidArgument("stop strings must not be empty")
		}
	}
	if err := semantics.CheckAdjustments(p, int(model.GetVocabSize())); err != nil {
		return nil, apierr.InvalidArgument("%v", err)
	}
	if p.GetResponseFormat().GetType() == loopsv1.ResponseFormat_TYPE_JSON_SCHEMA {
		if _, err := constrain.Schema([]byte(p.GetResponseFormat().GetJsonSchema())); err != nil {
			return nil, apierr.InvalidArgument("response_format.json_schema: %v", err)
		}
	}
	return p, nil
}

// promptExtras checks prompt_logprobs_last_n, target_prompt_tokens and
// prompt_alt_tokens_k; each is bounded as a top-k width is (semantics.MaxTopKPromptLogprobs
// per prompt position).
func promptExtras(model *loopsv1.ModelInfo, req *loopsv1.SampleRequest) error {
	n := len(req.GetPrompt())
	if last := req.GetPromptLogprobsLastN(); last != 0 {
		switch {
		case !req.GetPromptLogprobs():
			return apierr.InvalidArgument("prompt_logprobs_last_n applies to prompt logprobs: set prompt_logprobs too")
		case last < 1 || int(last) > n-1:
			return apierr.InvalidArgument("prompt_logprobs_last_n %d is out of range [1, %d] (len(prompt) - 1; the first prompt token has no logprob)", last, n-1)
		}
	}
	if k := req.GetPromptAltTokensK(); k != 0 {
		switch {
		case k < 0 || k > semantics.MaxTopKPromptLogprobs:
			return apierr.InvalidArgument("prompt_alt_tokens_k %d is out of range [0, %d]", k, semantics.MaxTopKPromptLogprobs)
		case n < 2:
			return apierr.InvalidArgument("prompt_alt_tokens_k needs a prompt of at least 2 tokens: draws are made at every position after the first")
		}
	}
	ids, k := req.GetTargetPromptTokens().GetTokenIds(), int(req.GetTargetPromptTokens().GetK())
	if req.GetTargetPromptTokens() == nil {
		return nil
	}
	switch {
	case k < 1 || k > semantics.MaxTopKPromptLogprobs:
		return apierr.InvalidArgument("target_prompt_logprobs has %d ids per position; give 1 to %d", k, semantics.MaxTopKPromptLogprobs)
	case n < 2:
		return apierr.InvalidArgument("target_prompt_logprobs needs a prompt of at least 2 tokens: position 0 has no preceding context")
	case len(ids) != (n-1)*k:
		return apierr.InvalidArgument("target_prompt_logprobs has %d ids; a prompt of %d tokens with %d per position needs %d ([len(prompt) - 1, K])", len(ids), n, k, (n-1)*k)
	}
	V := model.GetVocabSize()
	named := false
	for c, t := range ids {
		switch {
		case t == -1:
		case t < -1 || (V > 0 && t >= V):
			return apierr.InvalidArgument("target_prompt_logprobs[%d][%d] = %d is outside %s's vocabulary [0, %d) (use -1 for no id)", c/k, c%k, t, model.GetName(), V)
		default:
			named = true
		}
	}
	if !named {
		return apierr.InvalidArgument("target_prompt_logprobs names no token id (every cell is -1): give at least one, or leave it out")
	}
	return nil
}

// embedding checks a request to embed its prompt (SampleRequest.embed): the prompt within
// the model's limit and no sampling or prompt option (an embedding samples nothing).
func embedding(model *loopsv1.ModelInfo, req *loopsv1.SampleRequest) error {
	if limit := int(model.GetMaxSequenceLength()); limit > 0 && len(req.GetPrompt()) > limit {
		return apierr.InvalidArgument("input of %d tokens is over %s's limit of %d tokens: shorten it", len(req.GetPrompt()), model.GetName(), limit)
	}
	switch {
	case req.GetNumSamples() > 1 || req.GetNumSamples() < 0:
		return apierr.InvalidArgument("num_samples must be 0 or 1 with embed, got %d", req.GetNumSamples())
	case req.GetParams() != nil:
		return apierr.InvalidArgument("embed samples nothing: leave params unset")
	case req.GetPromptLogprobs() || req.GetTopkPromptLogprobs() != 0 || req.GetPromptLogprobsLastN() != 0 ||
		req.GetTargetPromptTokens() != nil || req.GetPromptAltTokensK() != 0:
		return apierr.InvalidArgument("embed returns no prompt log-probs: leave prompt_logprobs, topk_prompt_logprobs, prompt_logprobs_last_n, target_prompt_tokens and prompt_alt_tokens_k unset")
	}
	return nil
}
