package infer

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// EmbedLimits bound one embedding request before any work: its inputs, and their tokens
// together (each input is also bounded by the model's max_sequence_length).
type EmbedLimits struct {
	MaxInputs      int
	MaxTotalTokens int
}

// Embeddings is the core's answer to an embedding request: one vector per input, in order.
type Embeddings struct {
	Vectors      [][]float32
	PromptTokens int
}

// Embed embeds each input with model's sampler (its base model, or a sampler checkpoint
// with its adapter applied): every input is one sample with SampleRequest.embed, queued,
// limited and metered by the core as any sample. Texts are tokenized with the model's
// tokenizer as text prompts are (no chat template). param names the request field of the
// inputs in errors ("input"). dimensions, when not 0, must be the model's hidden size: it is
// refused before any work when the backend reports the size (ModelInfo.hidden_size), and
// once the vectors are back otherwise.
func (e *Engine) Embed(ctx context.Context, model, param string, inputs []Prompt, dimensions int, lim EmbedLimits) (*Embeddings, error) {
	if len(inputs) == 0 {
		return nil, BadField(param, "%s is empty: give a string, a list of strings, a token array or a list of token arrays", param)
	}
	if len(inputs) > lim.MaxInputs {
		return nil, BadField(param, "%s has %d items; at most %d are embedded per request: split it", param, len(inputs), lim.MaxInputs)
	}
	sm, key, err := e.samplerFor(ctx, model)
	if err != nil {
		return nil, err
	}
	info, err := e.models.info(ctx, sm.baseModel)
	if err != nil {
		return nil, err
	}
	if err := checkDimensions(dimensions, int(info.GetHiddenSize()), model); err != nil {
		return nil, err
	}
	t, limit, err := e.model(ctx, sm.baseModel)
	if err != nil {
		return nil, err
	}
	toks := make([][]int32, len(inputs))
	total := 0
	for i, in := range inputs {
		p := param
		if len(inputs) > 1 {
			p = fmt.Sprintf("%s[%d]", param, i)
		}
		switch {
		case in.Tokens != nil:
			if limit > 0 && len(in.Tokens) > limit {
				return nil, tooLong(p, "%s has %d tokens; %s takes at most %d (max_sequence_length): shorten it", p, len(in.Tokens), sm.baseModel, limit)
			}
			toks[i] = in.Tokens
		default:
			if err := t.checkBytes(len(in.Text), limit, sm.baseModel, p); err != nil {
				return nil, err
			}
			if toks[i], err = t.encodeBounded(in.Text, limit, sm.baseModel, p); err != nil {
				return nil, err
			}
		}
		if len(toks[i]) == 0 {
			return nil, BadField(p, "%s is empty (no tokens): every input needs at least one token", p)
		}
		if total += len(toks[i]); total > lim.MaxTotalTokens {
			return nil, BadField(param, "%s holds more than %d tokens in all, the most embedded per request: split it", param, lim.MaxTotalTokens)
		}
	}
	ops := make([]*loopsv1.Operation, len(toks))
	for i, p := range toks {
		in := &loopsv1.SampleRequest{SamplerId: sm.id, Prompt: p, Embed: true}
		op, err := e.svc.Sampling.Sample(ctx, in)
		if connect.CodeOf(err) == connect.CodeNotFound && i == 0 {
			// The remembered sampler is gone (its record was deleted): create a new one once.
			e.samplers.drop(key, sm.id)
			if sm, _, err = e.samplerFor(ctx, model); err != nil {
				return nil, err
			}
			in.SamplerId = sm.id
			op, err = e.svc.Sampling.Sample(ctx, in)
		}
		if err != nil {
			e.waitAll(ctx, ops[:i])
			return nil, err
		}
		ops[i] = op
	}
	out := &Embeddings{Vectors: make([][]float32, len(toks)), PromptTokens: total}
	var first error
	// The waits outlive ctx: the request holds its key's slot while its samples run.
	wctx := context.WithoutCancel(ctx)
	for i, op := range ops {
		done, err := e.wait(wctx, op)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		out.Vectors[i] = done.GetSample().GetEmbedding()
		if err := checkDimensions(dimensions, len(out.Vectors[i]), model); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// checkDimensions refuses dimensions (0: not given) other than hidden, model's hidden size
// (0: not known).
func checkDimensions(dimensions, hidden int, model string) error {
	if dimensions == 0 || hidden == 0 || dimensions == hidden {
		return nil
	}
	return BadField("dimensions", "dimensions %d is not %s's hidden size %d: Loops returns the whole final hidden state, so leave dimensions out or set it to %d",
		dimensions, model, hidden, hidden)
}

// waitAll waits until the core says each of ops has ended.
func (e *Engine) waitAll(ctx context.Context, ops []*loopsv1.Operation) {
	wctx := context.WithoutCancel(ctx)
	for _, op := range ops {
		_, _ = e.wait(wctx, op) // ended either way: the caller answers its own error
	}
}
