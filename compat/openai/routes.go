package openai

import (
	"math"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/loops-dev/loops/compat/internal/catalog"
	"github.com/loops-dev/loops/compat/internal/infer"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

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
	in := req.infer()
	created := s.opt.Now().Unix()
	if req.stream {
		run, err := s.engine.Stream(r.Context(), in)
		if err != nil {
			return err
		}
		defer run.Close()
		return s.stream(w, r, req, run, created)
	}
	c, err := s.engine.Sample(r.Context(), in)
	if err != nil {
		return err
	}
	if chat {
		s.edge.WriteJSON(w, http.StatusOK, chatResponse(req, c, created))
	} else {
		s.edge.WriteJSON(w, http.StatusOK, completionResponse(req, c, created))
	}
	return nil
}

// infer is the request as the shared engine takes it.
func (req *request) infer() *infer.Request {
	maxTokens := req.maxTokens
	if req.scoreOnly {
		maxTokens = 1 // the core samples at least one token; it is dropped (infer.Request.ScoreOnly)
	}
	out := &infer.Request{Model: req.model, Messages: req.messages, N: req.n, ScorePrompts: req.echo && req.logprobs,
		ScoreOnly: req.scoreOnly, Params: &loopsv1.SamplingParams{
			MaxTokens: maxTokens, Temperature: req.temperature, TopK: req.topK, TopP: req.topP, Seed: req.seed, StopStrings: req.stop,
			TopLogprobs: req.topLogprobs, LogitBias: req.logitBias, PresencePenalty: req.presencePenalty,
			FrequencyPenalty: req.frequencyPenalty, MinP: req.minP, ResponseFormat: req.responseFormat,
		}}
	if req.toolsActive() {
		out.Tools, out.ToolChoice = req.tools, req.toolChoice
	}
	for _, p := range req.prompts {
		ip := infer.Prompt{Text: p.text}
		if p.hasTokens {
			ip.Tokens = p.tokens
		}
		out.Prompts = append(out.Prompts, ip)
	}
	return out
}

// usage is OpenAI's token count of a response.
type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

// promptTokensDetails is OpenAI's breakdown of the prompt tokens: CachedTokens were
// served from the engine's prefix cache (billed as cached prefill).
type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(c *infer.Completion) usage {
	p, g := c.Usage()
	return usage{PromptTokens: p, CompletionTokens: g, TotalTokens: p + g, PromptTokensDetails: promptTokensDetails{CachedTokens: c.CachedTokens}}
}

func finishReason(stopped bool) string {
	if stopped {
		return "stop"
	}
	return "length"
}

// finishReasonOf is a chat choice's finish_reason, as OpenAI answers it: length when it
// was cut at max_tokens; tool_calls when it made calls, except under a named tool_choice,
// which OpenAI answers with stop; otherwise stop.
func (req *request) finishReasonOf(stopped, called bool) string {
	if called && stopped && req.toolChoice.Mode != infer.ToolChoiceFunction {
		return "tool_calls"
	}
	return finishReason(stopped)
}

// chatTop is one alternative of a chat token's top_logprobs.
type chatTop struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// chatLogprob is one token of a chat choice's logprobs.content.
type chatLogprob struct {
	Token       string    `json:"token"`
	Logprob     float32   `json:"logprob"`
	Bytes       []int     `json:"bytes"`
	TopLogprobs []chatTop `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

// tokenBytes is a token's text and its bytes.
func tokenBytes(t *infer.Text, tok int32) (string, []int) {
	s := t.TokenText(tok)
	b := make([]int, len(s))
	for j := range len(s) {
		b[j] = int(s[j])
	}
	return s, b
}

// seqTokens is choice i's tokens with their log-probs and alternatives.
func seqTokens(c *infer.Completion, i int) []tokenstream.Token {
	seq := c.Seqs[i]
	out := make([]tokenstream.Token, len(seq.GetTokens()))
	for k, tok := range seq.GetTokens() {
		out[k] = tokenstream.Token{Seq: i, ID: tok, Top: c.Top(i, k)}
		if k < len(seq.GetLogprobs()) {
			out[k].Logprob = seq.GetLogprobs()[k]
		}
	}
	return out
}

// chatLogprobsOf is the logprobs of toks.
func chatLogprobsOf(t *infer.Text, toks []tokenstream.Token) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprob, 0, len(toks))}
	for _, tok := range toks {
		s, b := tokenBytes(t, tok.ID)
		lp := chatLogprob{Token: s, Logprob: tok.Logprob, Bytes: b, TopLogprobs: make([]chatTop, 0, len(tok.Top))}
		for _, alt := range tok.Top {
			as, ab := tokenBytes(t, alt.ID)
			lp.TopLogprobs = append(lp.TopLogprobs, chatTop{Token: as, Logprob: alt.Logprob, Bytes: ab})
		}
		out.Content = append(out.Content, lp)
	}
	return out
}

// completionLogprobs is a completion choice's logprobs (legacy format).
type completionLogprobs struct {
	Tokens []string `json:"tokens"`
	// TokenLogprobs is null for an echoed prompt's first token (it has no context), and
	// for a log-prob that is not finite (JSON has no NaN or infinity).
	TokenLogprobs []*float32 `json:"token_logprobs"`
	// TopLogprobs is, per token, null (logprobs: 0, or an echoed prompt's first token) or
	// {token text: logprob} of its alternatives (tokens of the same text, as JSON writes
	// it, share one key: the most likely is kept).
	TopLogprobs []map[string]float32 `json:"top_logprobs"`
	TextOffset  []int                `json:"text_offset"`
}

// completionLogprobsOf is the logprobs of toks, whose text starts at byte off of the
// choice's text; top says whether alternatives were asked for.
func completionLogprobsOf(t *infer.Text, toks []tokenstream.Token, off int, top bool) *completionLogprobs {
	n := len(toks)
	out := &completionLogprobs{Tokens: make([]string, n), TokenLogprobs: make([]*float32, n), TopLogprobs: make([]map[string]float32, n), TextOffset: make([]int, n)}
	for i, tok := range toks {
		s := t.TokenText(tok.ID)
		out.Tokens[i], out.TextOffset[i] = s, off
		if lp := float64(tok.Logprob); !math.IsNaN(lp) && !math.IsInf(lp, 0) {
			out.TokenLogprobs[i] = &toks[i].Logprob
		}
		off += len(s)
		if top {
			out.TopLogprobs[i] = topLogprobsOf(t.TokenText, tok.Top)
		}
	}
	return out
}

// topLogprobsOf is a token's alternatives, most likely first, as legacy completions write
// them: {text: logprob}, one key per text as JSON writes it (encoding/json writes each byte
// that is not valid UTF-8 as U+FFFD, so the byte tokens of a byte-level tokenizer, which are
// not valid UTF-8 alone, would otherwise repeat the key "\ufffd" and a parser would keep
// the last): the first, most likely, alternative of each key is kept. text is a token's
// text (infer.Text.TokenText).
func topLogprobsOf(text func(int32) string, alts []tokenstream.Alt) map[string]float32 {
	m := make(map[string]float32, len(alts))
	for _, alt := range alts {
		k := jsonText(text(alt.ID))
		if _, dup := m[k]; !dup {
			m[k] = alt.Logprob
		}
	}
	return m
}

// jsonText is s as encoding/json writes it: each byte that is not part of a valid UTF-8
// character replaced by U+FFFD.
func jsonText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// echoLogprobs is the logprobs of choice i's prompt (echo), its text starting at byte 0:
// the first token's logprob and alternatives are null, as OpenAI's.
func echoLogprobs(c *infer.Completion, i int, top bool) *completionLogprobs {
	p := i / max(c.N, 1)
	toks := c.Prompts[p]
	lps := c.PromptLogprobs[p]
	st := make([]tokenstream.Token, len(toks))
	for k, id := range toks {
		st[k] = tokenstream.Token{Seq: i, ID: id, Logprob: lps[k], Top: c.PromptAlts(p, k)}
	}
	out := completionLogprobsOf(c.Text, st, 0, top)
	if len(toks) > 0 {
		out.TokenLogprobs[0], out.TopLogprobs[0] = nil, nil
	}
	return out
}

// append adds the logprobs of tokens that follow.
func (l *completionLogprobs) append(more *completionLogprobs) {
	l.Tokens = append(l.Tokens, more.Tokens...)
	l.TokenLogprobs = append(l.TokenLogprobs, more.TokenLogprobs...)
	l.TopLogprobs = append(l.TopLogprobs, more.TopLogprobs...)
	l.TextOffset = append(l.TextOffset, more.TextOffset...)
}

type chatMessage struct {
	Role string `json:"role"`
	// Content is null when the answer is tool calls only.
	Content   *string    `json:"content"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// toolCall is one call of a tool in an answer (OpenAI's message.tool_calls[]).
type toolCall struct {
	// Index is the call's place in a streamed delta (absent from a whole message).
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// maxCalls is the most calls one answer may make: 1 when parallel_tool_calls is false.
func (req *request) maxCalls() int {
	if req.parallel {
		return 0
	}
	return 1
}

// answer is choice i's message: its text, or its text and the tool calls parsed from it
// (in the model's format) when tools are active.
func (req *request) answer(c *infer.Completion, i int) (content *string, calls []toolCall) {
	text := c.ChoiceText(i)
	if !req.toolsActive() {
		return &text, nil
	}
	rest, parsed := infer.ParseToolCalls(c.Text.ToolFormat(), c.Forced+text, req.tools, req.maxCalls())
	if len(parsed) == 0 {
		rest = c.Forced + text
	}
	if rest != "" || len(parsed) == 0 {
		content = &rest
	}
	return content, toolCallsOf(parsed)
}

// toolCallsOf gives parsed calls their ids.
func toolCallsOf(parsed []infer.ToolCall) []toolCall {
	out := make([]toolCall, len(parsed))
	for k, p := range parsed {
		out[k] = toolCall{ID: infer.NewCallID("call_"), Type: "function", Function: toolFunction{Name: p.Name, Arguments: string(p.Arguments)}}
	}
	return out
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

func chatResponse(req *request, c *infer.Completion, created int64) chatCompletion {
	out := chatCompletion{ID: "chatcmpl-" + c.ID, Object: "chat.completion", Created: created, Model: req.model,
		Choices: make([]chatChoice, len(c.Seqs)), Usage: usageOf(c)}
	for i := range c.Seqs {
		content, calls := req.answer(c, i)
		ch := chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: content, ToolCalls: calls},
			FinishReason: req.finishReasonOf(c.Stopped(i), len(calls) > 0)}
		if req.logprobs {
			ch.Logprobs = chatLogprobsOf(c.Text, seqTokens(c, i))
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

func completionResponse(req *request, c *infer.Completion, created int64) textCompletion {
	u := usageOf(c)
	out := textCompletion{ID: "cmpl-" + c.ID, Object: "text_completion", Created: created, Model: req.model,
		Choices: make([]completionChoice, len(c.Seqs)), Usage: &u}
	for i := range c.Seqs {
		fr := finishReason(c.Stopped(i))
		ch := completionChoice{Text: c.ChoiceText(i), Index: i, FinishReason: &fr}
		prefix := ""
		if req.echo {
			prefix = req.echoText(c, i)
			ch.Text = prefix + ch.Text
		}
		if req.logprobs {
			ch.Logprobs = completionLogprobsOf(c.Text, seqTokens(c, i), len(prefix), req.topLogprobs > 0)
			if req.echo {
				lp := echoLogprobs(c, i, req.topLogprobs > 0)
				lp.append(ch.Logprobs)
				ch.Logprobs = lp
			}
		}
		out.Choices[i] = ch
	}
	return out
}

// echoText is the prompt that choice i continues, as echo returns it: the prompt's text as
// given, or its token ids decoded.
func (req *request) echoText(c *infer.Completion, i int) string {
	p := i / max(c.N, 1)
	if pr := req.prompts[p]; !pr.hasTokens {
		return pr.text
	}
	return c.Text.Decode(c.Prompts[p])
}

// model is one entry of GET /models: OpenAI's model object, with Loops' catalog entry of
// the model (or of the base model its weights were trained on) beside it, as extra fields
// the openai client keeps (docs/openai.md, "Models").
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// BaseModel is the base model of a checkpoint's or a deployment's weights.
	BaseModel string `json:"base_model,omitempty"`
	*catalog.Entry
}

// weights returns the catalog entry of weights trained on base model name (nil when it is
// not served).
func weights(bases map[string]*loopsv1.ModelInfo, name string) *catalog.Entry {
	if m, ok := bases[name]; ok {
		return catalog.Weights(m)
	}
	return nil
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
	bases := map[string]*loopsv1.ModelInfo{}
	for _, m := range res.GetModels() {
		bases[m.GetName()] = m
		out.Data = append(out.Data, model{ID: m.GetName(), Object: "model", OwnedBy: "loops", Entry: catalog.Of(m)})
	}
	cks, err := s.svc.Checkpoints.ListCheckpoints(r.Context(), &loopsv1.ListCheckpointsRequest{})
	if err != nil {
		return err
	}
	for _, ck := range cks.GetCheckpoints() {
		if !strings.Contains(ck.GetTinkerPath(), "/sampler_weights/") {
			continue
		}
		out.Data = append(out.Data, model{ID: ck.GetTinkerPath(), Object: "model", Created: ck.GetCreateTime().GetSeconds(), OwnedBy: "workspace",
			BaseModel: ck.GetBaseModel(), Entry: weights(bases, ck.GetBaseModel())})
	}
	if s.svc.Deployments != nil {
		deps, err := s.svc.Deployments.ListDeployments(r.Context(), &loopsv1.ListDeploymentsRequest{})
		if err != nil {
			return err
		}
		for _, d := range deps.GetDeployments() {
			for _, m := range d.GetModels() {
				out.Data = append(out.Data, model{ID: m, Object: "model", Created: d.GetCreateTime().GetSeconds(), OwnedBy: d.GetOwner(),
					BaseModel: d.GetBaseModel(), Entry: weights(bases, d.GetBaseModel())})
			}
		}
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
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
	base, path, err := infer.ParseModel(id)
	if err != nil {
		return err
	}
	res, err := s.svc.Models.ListModels(r.Context(), &loopsv1.ListModelsRequest{})
	if err != nil {
		return err
	}
	bases := map[string]*loopsv1.ModelInfo{}
	for _, m := range res.GetModels() {
		bases[m.GetName()] = m
	}
	out := model{ID: id, Object: "model", OwnedBy: "loops"}
	if base != "" {
		m, found := bases[base]
		if !found && path == "" {
			if d := s.deploymentModel(r.Context(), base); d != nil {
				out.Created, out.OwnedBy = d.GetCreateTime().GetSeconds(), d.GetOwner()
				out.BaseModel, out.Entry = d.GetBaseModel(), weights(bases, d.GetBaseModel())
				s.edge.WriteJSON(w, http.StatusOK, out)
				return nil
			}
		}
		if !found {
			return &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, param: "model", code: "model_not_found",
				message: "model " + infer.Truncate(base) + " is not served (GET /models lists those that are)"}
		}
		out.Entry = catalog.Of(m)
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
		out.BaseModel, out.Entry = ck.GetBaseModel(), weights(bases, ck.GetBaseModel())
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}
