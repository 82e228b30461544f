package openai

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/loops-dev/loops/compat/internal/infer"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/telemetry"
)

type chatDelta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	// Usage is null on every chunk but the last one when include_usage is set, and absent
	// otherwise (OpenAI's rule).
	Usage *usage `json:"usage,omitempty"`
	// withUsage makes Usage marshal as null rather than be left out.
	withUsage bool
}

func (c chatChunk) MarshalJSON() ([]byte, error) {
	type plain chatChunk
	if !c.withUsage || c.Usage != nil {
		return json.Marshal(plain(c))
	}
	return json.Marshal(struct {
		plain
		Usage *usage `json:"usage"`
	}{plain: plain(c)})
}

type completionChunk struct {
	textCompletion
	withUsage bool
}

func (c completionChunk) MarshalJSON() ([]byte, error) {
	if !c.withUsage || c.Usage != nil {
		return json.Marshal(c.textCompletion)
	}
	return json.Marshal(struct {
		textCompletion
		Usage *usage `json:"usage"`
	}{textCompletion: c.textCompletion})
}

// streamWriteTimeout bounds one write of a stream: a client that reads nothing for that
// long is gone, and its samples are stopped.
const streamWriteTimeout = 30 * time.Second

// stream answers with server-sent events while the samples decode: per choice (chat) a
// chunk with the role, then a chunk per batch of new text (with the logprobs of its tokens
// when asked), then one with the finish_reason, then the usage chunk when
// stream_options.include_usage asks for it, then "data: [DONE]". On a backend that cannot
// stream (a worker sampling with vLLM) a choice's text comes in one chunk when it completes. A
// sample that fails after the first chunk ends the stream with an error event in OpenAI's
// shape and no [DONE].
func (s *server) stream(w http.ResponseWriter, r *http.Request, req *request, run *infer.Run, created int64) error {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var werr error
	write := func(b []byte) {
		if werr != nil {
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, werr = w.Write(b); werr == nil {
			werr = rc.Flush()
		}
	}
	send := func(v any) {
		b, err := json.Marshal(v)
		if err != nil {
			s.log.Error("openai: cannot encode a stream chunk", "err", err)
			return
		}
		write(append(append([]byte("data: "), b...), "\n\n"...))
	}
	c := run.Completion()
	var (
		id       string
		chatFor  func(ch chatChunkChoice) chatChunk
		textFor  func(ch completionChoice) completionChunk
		offsets  []int // completions: bytes of each choice's text sent
		nChoices = len(req.prompts) * int(req.n)
	)
	if req.chat {
		nChoices = int(req.n)
	}
	if req.chat {
		chatFor = func(ch chatChunkChoice) chatChunk {
			return chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.model,
				Choices: []chatChunkChoice{ch}, withUsage: req.includeUsage}
		}
	} else {
		offsets = make([]int, nChoices)
		textFor = func(ch completionChoice) completionChunk {
			return completionChunk{textCompletion: textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.model,
				Choices: []completionChoice{ch}}, withUsage: req.includeUsage}
		}
	}
	id = "cmpl-" + c.ID
	// With tools, each choice's text goes through a splitter: text that may be part of a
	// tool call is held back, and the calls are sent when the choice ends.
	var splitters []*infer.ToolSplitter
	if req.chat && req.toolsActive() {
		splitters = make([]*infer.ToolSplitter, nChoices)
		for i := range splitters {
			splitters[i] = infer.NewToolSplitter(c.Text.ToolFormat(), req.tools, req.maxCalls(), c.Forced)
		}
	}
	if req.chat {
		id = "chatcmpl-" + c.ID
		for i := range nChoices {
			empty := ""
			send(chatFor(chatChunkChoice{Index: i, Delta: chatDelta{Role: "assistant", Content: &empty}}))
		}
	}
	for werr == nil {
		chunks, err := run.Next(r.Context())
		if infer.IsDone(err) {
			break
		}
		if err != nil {
			if errs.ClientGone(r.Context()) {
				return nil
			}
			status, body, eid := classify(err)
			if eid != "" {
				telemetry.NoteError(r.Context(), eid)
			}
			if eid != "" || status >= 500 {
				s.log.ErrorContext(r.Context(), "openai: stream failed", "path", r.URL.Path, "status", status, "error_id", eid, "err", err)
			}
			send(errorEnvelope{body})
			return nil
		}
		for _, ch := range chunks {
			var calls []toolCall
			if splitters != nil && ch.Choice < len(splitters) {
				sp := splitters[ch.Choice]
				ch.Text = sp.Feed(ch.Text)
				if ch.Done {
					rest, parsed := sp.Finish()
					ch.Text += rest
					calls = toolCallsOf(parsed)
				}
			}
			if ch.Text != "" || (req.logprobs && len(ch.Tokens) > 0) {
				if req.chat {
					text := ch.Text
					cc := chatChunkChoice{Index: ch.Choice, Delta: chatDelta{Content: &text}}
					if req.logprobs {
						cc.Logprobs = chatLogprobsOf(c.Text, ch.Tokens)
					}
					send(chatFor(cc))
				} else {
					cc := completionChoice{Text: ch.Text, Index: ch.Choice}
					if req.logprobs {
						cc.Logprobs = completionLogprobsOf(c.Text, ch.Tokens, offsets[ch.Choice], req.topLogprobs > 0)
						for _, t := range ch.Tokens {
							offsets[ch.Choice] += len(c.Text.TokenText(t.ID))
						}
					}
					send(textFor(cc))
				}
			}
			for k, call := range calls {
				// The call's id and name, then its arguments (OpenAI's delta shapes).
				head := call
				head.Index, head.Function.Arguments = &k, ""
				send(chatFor(chatChunkChoice{Index: ch.Choice, Delta: chatDelta{ToolCalls: []toolCall{head}}}))
				send(chatFor(chatChunkChoice{Index: ch.Choice, Delta: chatDelta{ToolCalls: []toolCall{{Index: &k, Function: toolFunction{Arguments: call.Function.Arguments}}}}}))
			}
			if ch.Done {
				fr := req.finishReasonOf(ch.Stopped, len(calls) > 0)
				if req.chat {
					send(chatFor(chatChunkChoice{Index: ch.Choice, FinishReason: &fr}))
				} else {
					send(textFor(completionChoice{Index: ch.Choice, FinishReason: &fr}))
				}
			}
		}
	}
	if werr != nil {
		s.log.InfoContext(r.Context(), "openai: stream client gone; its samples are stopped", "path", r.URL.Path, "err", werr)
		return nil
	}
	if req.includeUsage {
		u := usageOf(c)
		if req.chat {
			send(chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.model,
				Choices: []chatChunkChoice{}, Usage: &u, withUsage: true})
		} else {
			send(completionChunk{textCompletion: textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.model,
				Choices: []completionChoice{}, Usage: &u}, withUsage: true})
		}
	}
	write([]byte("data: [DONE]\n\n"))
	return nil
}
