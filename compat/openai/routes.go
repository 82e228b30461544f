package openai

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// notDonePause is how long the adapter waits before asking again when WaitOperation answers
// with an operation that is not done: its own 30 s wait passed, or the server is draining
// (then it answers at once, and the operation fails or finishes soon).
const notDonePause = 100 * time.Millisecond

// completion is the core's answer to a request, with what the response needs.
type completion struct {
	opID string
	text *text
	// prompt is the prompt tokens, summed over the prompts.
	prompt int
	// seqs are the choices: n per prompt, in the prompts' order.
	seqs []*loopsv1.SampledSequence
}

func (s *server) chatCompletions(w http.ResponseWriter, r *http.Request) error {
	return s.serve(w, r, true)
}

func (s *server) completions(w http.ResponseWriter, r *http.Request) error {
	return s.serve(w, r, false)
}

func (s *server) serve(w http.ResponseWriter, r *http.Request, chat bool) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := decodeRequest(b, chat, s.opt.MaxSamplesPerRequest)
	if err != nil {
		return err
	}
	c, err := s.sample(r.Context(), req)
	if err != nil {
		return err
	}
	created := s.opt.Now().Unix()
	if req.stream {
		return s.stream(w, req, c, created)
	}
	if chat {
		writeJSON(w, http.StatusOK, chatResponse(req, c, created))
	} else {
		writeJSON(w, http.StatusOK, completionResponse(req, c, created))
	}
	return nil
}

// sample translates req onto the core: the workspace's sampler for the model, the prompts'
// tokens, one Sample per prompt, and WaitOperation until each operation is done.
func (s *server) sample(ctx context.Context, req *request) (*completion, error) {
	sm, key, err := s.samplerFor(ctx, req.model)
	if err != nil {
		return nil, err
	}
	t, err := s.models.get(ctx, sm.baseModel)
	if err != nil {
		return nil, err
	}
	var prompts [][]int32
	if req.chat {
		rendered, err := t.render(req.messages)
		if err != nil {
			return nil, err
		}
		prompts = [][]int32{t.encode(rendered)}
	}
	for _, p := range req.prompts {
		if p.hasTokens {
			prompts = append(prompts, p.tokens)
		} else {
			prompts = append(prompts, t.encode(p.text))
		}
	}
	params := &loopsv1.SamplingParams{
		MaxTokens: req.maxTokens, Temperature: req.temperature, TopK: req.topK, TopP: req.topP, Seed: req.seed, StopStrings: req.stop,
	}
	// Queue every prompt's sample first, so that they run together, then wait for each.
	ops := make([]*loopsv1.Operation, len(prompts))
	for i, p := range prompts {
		in := &loopsv1.SampleRequest{SamplerId: sm.id, Prompt: p, NumSamples: req.n, Params: params}
		op, err := s.svc.Sampling.Sample(ctx, in)
		if connect.CodeOf(err) == connect.CodeNotFound && i == 0 {
			// The remembered sampler is gone (its record was deleted): create a new one once.
			// A checkpoint that is gone fails the creation with its own NotFound.
			s.samplers.drop(key, sm.id)
			if sm, _, err = s.samplerFor(ctx, req.model); err != nil {
				return nil, err
			}
			in.SamplerId = sm.id
			op, err = s.svc.Sampling.Sample(ctx, in)
		}
		if err != nil {
			return nil, err
		}
		ops[i] = op
	}
	c := &completion{opID: ops[0].GetId(), text: t}
	for i, op := range ops {
		op, err := s.wait(ctx, op)
		if err != nil {
			return nil, err
		}
		c.prompt += len(prompts[i])
		c.seqs = append(c.seqs, op.GetSample().GetSequences()...)
	}
	return c, nil
}

// wait waits until op is done and returns it, or its error.
func (s *server) wait(ctx context.Context, op *loopsv1.Operation) (*loopsv1.Operation, error) {
	for !done(op) {
		var err error
		op, err = s.svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId()})
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

// usage is OpenAI's token count of a response.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (c *completion) usage() usage {
	u := usage{PromptTokens: c.prompt}
	for _, seq := range c.seqs {
		u.CompletionTokens += len(seq.GetTokens())
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// choiceText is a sequence's text: special tokens left out, and cut before the first stop
// sequence (OpenAI returns text without it; the sampler's tokens include it).
func (c *completion) choiceText(req *request, seq *loopsv1.SampledSequence) string {
	out := c.text.decode(seq.GetTokens())
	cut := len(out)
	for _, st := range req.stop {
		if i := strings.Index(out, st); i >= 0 && i < cut {
			cut = i
		}
	}
	return out[:cut]
}

func finishReason(seq *loopsv1.SampledSequence) string {
	if seq.GetStopReason() == loopsv1.StopReason_STOP_REASON_LENGTH {
		return "length"
	}
	return "stop"
}

// chatLogprob is one token of a chat choice's logprobs.content.
type chatLogprob struct {
	Token       string   `json:"token"`
	Logprob     float32  `json:"logprob"`
	Bytes       []int    `json:"bytes"`
	TopLogprobs []string `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

func (c *completion) chatLogprobs(seq *loopsv1.SampledSequence) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprob, 0, len(seq.GetTokens()))}
	for i, tok := range seq.GetTokens() {
		s := c.text.tok.Decode([]int{int(tok)})
		b := make([]int, len(s))
		for j := range len(s) {
			b[j] = int(s[j])
		}
		var lp float32
		if i < len(seq.GetLogprobs()) {
			lp = seq.GetLogprobs()[i]
		}
		out.Content = append(out.Content, chatLogprob{Token: s, Logprob: lp, Bytes: b, TopLogprobs: []string{}})
	}
	return out
}

// completionLogprobs is a completion choice's logprobs (legacy format).
type completionLogprobs struct {
	Tokens        []string  `json:"tokens"`
	TokenLogprobs []float32 `json:"token_logprobs"`
	TopLogprobs   []any     `json:"top_logprobs"`
	TextOffset    []int     `json:"text_offset"`
}

func (c *completion) completionLogprobs(seq *loopsv1.SampledSequence) *completionLogprobs {
	n := len(seq.GetTokens())
	out := &completionLogprobs{Tokens: make([]string, n), TokenLogprobs: make([]float32, n), TopLogprobs: make([]any, n), TextOffset: make([]int, n)}
	off := 0
	for i, tok := range seq.GetTokens() {
		s := c.text.tok.Decode([]int{int(tok)})
		out.Tokens[i], out.TextOffset[i] = s, off
		off += len(s)
		if i < len(seq.GetLogprobs()) {
			out.TokenLogprobs[i] = seq.GetLogprobs()[i]
		}
	}
	return out
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      chatMessage   `json:"message"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

func chatResponse(req *request, c *completion, created int64) chatCompletion {
	out := chatCompletion{ID: "chatcmpl-" + c.opID, Object: "chat.completion", Created: created, Model: req.model,
		Choices: make([]chatChoice, len(c.seqs)), Usage: c.usage()}
	for i, seq := range c.seqs {
		ch := chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: c.choiceText(req, seq)}, FinishReason: finishReason(seq)}
		if req.logprobs {
			ch.Logprobs = c.chatLogprobs(seq)
		}
		out.Choices[i] = ch
	}
	return out
}

type completionChoice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type textCompletion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}

func completionResponse(req *request, c *completion, created int64) textCompletion {
	u := c.usage()
	out := textCompletion{ID: "cmpl-" + c.opID, Object: "text_completion", Created: created, Model: req.model,
		Choices: make([]completionChoice, len(c.seqs)), Usage: &u}
	for i, seq := range c.seqs {
		fr := finishReason(seq)
		ch := completionChoice{Text: c.choiceText(req, seq), Index: i, FinishReason: &fr}
		if req.logprobs {
			ch.Logprobs = c.completionLogprobs(seq)
		}
		out.Choices[i] = ch
	}
	return out
}

// model is one entry of GET /models.
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// listModels answers the served base models, then the sampler checkpoints of the caller's
// workspace (the core's first page of its checkpoints).
func (s *server) listModels(w http.ResponseWriter, r *http.Request) error {
	res, err := s.svc.Models.ListModels(r.Context(), &loopsv1.ListModelsRequest{})
	if err != nil {
		return err
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range res.GetModels() {
		out.Data = append(out.Data, model{ID: m.GetName(), Object: "model", OwnedBy: "loops"})
	}
	cks, err := s.svc.Checkpoints.ListCheckpoints(r.Context(), &loopsv1.ListCheckpointsRequest{})
	if err != nil {
		return err
	}
	for _, ck := range cks.GetCheckpoints() {
		if !strings.Contains(ck.GetTinkerPath(), "/sampler_weights/") {
			continue
		}
		out.Data = append(out.Data, model{ID: ck.GetTinkerPath(), Object: "model", Created: ck.GetCreateTime().GetSeconds(), OwnedBy: "workspace"})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getModel answers one model: a served base model, or a sampler checkpoint of the caller's
// workspace (alone or as "<base model>;<path>"); anything else is a 404.
func (s *server) getModel(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("model")
	// An unescaped tinker:// in the URL path reaches here as tinker:/ (the mux cleans "//").
	if i := strings.Index(id, "tinker:/"); i >= 0 && !strings.HasPrefix(id[i:], "tinker://") {
		id = id[:i] + "tinker://" + id[i+len("tinker:/"):]
	}
	base, path, err := parseModel(id)
	if err != nil {
		return err
	}
	out := model{ID: id, Object: "model", OwnedBy: "loops"}
	if base != "" {
		res, err := s.svc.Models.ListModels(r.Context(), &loopsv1.ListModelsRequest{})
		if err != nil {
			return err
		}
		found := false
		for _, m := range res.GetModels() {
			found = found || m.GetName() == base
		}
		if !found {
			return &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, param: "model", code: "model_not_found",
				message: "model " + truncate(base) + " is not served (GET /models lists those that are)"}
		}
	}
	if path != "" {
		ck, err := s.svc.Checkpoints.GetCheckpoint(r.Context(), &loopsv1.GetCheckpointRequest{Path: path})
		if err != nil {
			return err
		}
		if base != "" && ck.GetBaseModel() != base {
			return badField("model", "checkpoint %s was trained on %s, not %s", path, ck.GetBaseModel(), base)
		}
		out.Created, out.OwnedBy = ck.GetCreateTime().GetSeconds(), "workspace"
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
