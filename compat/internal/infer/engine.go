package infer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/tokenstream"
	"github.com/loops-dev/loops/internal/vision"
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
	// MaxSamplers bounds the samplers remembered, one per (workspace, session (SessionHeader), model): past it the
	// least recently used is forgotten (its next request creates a new sampler). Default
	// semantics.MaxSamplersInMemory, the core's bound too.
	MaxSamplers int
	// Workspace returns the authenticated caller's workspace (the gateway's
	// auth.Workspace): the sampler cache is keyed by it. Default: one shared key, which is
	// only right when the core serves one workspace.
	Workspace func(ctx context.Context) string
	// AllowModality returns the error that refuses input of a modality ("image") the
	// caller's workspace may not send (the workspace policy's allowed_modalities; the
	// gateway's policy.Enforcer.AllowModality); what names the input. It is asked before any
	// work. Default: every modality is allowed (the core still checks its own requests).
	AllowModality func(ctx context.Context, modality, what string) error
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
	if o.AllowModality == nil {
		o.AllowModality = func(context.Context, string, string) error { return nil }
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
	// Tools are offered to the model through its chat template (the adapters leave them out
	// under tool choice none); ToolChoice required or a named function forces a call by
	// starting the answer with the format's call opening (ToolFormat.ForcedPrefix), which
	// cannot be combined with a Prefill.
	Tools      []Tool
	ToolChoice ToolChoice
	// Prompts are sampled after the rendered messages, each N times.
	Prompts []Prompt
	// N is the number of samples per prompt (at least 1).
	N int32
	// Params are the sampling parameters; a zero MaxTokens leaves the default to the core.
	Params *loopsv1.SamplingParams
	// ScorePrompts asks for the prompts' own log-probs (Completion.PromptLogprobs) and,
	// with Params.TopLogprobs k > 0, each prompt token's k most likely alternatives
	// (Completion.PromptTop): the forward pass of the sample scores them (the core's
	// prompt_logprobs, as Tinker's compute_logprobs), queued and metered with it.
	ScorePrompts bool
	// ScoreOnly (OpenAI's max_tokens 0 with echo) returns choices without tokens:
	// the core samples one token after each prompt (Params.MaxTokens must be 1), which is
	// dropped, so a prompt must leave room for it.
	ScoreOnly bool
}

// Completion is the core's answer to a request.
type Completion struct {
	// ID is the first sampling operation's id.
	ID string
	// Text is the base model's text, to decode tokens with.
	Text *Text
	// PromptTokens is the number of prompt tokens, summed over the prompts.
	PromptTokens int
	// CachedTokens is how many of them the backend served from its prefix cache
	// (SampleResult.prompt_cached_tokens), summed over the prompts.
	CachedTokens int
	// Seqs are the choices: N per prompt, in the prompts' order.
	Seqs []*loopsv1.SampledSequence
	// Stop are the request's stop sequences.
	Stop []string
	// Forced is the start of the answer that forced a tool call (ToolFormat.ForcedPrefix):
	// the choices' text continues it.
	Forced string
	// N is the number of choices per prompt: choice i continues prompt i / N.
	N int
	// Prompts are the prompts' tokens (the rendered messages first, when given).
	Prompts [][]int32
	// PromptLogprobs (with Request.ScorePrompts) are, per prompt, the log-prob of each of
	// its tokens given those before it; the first is NaN (it has no context).
	PromptLogprobs [][]float32
	// PromptTop (with Request.ScorePrompts and top_logprobs k > 0) are, per prompt, the k
	// most likely tokens at each of its positions (row 0 has none): PromptAlts reads them.
	PromptTop []*loopsv1.TopKLogprobs
}

// PromptAlts is the alternatives at token k of prompt p (Request.ScorePrompts with
// top_logprobs), most likely first; nil for the first token and when none were asked for.
func (c *Completion) PromptAlts(p, k int) []tokenstream.Alt {
	if p < 0 || p >= len(c.PromptTop) {
		return nil
	}
	return topRow(c.PromptTop[p], k)
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
	t, _, err := e.model(ctx, name)
	return t, err
}

// model returns base model name's text and the caller's limit on its sequences in tokens
// (its max_sequence_length as the caller's workspace sees it: the lesser of the model's and
// the workspace policy's; 0: none).
func (e *Engine) model(ctx context.Context, name string) (*Text, int, error) {
	t, info, err := e.modelInfo(ctx, name)
	return t, int(max(info.GetMaxSequenceLength(), 0)), err
}

// modelInfo returns base model name's text and its catalog entry as the caller's
// workspace sees it.
func (e *Engine) modelInfo(ctx context.Context, name string) (*Text, *loopsv1.ModelInfo, error) {
	info, err := e.models.info(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	t, err := e.models.get(info)
	if err != nil {
		return nil, nil, err
	}
	return t, info, nil
}

// Tokens renders and tokenizes the request's messages and prompts as Sample would, for the
// base model of its model string, without sampling (token counting), under the same bounds.
func (e *Engine) Tokens(ctx context.Context, req *Request) ([][]int32, error) {
	if err := e.allowImages(ctx, req); err != nil {
		return nil, err
	}
	sm, _, err := e.samplerFor(ctx, req.Model)
	if err != nil {
		return nil, err
	}
	t, info, err := e.modelInfo(ctx, sm.baseModel)
	if err != nil {
		return nil, err
	}
	ps, _, err := prompts(t, info, req)
	return ps, err
}

// prompts renders the request's messages and tokenizes them and its text prompts, each
// bounded by the limit in tokens of base model info (its max_sequence_length; 0: none):
// more messages than limit, or a text of more bytes than limit tokens can hold (limit × the
// tokenizer's MaxTokenBytes), is refused before it is rendered or tokenized, and tokenizing
// stops as soon as a prompt is over limit tokens. So an over-long prompt costs at most about
// limit tokens of work, whatever its size. The messages' images (checked when decoded)
// take the tokens the model's processor makes of them (vision.Tokens), counted against the
// limit before rendering; each image's placeholder in the rendered template is expanded to
// them, and the images are returned with their place in the first prompt.
func prompts(t *Text, info *loopsv1.ModelInfo, req *Request) ([][]int32, []*loopsv1.Image, error) {
	limit, name := int(max(info.GetMaxSequenceLength(), 0)), info.GetName()
	var out [][]int32
	var images []*loopsv1.Image
	if len(req.Messages) > 0 {
		if limit > 0 && len(req.Messages) > limit {
			// Rendering costs per message; every message of a chat takes a token at least.
			return nil, nil, tooLong("messages", "messages: %d messages cannot fit in %s's limit of %d tokens (max_sequence_length; every message takes at least one token): send fewer",
				len(req.Messages), name, limit)
		}
		if len(req.Tools) > 0 && t.tools == NoToolFormat {
			return nil, nil, BadField("tools", "%s's chat template renders no tools (Loops parses the tool calls of templates written for Qwen's <tool_call> format and Llama 3's JSON format): send the request without tools, or with tool_choice none", name)
		}
		imgs := Images(req.Messages)
		var sizes []int
		textLimit := limit
		if len(imgs) > 0 {
			var sum int
			var err error
			if sizes, sum, err = imageSizes(info, imgs); err != nil {
				return nil, nil, err
			}
			if limit > 0 {
				// Each image's placeholder is one token of the rendered text.
				if textLimit = limit - (sum - len(imgs)); textLimit < len(imgs) {
					return nil, nil, tooLong("messages", "messages: their %d images take %d tokens, over %s's limit of %d tokens (max_sequence_length): send fewer or smaller images", len(imgs), sum, name, limit)
				}
			}
		}
		forced := forcedPrefix(t, req)
		if forced != "" && req.Prefill != "" {
			return nil, nil, BadField("tool_choice", "a forced tool call (tool_choice %s) cannot continue a prefilled answer: drop the last assistant message or the tool choice", req.ToolChoice.Mode)
		}
		size := len(req.Prefill) + len(forced)
		for _, m := range req.Messages {
			size += len(m.Content)
			for _, c := range m.ToolCalls {
				size += len(c.Name) + len(c.Arguments)
			}
		}
		for _, tl := range req.Tools {
			size += len(tl.Name) + len(tl.Description) + len(tl.Parameters)
		}
		if err := t.checkBytes(size, textLimit, name, "messages"); err != nil {
			return nil, nil, err
		}
		rendered, err := t.Render(req.Messages, req.Tools)
		if err != nil {
			return nil, nil, err
		}
		toks, err := t.encodeBounded(rendered+req.Prefill+forced, textLimit, name, "messages")
		if err != nil {
			return nil, nil, err
		}
		if len(imgs) > 0 {
			if toks, images, err = expandImages(toks, imgs, sizes, info.GetVision().GetImageTokenId()); err != nil {
				return nil, nil, err
			}
		}
		out = append(out, toks)
	}
	for i, p := range req.Prompts {
		param := promptParam(req, i)
		if p.Tokens != nil {
			if limit > 0 && len(p.Tokens) > limit {
				return nil, nil, tooLong(param, "%s has %d tokens; %s takes at most %d (max_sequence_length): shorten it", param, len(p.Tokens), name, limit)
			}
			out = append(out, p.Tokens)
			continue
		}
		if err := t.checkBytes(len(p.Text), limit, name, param); err != nil {
			return nil, nil, err
		}
		toks, err := t.encodeBounded(p.Text, limit, name, param)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, toks)
	}
	return out, images, nil
}

// promptParam names prompt i of req's Prompts in errors.
func promptParam(req *Request, i int) string {
	if len(req.Prompts) > 1 {
		return fmt.Sprintf("prompt[%d]", i)
	}
	return "prompt"
}

// forcedPrefix is the start of the answer that forces the request's tool choice ("" when
// none is forced).
func forcedPrefix(t *Text, req *Request) string {
	if len(req.Tools) == 0 {
		return ""
	}
	return t.tools.ForcedPrefix(req.ToolChoice)
}

// MaxLogprobAlternatives bounds choices × max_tokens × top_logprobs of one request: the
// alternatives its answer may list (about 120 bytes of JSON each, and several times that in
// memory while the answer is built), so 131,072 of them make an answer of about 15 MB.
const MaxLogprobAlternatives = 1 << 17

// checkTopLogprobs refuses a request whose answer could list more than
// MaxLogprobAlternatives alternatives (top_logprobs), before any work: its choices × its
// max_tokens (when it gives none, the most the core may default to: DefaultMaxTokens, or the
// model's limit if lower) × top_logprobs, plus, when scored (ScorePrompts: the prompts'
// tokens, once they are known; 0 before), N × scored × top_logprobs.
func checkTopLogprobs(req *Request, limit, scored int) error {
	k := int64(req.Params.GetTopLogprobs())
	if k <= 0 {
		return nil
	}
	prompts := int64(len(req.Prompts))
	if len(req.Messages) > 0 {
		prompts++
	}
	choices := prompts * int64(max(req.N, 1))
	maxTokens, what := int64(req.Params.GetMaxTokens()), "max_tokens"
	if maxTokens <= 0 {
		maxTokens, what = semantics.DefaultMaxTokens, "max_tokens (not given: its default)"
		if limit > 0 {
			maxTokens = min(maxTokens, int64(limit))
		}
	}
	if total := choices * maxTokens * k; total > MaxLogprobAlternatives {
		return BadField("top_logprobs", "%d choices × %s %d × top_logprobs %d = %d alternatives, over the server's limit of %d per request: lower n, max_tokens or top_logprobs",
			choices, what, maxTokens, k, total, MaxLogprobAlternatives)
	} else if scored > 0 {
		// Each choice lists its prompt's alternatives too (ScorePrompts).
		if all := total + int64(max(req.N, 1))*int64(scored)*k; all > MaxLogprobAlternatives {
			return BadField("logprobs", "%d prompt tokens × n %d × top_logprobs %d scored (echo), with %d alternatives of the sampled tokens, make %d, over the server's limit of %d per request: send shorter or fewer prompts, or lower n or logprobs",
				scored, max(req.N, 1), k, total, all, MaxLogprobAlternatives)
		}
	}
	return nil
}

// samplerFor returns the workspace's sampler for model (in the request's session, when it
// names one: SessionHeader), creating it on first use, and its cache key.
func (e *Engine) samplerFor(ctx context.Context, model string) (sampler, string, error) {
	base, path, err := ParseModel(model)
	if err != nil {
		return sampler{}, "", err
	}
	session, err := sessionOf(ctx)
	if err != nil {
		return sampler{}, "", err
	}
	key := e.opt.Workspace(ctx) + "\x00" + session + "\x00" + base + "\x00" + path
	if sm, ok := e.samplers.get(key); ok {
		return sm, key, nil
	}
	info, err := e.createSampler(ctx, session, base, path)
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
	if st := op.GetState(); st == loopsv1.OperationState_OPERATION_STATE_FAILED || st == loopsv1.OperationState_OPERATION_STATE_CANCELLED {
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
	return st == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED || st == loopsv1.OperationState_OPERATION_STATE_FAILED ||
		st == loopsv1.OperationState_OPERATION_STATE_CANCELLED
}

// allowImages refuses a request whose messages hold images when the caller's workspace may
// not send them (Options.AllowModality), before the sampler or the model is looked up.
func (e *Engine) allowImages(ctx context.Context, req *Request) error {
	n := len(Images(req.Messages))
	if n == 0 {
		return nil
	}
	return e.opt.AllowModality(ctx, vision.Modality, fmt.Sprintf("the messages hold %d images", n))
}
