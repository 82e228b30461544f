package openai

import (
	"encoding/json"
	"net/http"
)

// The core samples a whole sequence at a time, so a streamed answer is sent when the sample
// completes: per choice a chunk with the role (chat), one with the text and one with the
// finish_reason, then the usage chunk when stream_options.include_usage asks for it, then
// "data: [DONE]".

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
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

// stream writes the completion as server-sent events.
func (s *server) stream(w http.ResponseWriter, req *request, c *completion, created int64) error {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) {
		b, err := json.Marshal(v)
		if err != nil {
			s.log.Error("openai: cannot encode a stream chunk", "err", err)
			return
		}
		_, _ = w.Write([]byte("data: "))
		_, _ = w.Write(b)
		_, _ = w.Write([]byte("\n\n"))
		_ = rc.Flush()
	}
	u := c.usage()
	if req.chat {
		id := "chatcmpl-" + c.opID
		chunk := func(ch chatChunkChoice) chatChunk {
			return chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.model,
				Choices: []chatChunkChoice{ch}, withUsage: req.includeUsage}
		}
		for i, seq := range c.seqs {
			empty := ""
			send(chunk(chatChunkChoice{Index: i, Delta: chatDelta{Role: "assistant", Content: &empty}}))
			text := c.choiceText(req, seq)
			ch := chatChunkChoice{Index: i, Delta: chatDelta{Content: &text}}
			if req.logprobs {
				ch.Logprobs = c.chatLogprobs(seq)
			}
			send(chunk(ch))
			fr := finishReason(seq)
			send(chunk(chatChunkChoice{Index: i, FinishReason: &fr}))
		}
		if req.includeUsage {
			send(chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.model,
				Choices: []chatChunkChoice{}, Usage: &u, withUsage: true})
		}
	} else {
		id := "cmpl-" + c.opID
		chunk := func(ch completionChoice) completionChunk {
			return completionChunk{textCompletion: textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.model,
				Choices: []completionChoice{ch}}, withUsage: req.includeUsage}
		}
		for i, seq := range c.seqs {
			ch := completionChoice{Text: c.choiceText(req, seq), Index: i}
			if req.logprobs {
				ch.Logprobs = c.completionLogprobs(seq)
			}
			send(chunk(ch))
			fr := finishReason(seq)
			send(chunk(completionChoice{Index: i, FinishReason: &fr}))
		}
		if req.includeUsage {
			send(completionChunk{textCompletion: textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.model,
				Choices: []completionChoice{}, Usage: &u}, withUsage: true})
		}
	}
	_, _ = w.Write([]byte("data: [DONE]\n\n"))
	_ = rc.Flush()
	return nil
}
