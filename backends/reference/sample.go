package reference

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/nn"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// MaxTopKPromptLogprobs caps topk_prompt_logprobs in the engine. It is above the public
// limit (semantics.MaxTopKPromptLogprobs, which the core applies) so that a direct caller
// can read whole rows of a small vocabulary.
const MaxTopKPromptLogprobs = 1024

const samplerCacheSize = 16

// samplerAdapter loads (or reuses) the adapter folder of a sampling request. Folders are
// immutable snapshots; the cache key also holds the weights file's identity (size,
// modification and change times, inode), so a folder rewritten in place is reloaded.
// The key names the adapter's weights (the prefix cache's scope).
func (e *Engine) samplerAdapter(bm *baseModel, dir string) (*nn.Adapter[float32], string, error) {
	if err := checkDir(dir); err != nil {
		return nil, "", err
	}
	st, err := os.Stat(filepath.Join(dir, peft.AdapterWeightsFile))
	if err != nil {
		return nil, "", invalid("adapter_dir %s has no %s: %v", dir, peft.AdapterWeightsFile, err)
	}
	key := fmt.Sprintf("%s|%s|%s", bm.name, dir, fileIdentity(st))
	e.samplerMu.Lock()
	if c, ok := e.samplerCache[key]; ok {
		e.samplerMu.Unlock()
		return c.ad, key, nil
	}
	e.samplerMu.Unlock()
	ad, err := nn.LoadAdapter(dir, bm.m, false, e.opts.MaxLoraRank)
	if err != nil {
		return nil, "", invalid("cannot load adapter from %s: %v", dir, err)
	}
	e.samplerMu.Lock()
	defer e.samplerMu.Unlock()
	if _, ok := e.samplerCache[key]; !ok {
		e.samplerCache[key] = &cachedAdapter{ad: ad, key: key}
		e.samplerOrder = append(e.samplerOrder, key)
		for len(e.samplerOrder) > samplerCacheSize {
			delete(e.samplerCache, e.samplerOrder[0])
			e.samplerOrder = e.samplerOrder[1:]
		}
	}
	return ad, key, nil
}

// Sample generates num_samples continuations of the prompt. Concurrent calls on one base
// model decode together (batch.go); the result does not depend on them.
func (e *Engine) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	return e.sample(ctx, req, nil)
}

// SampleStream is Sample with every token passed to sink as it is sampled
// (backends.TokenStreamer); the sample is dropped at the next step boundary once sink is
// gone. The response is Sample's, bit for bit.
func (e *Engine) SampleStream(ctx context.Context, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error) {
	return e.sample(ctx, req, sink)
}

func (e *Engine) sample(ctx context.Context, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error) {
	bm, err := e.model(req.BaseModel)
	if err != nil {
		return nil, err
	}
	V := bm.m.Cfg.Vocab
	if len(req.Prompt) == 0 {
		return nil, invalid("the prompt is empty; send at least one token")
	}
	prompt := make([]int, len(req.Prompt))
	for i, t := range req.Prompt {
		if t < 0 || int(t) >= V {
			return nil, invalid("prompt token %d at position %d is outside the vocabulary [0, %d)", t, i, V)
		}
		prompt[i] = int(t)
	}
	if req.Embed {
		return e.embed(ctx, bm, req, prompt)
	}
	p := req.Params
	if p == nil {
		p = &loopsv1.SamplingParams{MaxTokens: int32(min(semantics.DefaultMaxTokens, bm.m.Cfg.MaxSeq()-len(prompt))), Temperature: 1, TopP: 1}
	}
	n := int(req.NumSamples)
	if n == 0 {
		n = 1
	}
	switch {
	case n < 0 || n > semantics.MaxNumSamples:
		return nil, invalid("num_samples must be between 1 and %d, got %d", semantics.MaxNumSamples, n)
	case p.MaxTokens < 1:
		return nil, invalid("max_tokens must be at least 1, got %d", p.MaxTokens)
	case len(prompt)+int(p.MaxTokens) > bm.m.Cfg.MaxSeq():
		return nil, invalid("prompt (%d tokens) plus max_tokens (%d) exceeds the model's limit of %d tokens; lower max_tokens or shorten the prompt", len(prompt), p.MaxTokens, bm.m.Cfg.MaxSeq())
	case !(p.Temperature >= 0) || math.IsInf(float64(p.Temperature), 0):
		return nil, invalid("temperature must be >= 0 (0 is greedy), got %g", p.Temperature)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return nil, invalid("top_p must be in (0, 1] (1 means no limit), got %g", p.TopP)
	case p.TopLogprobs < 0 || p.TopLogprobs > semantics.MaxTopLogprobs:
		return nil, invalid("top_logprobs must be between 0 and %d, got %d", semantics.MaxTopLogprobs, p.TopLogprobs)
	case req.TopkPromptLogprobs < 0 || req.TopkPromptLogprobs > MaxTopKPromptLogprobs:
		return nil, invalid("topk_prompt_logprobs must be between 0 and %d, got %d", MaxTopKPromptLogprobs, req.TopkPromptLogprobs)
	case req.PromptAltTokensK < 0 || req.PromptAltTokensK > MaxTopKPromptLogprobs:
		return nil, invalid("prompt_alt_tokens_k must be between 0 and %d, got %d", MaxTopKPromptLogprobs, req.PromptAltTokensK)
	case req.PromptAltTokensK > 0 && len(prompt) < 2:
		return nil, invalid("prompt_alt_tokens_k needs a prompt of at least 2 tokens (draws are made at every position after the first)")
	}
	targets, err := targetRows(req, len(prompt), V)
	if err != nil {
		return nil, err
	}
	for _, t := range p.StopTokens {
		if t < 0 || int(t) >= V {
			return nil, invalid("stop token %d is outside the vocabulary [0, %d)", t, V)
		}
	}
	sp := nn.SampleParams{MaxTokens: int(p.MaxTokens), Temperature: float64(p.Temperature), TopK: int(p.TopK),
		TopP: float64(p.TopP), Seed: p.Seed, EOS: bm.eos, TopLogprobs: int(p.TopLogprobs)}
	if sp.TopP == 0 {
		sp.TopP = 1
	}
	for _, t := range p.StopTokens {
		sp.StopTokens = append(sp.StopTokens, int(t))
	}
	if len(p.StopStrings) > 0 {
		if bm.tok == nil {
			return nil, invalid("model %q has no tokenizer.json this engine can decode, so stop strings cannot be matched; use stop tokens", bm.name)
		}
		sp.StopStrings = p.StopStrings
		sp.Decode = bm.tok.Decode
	}
	if err := bm.adjustments(p, &sp); err != nil {
		return nil, err
	}
	var ad *nn.Adapter[float32]
	var adKey string
	if req.AdapterDir != "" {
		if ad, adKey, err = e.samplerAdapter(bm, req.AdapterDir); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, connect.NewError(connect.CodeCanceled, err)
	}
	k := int(req.TopkPromptLogprobs)
	g := bm.m.NewGen(prompt, ad, n, sp, req.PromptLogprobs, k)
	if targets != nil {
		g.WantTargets(targets)
	}
	g.WantAlts(int(req.PromptAltTokensK))
	pu := e.reusePrefix(bm, g, prefixScope(bm, req.GetWorkspace(), adKey), prompt)
	if sink != nil {
		var cancel context.CancelFunc
		ctx, cancel = tokenstream.CancelOnGone(ctx, sink)
		defer cancel()
		gone := sink.Gone()
		g.OnToken = func(seq, tok int, lp float64, top []nn.TopEntry) {
			var alts []tokenstream.Alt
			for _, e := range top {
				alts = append(alts, tokenstream.Alt{ID: int32(e.Token), Logprob: float32(e.LogProb)})
			}
			sink.Token(seq, int32(tok), float32(lp), alts)
			select {
			case <-gone: // seen on the decoding goroutine: dropped at the next boundary
				cancel()
			default:
			}
		}
	}
	if err := bm.dec.run(ctx, req.GetWorkspace(), g); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, connect.NewError(connect.CodeDeadlineExceeded, err)
		}
		return nil, connect.NewError(connect.CodeCanceled, err)
	}
	e.storePrefix(pu)
	seqs, scores := g.Out, g.Scores
	res := &loopsv1.SampleResult{PromptCachedTokens: int32(pu.cached)}
	for _, s := range seqs {
		out := &loopsv1.SampledSequence{StopReason: loopsv1.StopReason_STOP_REASON_LENGTH}
		if s.Stopped {
			out.StopReason = loopsv1.StopReason_STOP_REASON_STOP
		}
		for i, t := range s.Tokens {
			out.Tokens = append(out.Tokens, int32(t))
			out.Logprobs = append(out.Logprobs, float32(s.LogProbs[i]))
		}
		if k := int(p.TopLogprobs); k > 0 {
			out.TopLogprobs = topKOf(s.Top, k)
		}
		res.Sequences = append(res.Sequences, out)
	}
	if scores != nil && req.PromptLogprobs {
		for _, v := range scores.LogProbs {
			res.PromptLogprobs = append(res.PromptLogprobs, float32(v))
		}
	}
	if scores != nil && k > 0 {
		res.TopkPromptLogprobs = topKOf(scores.TopK, k)
	}
	if scores != nil && targets != nil {
		tl := &loopsv1.TargetPromptLogprobs{K: req.TargetPromptTokens.GetK(), Logprobs: make([]float32, 0, len(req.TargetPromptTokens.GetTokenIds()))}
		for _, row := range scores.Targets {
			for _, v := range row {
				tl.Logprobs = append(tl.Logprobs, float32(v))
			}
		}
		res.TargetPromptLogprobs = tl
	}
	if scores != nil && len(scores.Alts) > 0 {
		alt := &loopsv1.PromptAltTokens{K: req.PromptAltTokensK}
		for _, row := range scores.Alts {
			for _, e := range row {
				alt.TokenIds = append(alt.TokenIds, int32(e.Token))
				alt.Logprobs = append(alt.Logprobs, float32(e.LogProb))
			}
		}
		res.PromptAltTokens = alt
	}
	return &backendv1.SampleResponse{Result: res}, nil
}

// targetRows checks target_prompt_tokens (row major [len(prompt) - 1, k], ids in the
// vocabulary or -1) and cuts it into rows; nil when none are asked for.
func targetRows(req *backendv1.SampleRequest, promptLen, vocab int) ([][]int, error) {
	ids, k := req.GetTargetPromptTokens().GetTokenIds(), int(req.GetTargetPromptTokens().GetK())
	if len(ids) == 0 && k == 0 {
		return nil, nil
	}
	switch {
	case k < 1 || k > MaxTopKPromptLogprobs:
		return nil, invalid("target_prompt_tokens.k must be between 1 and %d, got %d", MaxTopKPromptLogprobs, k)
	case promptLen < 2:
		return nil, invalid("target_prompt_tokens needs a prompt of at least 2 tokens (position 0 has no preceding context)")
	case len(ids) != (promptLen-1)*k:
		return nil, invalid("target_prompt_tokens has %d ids; a prompt of %d tokens with k %d needs %d ([len(prompt) - 1, k])", len(ids), promptLen, k, (promptLen-1)*k)
	}
	rows := make([][]int, promptLen-1)
	for i := range rows {
		rows[i] = make([]int, k)
		for j := range k {
			t := ids[i*k+j]
			if t < -1 || int(t) >= vocab {
				return nil, invalid("target_prompt_tokens[%d][%d] = %d is outside the vocabulary [0, %d) (use -1 for no id)", i, j, t, vocab)
			}
			rows[i][j] = int(t)
		}
	}
	return rows, nil
}

// topKOf lays rows of at most k entries out as TopKLogprobs (cells without a candidate:
// token 0, log-prob -99999).
func topKOf(rows [][]nn.TopEntry, k int) *loopsv1.TopKLogprobs {
	tk := &loopsv1.TopKLogprobs{K: int32(k), Length: int32(len(rows)),
		TokenIds: make([]int32, len(rows)*k), Logprobs: make([]float32, len(rows)*k)}
	for i := range tk.Logprobs {
		tk.Logprobs[i] = -99999
	}
	for r, row := range rows {
		for c, ent := range row {
			tk.TokenIds[r*k+c] = int32(ent.Token)
			tk.Logprobs[r*k+c] = float32(ent.LogProb)
		}
	}
	return tk
}
