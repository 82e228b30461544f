package infer

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// notDonePause is how long the engine waits before asking again when WaitOperation answers
// with an operation that is not done: its own 30 s wait passed, or the server is draining
// (then it answers at once, and the operation fails or finishes soon).
const notDonePause = 100 * time.Millisecond

// Services are the core handlers the engine translates onto. All must be non-nil.
type Services struct {
	Sampling   loopsv1connect.SamplingServiceHandler
	Operations loopsv1connect.OperationServiceHandler
	Models     loopsv1connect.ModelServiceHandler
}

// Options tune the engine. The zero value gives the defaults noted per field.
type Options struct {
	// MaxSamplers bounds the samplers remembered, one per (workspace, model): past it the
	// least recently used is forgotten (its next request creates a new sampler). Default
	// semantics.MaxSamplersInMemory, the core's bound too.
	MaxSamplers int
	// Workspace returns the authenticated caller's workspace (the gateway's
	// auth.Workspace): the sampler cache is keyed by it. Default: one shared key, which is
	// only right when the core serves one workspace.
	Workspace func(ctx context.Context) string
}

// Engine samples the requests of the inference adapters on the core.
type Engine struct {
	svc      Services
	opt      Options
	samplers *samplerCache
	models   *modelCache
}

// New returns an engine over the core's services.
func New(s Services, o Options) *Engine {
	if o.MaxSamplers <= 0 {
		o.MaxSamplers = semantics.MaxSamplersInMemory
	}
	if o.Workspace == nil {
		o.Workspace = func(context.Context) string { return "" }
	}
	return &Engine{svc: s, opt: o, samplers: newSamplerCache(o.MaxSamplers), models: newModelCache(s.Models)}
}

// Samplers is the number of samplers the engine remembers (tests).
func (e *Engine) Samplers() int { return e.samplers.len() }

// Prompt is one prompt: Text, tokenized with the model's tokenizer, or Tokens as they are
// when Tokens is not nil.
type Prompt struct {
	Text   string
	Tokens []int32
}

// Request is a decoded inference request.
type Request struct {
	// Model is the request's model string (ParseModel).
	Model string
	// Messages, when not empty, are rendered with the model's chat template into the first
	// prompt.
	Messages []Message
	// Prefill is text the answer to Messages starts with: appended to the rendered messages
	// (after the template's generation prompt), so the sample continues it.
	Prefill string
	// Prompts are sampled after the rendered messages, each N times.
	Prompts []Prompt
	// N is the number of samples per prompt (at least 1).
	N int32
	// Params are the sampling parameters; a zero MaxTokens leaves the default to the core.
	Params *loopsv1.SamplingParams
}

// Completion is the core's answer to a request.
type Completion struct {
	// ID is the first sampling operation's id.
	ID string
	// Text is the base model's text, to decode tokens with.
	Text *Text
	// PromptTokens is the number of prompt tokens, summed over the prompts.
	PromptTokens int
	// Seqs are the choices: N per prompt, in the prompts' order.
	Seqs []*loopsv1.SampledSequence
	// Stop are the request's stop sequences.
	Stop []string
}

// Usage returns the prompt and completion tokens of the completion.
func (c *Completion) Usage() (prompt, completion int) {
	for _, seq := range c.Seqs {
		completion += len(seq.GetTokens())
	}
	return c.PromptTokens, completion
}

// ChoiceText is choice i's text: special tokens left out, and cut before the first stop
// sequence (the APIs return text without it; the sampler's tokens include it).
func (c *Completion) ChoiceText(i int) string {
	return cutStop(c.Text.Decode(c.Seqs[i].GetTokens()), c.Stop)
}

// StopSequence is the stop sequence choice i ended on ("" when it ended otherwise): the
// first of them in its text.
func (c *Completion) StopSequence(i int) string {
	text := c.Text.Decode(c.Seqs[i].GetTokens())
	at, which := len(text)+1, ""
	for _, st := range c.Stop {
		if j := indexOf(text, st); j >= 0 && j < at {
			at, which = j, st
		}
	}
	return which
}

// Top is the alternatives of token k of choice i (SamplingParams.top_logprobs), most
// likely first; nil when none were asked for.
func (c *Completion) Top(i, k int) []tokenstream.Alt {
	return topRow(c.Seqs[i].GetTopLogprobs(), k)
}

// topRow is row k of tk without its empty cells.
func topRow(tk *loopsv1.TopKLogprobs, k int) []tokenstream.Alt {
	n := int(tk.GetK())
	if n <= 0 || k < 0 || (k+1)*n > len(tk.GetTokenIds()) || (k+1)*n > len(tk.GetLogprobs()) {
		return nil
	}
	out := make([]tokenstream.Alt, 0, n)
	for j := k * n; j < (k+1)*n; j++ {
		if tk.GetLogprobs()[j] <= -99999 {
			break
		}
		out = append(out, tokenstream.Alt{ID: tk.GetTokenIds()[j], Logprob: tk.GetLogprobs()[j]})
	}
	return out
}

// Stopped reports whether choice i ended on a stop (a stop sequence or token, or the end
// of sequence) rather than at max_tokens.
func (c *Completion) Stopped(i int) bool {
	return c.Seqs[i].GetStopReason() != loopsv1.StopReason_STOP_REASON_LENGTH
}

// cutStop cuts s before the first of its stop sequences.
func cutStop(s string, stop []string) string {
	cut := len(s)
	for _, st := range stop {
		if i := indexOf(s, st); i >= 0 && i < cut {
			cut = i
		}
	}
	return s[:cut]
}

// Sample samples req and returns the completion once every sample is done.
func (e *Engine) Sample(ctx context.Context, req *Request) (*Completion, error) {
	r, err := e.start(ctx, req, false)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	for {
		if _, err := r.Next(ctx); err != nil {
			if errors.Is(err, errDone) {
				return r.c, nil
			}
			return nil, err
		}
	}
}

// Stream queues req with its tokens streamed as they are decoded; read them with Run.Next.
func (e *Engine) Stream(ctx context.Context, req *Request) (*Run, error) {
	return e.start(ctx, req, true)
}

// Text returns base model name's text (tokenizer and chat template).
func (e *Engine) Text(ctx context.Context, name string) (*Text, error) {
	return e.models.get(ctx, name)
}

// Tokens renders and tokenizes the request's messages and prompts as Sample would, for the
// base model of its model string, without sampling (token counting).
func (e *Engine) Tokens(ctx context.Context, req *Request) ([][]int32, error) {
	sm, _, err := e.samplerFor(ctx, req.Model)
	if err != nil {
		return nil, err
	}
	t, err := e.models.get(ctx, sm.baseModel)
	if err != nil {
		return nil, err
	}
	return prompts(t, req)
}

func prompts(t *Text, req *Request) ([][]int32, error) {
	var out [][]int32
	if len(req.Messages) > 0 {
		rendered, err := t.Render(req.Messages)
		if err != nil {
			return nil, err
		}
		out = append(out, t.Encode(rendered+req.Prefill))
	}
	for _, p := range req.Prompts {
		if p.Tokens != nil {
			out = append(out, p.Tokens)
		} else {
			out = append(out, t.Encode(p.Text))
		}
	}
	return out, nil
}

// samplerFor returns the workspace's sampler for model, creating it on first use, and its
// cache key.
func (e *Engine) samplerFor(ctx context.Context, model string) (sampler, string, error) {
	base, path, err := ParseModel(model)
	if err != nil {
		return sampler{}, "", err
	}
	key := e.opt.Workspace(ctx) + "\x00" + base + "\x00" + path
	if sm, ok := e.samplers.get(key); ok {
		return sm, key, nil
	}
	info, err := e.createSampler(ctx, base, path)
	if err != nil {
		return sampler{}, "", err
	}
	sm := sampler{id: info.GetId(), baseModel: info.GetBaseModel()}
	e.samplers.put(key, sm)
	return sm, key, nil
}

// wait waits until op is done and returns it, or its error.
func (e *Engine) wait(ctx context.Context, op *loopsv1.Operation) (*loopsv1.Operation, error) {
	for !done(op) {
		var err error
		op, err = e.svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId()})
		if err != nil {
			return nil, err
		}
		if done(op) {
			break
		}
		t := time.NewTimer(notDonePause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-t.C:
		}
	}
	if op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED {
		e := op.GetError()
		code := connect.Code(e.GetCode())
		if code == 0 || code > connect.CodeUnauthenticated {
			code = connect.CodeUnknown
		}
		return nil, connect.NewError(code, errors.New(e.GetMessage()))
	}
	return op, nil
}

func done(op *loopsv1.Operation) bool {
	st := op.GetState()
	return st == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED || st == loopsv1.OperationState_OPERATION_STATE_FAILED
}
