package anthropic

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/loops-dev/loops/compat/internal/infer"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/telemetry"
)

// streamWriteTimeout bounds one write of a stream: a client that reads nothing for that
// long is gone, and its sample is stopped.
const streamWriteTimeout = 30 * time.Second

func (s *server) messages(w http.ResponseWriter, r *http.Request) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := decodeRequest(b, false)
	if err != nil {
		return err
	}
	in := &infer.Request{Model: req.model, Messages: req.conversation(), Prefill: req.prefill(), N: 1, Params: &loopsv1.SamplingParams{
		MaxTokens: req.maxTokens, Temperature: req.temperature, TopK: req.topK, TopP: req.topP, StopStrings: req.stop,
	}}
	if req.toolsActive() {
		in.Tools, in.ToolChoice = req.tools, req.toolChoice
	}
	if req.stream {
		run, err := s.engine.Stream(r.Context(), in)
		if err != nil {
			return err
		}
		defer run.Close()
		s.stream(w, r, req, run)
		return nil
	}
	c, err := s.engine.Sample(r.Context(), in)
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, messageOf(req, c, true))
	return nil
}

func (s *server) countTokens(w http.ResponseWriter, r *http.Request) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := decodeRequest(b, true)
	if err != nil {
		return err
	}
	in := &infer.Request{Model: req.model, Messages: req.conversation(), Prefill: req.prefill()}
	if req.toolsActive() {
		in.Tools, in.ToolChoice = req.tools, req.toolChoice
	}
	prompts, err := s.engine.Tokens(r.Context(), in)
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{len(prompts[0])})
	return nil
}

// usage is Anthropic's token count of a message. As Anthropic counts them, InputTokens
// leaves out the prompt tokens served from the engine's prefix cache, which are
// CacheReadInputTokens (billed as cached prefill; the OpenAI route's
// prompt_tokens_details.cached_tokens): the prompt is their sum. Nothing is written to a
// cache at a price of its own, so CacheCreationInputTokens is always 0.
type usage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

// usageOf is the completion's usage so far: the cached prompt tokens are known once its
// samples finish, so message_start counts the whole prompt as input and message_delta
// gives the split.
func usageOf(c *infer.Completion) usage {
	p, g := c.Usage()
	cached := min(max(c.CachedTokens, 0), p)
	return usage{InputTokens: p - cached, CacheReadInputTokens: cached, OutputTokens: g}
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// block is a content block of an answer: text, or a tool_use.
type block struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// toolUses gives parsed calls their ids, as tool_use blocks.
func toolUses(parsed []infer.ToolCall) []block {
	out := make([]block, len(parsed))
	for k, p := range parsed {
		out[k] = block{Type: "tool_use", ID: infer.NewCallID("toolu_"), Name: p.Name, Input: p.Arguments}
	}
	return out
}

// answer is the completion's content blocks: its text, then the tool calls parsed from it
// when tools are active.
func (req *request) answer(c *infer.Completion) []block {
	text := c.ChoiceText(0)
	var calls []infer.ToolCall
	if req.toolsActive() {
		text, calls = infer.ParseToolCalls(c.Text.ToolFormat(), c.Forced+text, req.tools, req.maxCalls())
		if len(calls) == 0 {
			text = c.Forced + c.ChoiceText(0)
		}
	}
	var out []block
	if text != "" || len(calls) == 0 {
		out = append(out, block{Type: "text", Text: &text})
	}
	return append(out, toolUses(calls)...)
}

// message is Anthropic's Message object.
type message struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	Role         string  `json:"role"`
	Model        string  `json:"model"`
	Content      []block `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        usage   `json:"usage"`
}

// stopReason is Anthropic's stop_reason of the completion's one choice, and the stop
// sequence it ended on; called says whether the answer made tool calls (an answer cut at
// max_tokens is max_tokens all the same).
func stopReason(c *infer.Completion, called bool) (reason string, seq *string) {
	switch {
	case !c.Stopped(0):
		return "max_tokens", nil
	case called:
		return "tool_use", nil
	case c.StopSequence(0) != "":
		s := c.StopSequence(0)
		return "stop_sequence", &s
	}
	return "end_turn", nil
}

// messageOf is the completion as a Message; done says whether it is complete (it is not
// in message_start).
func messageOf(req *request, c *infer.Completion, done bool) message {
	m := message{ID: "msg_" + c.ID, Type: "message", Role: "assistant", Model: req.model, Content: []block{}}
	m.Usage = usageOf(c)
	if done {
		m.Content = req.answer(c)
		reason, seq := stopReason(c, m.Content[len(m.Content)-1].Type == "tool_use")
		m.StopReason, m.StopSequence = &reason, seq
	}
	return m
}

// stream answers with Anthropic's server-sent events while the sample decodes:
// message_start, content_block_start, ping, a content_block_delta per batch of new text,
// content_block_stop, message_delta (stop_reason and the output tokens), message_stop. A
// sample that fails after message_start ends the stream with an error event.
func (s *server) stream(w http.ResponseWriter, r *http.Request, req *request, run *infer.Run) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var werr error
	send := func(event string, v any) {
		if werr != nil {
			return
		}
		b, err := json.Marshal(v)
		if err != nil {
			s.log.Error("anthropic: cannot encode a stream event", "err", err)
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, werr = w.Write([]byte("event: " + event + "\ndata: " + string(b) + "\n\n")); werr == nil {
			werr = rc.Flush()
		}
	}
	c := run.Completion()
	start := messageOf(req, c, false)
	send("message_start", map[string]any{"type": "message_start", "message": start})
	// With tools, the text goes through a splitter (text that may be part of a call is held
	// back), its block starts with its first text, and the calls' blocks follow it.
	var sp *infer.ToolSplitter
	if req.toolsActive() {
		sp = infer.NewToolSplitter(c.Text.ToolFormat(), req.tools, req.maxCalls(), c.Forced)
	}
	blocks := 0 // content blocks started
	text := func(t string) {
		if blocks == 0 {
			send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": textBlock{Type: "text"}})
			blocks = 1
		}
		if t != "" {
			send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]string{"type": "text_delta", "text": t}})
		}
	}
	if sp == nil {
		text("")
	}
	send("ping", map[string]string{"type": "ping"})
	var calls []infer.ToolCall
	for werr == nil {
		chunks, err := run.Next(r.Context())
		if infer.IsDone(err) {
			break
		}
		if err != nil {
			if errs.ClientGone(r.Context()) {
				return
			}
			status, body, id := classify(err)
			if id != "" {
				telemetry.NoteError(r.Context(), id)
			}
			if id != "" || status >= 500 {
				s.log.ErrorContext(r.Context(), "anthropic: stream failed", "path", r.URL.Path, "status", status, "error_id", id, "err", err)
			}
			send("error", errorEnvelope{Type: "error", Error: body})
			return
		}
		for _, ch := range chunks {
			t := ch.Text
			if sp != nil {
				t = sp.Feed(t)
				if ch.Done {
					var rest string
					rest, calls = sp.Finish()
					t += rest
				}
			}
			if t != "" {
				text(t)
			}
		}
	}
	if werr != nil {
		s.log.InfoContext(r.Context(), "anthropic: stream client gone; its sample is stopped", "path", r.URL.Path, "err", werr)
		return
	}
	if blocks == 0 && len(calls) == 0 {
		text("") // an empty answer is one empty text block
	}
	if blocks == 1 {
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	}
	for _, u := range toolUses(calls) {
		i := blocks
		blocks++
		args := u.Input
		u.Input = json.RawMessage("{}")
		send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": u})
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
			"delta": map[string]string{"type": "input_json_delta", "partial_json": string(args)}})
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	reason, seq := stopReason(c, len(calls) > 0)
	send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq}, "usage": usageOf(c)})
	send("message_stop", map[string]string{"type": "message_stop"})
}
