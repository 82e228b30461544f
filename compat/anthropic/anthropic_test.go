package anthropic_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
)

const keyA = "tml-anthropic-key-a"

// startServer runs a gateway with the reference engine on 127.0.0.1:0.
func startServer(t *testing.T) string {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

// answer is a status and a raw body.
type answer struct {
	status int
	body   []byte
}

// post sends body with the key in x-api-key (or as a bearer token) and returns the status
// and the raw answer.
func post(t *testing.T, url string, body any, bearer bool) answer {
	t.Helper()
	raw, ok := body.(string)
	if !ok {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		raw = string(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	if bearer {
		req.Header.Set("Authorization", "Bearer "+keyA)
	} else {
		req.Header.Set("x-api-key", keyA)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, b}
}

type message struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        struct {
		InputTokens              int  `json:"input_tokens"`
		CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
		OutputTokens             int  `json:"output_tokens"`
	} `json:"usage"`
}

func decode[T any](t *testing.T, a answer) T {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	var v T
	require.NoError(t, json.Unmarshal(a.body, &v))
	return v
}

// TestMessagesMatchOpenAIChat: a Messages request samples the same prompt as the OpenAI
// chat route (the system prompt first, the model's chat template) and answers the same
// greedy text, with Anthropic's fields; count_tokens counts that prompt.
func TestMessagesMatchOpenAIChat(t *testing.T) {
	base := startServer(t)
	url := base + "/anthropic/api/v1/messages"
	body := map[string]any{"model": tiny.Name, "max_tokens": 16, "temperature": 0, "system": "Be brief.",
		"messages": []map[string]any{{"role": "user", "content": "Hello world!"}, {"role": "assistant", "content": "Hi."},
			{"role": "user", "content": []map[string]any{{"type": "text", "text": "Again", "cache_control": map[string]string{"type": "ephemeral"}}}}}}
	m := decode[message](t, post(t, url, body, false))
	require.Equal(t, "message", m.Type)
	require.Equal(t, "assistant", m.Role)
	require.Equal(t, tiny.Name, m.Model)
	require.True(t, strings.HasPrefix(m.ID, "msg_"), m.ID)
	require.Len(t, m.Content, 1)
	require.Equal(t, "text", m.Content[0].Type)
	require.Contains(t, []string{"end_turn", "max_tokens"}, m.StopReason)

	oa := decode[struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}](t, postOpenAI(t, base+"/oai/api/v1/chat/completions", map[string]any{"model": tiny.Name, "max_tokens": 16, "temperature": 0,
		"messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"},
			{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again"}}}))
	require.Equal(t, oa.Choices[0].Message.Content, m.Content[0].Text)
	require.Equal(t, oa.Usage.PromptTokens, m.Usage.InputTokens)
	require.Equal(t, oa.Usage.CompletionTokens, m.Usage.OutputTokens)
	require.Equal(t, map[string]string{"stop": "end_turn", "length": "max_tokens"}[oa.Choices[0].FinishReason], m.StopReason)

	count := decode[struct {
		InputTokens int `json:"input_tokens"`
	}](t, post(t, url+"/count_tokens", map[string]any{"model": tiny.Name, "system": body["system"], "messages": body["messages"]}, true))
	require.Equal(t, m.Usage.InputTokens, count.InputTokens)
}

func postOpenAI(t *testing.T, url string, body any) answer {
	return post(t, url, body, true)
}

// TestStopSequence: the answer ends before the stop sequence it met, which stop_reason and
// stop_sequence name.
func TestStopSequence(t *testing.T) {
	url := startServer(t) + "/anthropic/api/v1/messages"
	body := map[string]any{"model": tiny.Name, "max_tokens": 24, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "Tell me"}}}
	full := decode[message](t, post(t, url, body, false)).Content[0].Text
	require.GreaterOrEqual(t, len([]rune(full)), 4, "loops/tiny's greedy answer is long enough to cut: %q", full)
	stop := string([]rune(full)[2:4])
	body["stop_sequences"] = []string{stop}
	m := decode[message](t, post(t, url, body, false))
	require.Equal(t, "stop_sequence", m.StopReason)
	require.NotNil(t, m.StopSequence)
	require.Equal(t, stop, *m.StopSequence)
	require.Equal(t, full[:strings.Index(full, stop)], m.Content[0].Text)
}

// event is one server-sent event.
type event struct {
	name string
	data map[string]any
}

func streamEvents(t *testing.T, url string, body map[string]any) []event {
	t.Helper()
	body["stream"] = true
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("x-api-key", keyA)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var out []event
	sc := bufio.NewScanner(resp.Body)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d))
			require.Equal(t, name, d["type"], "the event name is the data's type")
			out = append(out, event{name, d})
		default:
			require.Empty(t, line)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// TestStream: Anthropic's event sequence, whose text deltas add up to the non-streamed
// answer and whose message_delta carries its stop_reason and output tokens.
func TestStream(t *testing.T) {
	url := startServer(t) + "/anthropic/api/v1/messages"
	body := func() map[string]any {
		return map[string]any{"model": tiny.Name, "max_tokens": 20, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "Stream this"}}}
	}
	want := decode[message](t, post(t, url, body(), false))
	evs := streamEvents(t, url, body())
	var names []string
	var text strings.Builder
	for _, e := range evs {
		if len(names) == 0 || names[len(names)-1] != e.name {
			names = append(names, e.name)
		}
		if e.name == "content_block_delta" {
			d := e.data["delta"].(map[string]any)
			require.Equal(t, "text_delta", d["type"])
			text.WriteString(d["text"].(string))
		}
	}
	require.Equal(t, []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}, names)
	require.Equal(t, want.Content[0].Text, text.String())
	start := evs[0].data["message"].(map[string]any)
	require.Equal(t, float64(want.Usage.InputTokens), start["usage"].(map[string]any)["input_tokens"])
	require.Empty(t, start["content"])
	delta := evs[len(evs)-2].data
	require.Equal(t, want.StopReason, delta["delta"].(map[string]any)["stop_reason"])
	require.Equal(t, float64(want.Usage.OutputTokens), delta["usage"].(map[string]any)["output_tokens"])
}

// TestBadRequests: Anthropic's error shape, and unsupported fields named.
func TestBadRequests(t *testing.T) {
	base := startServer(t)
	url := base + "/anthropic/api/v1/messages"
	msgs := []map[string]any{{"role": "user", "content": "x"}}
	for _, c := range []struct {
		body    any
		status  int
		typ     string
		mention string
	}{
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs, "tools": []any{map[string]any{"type": "web_search_20250305", "name": "web_search"}}}, 400, "invalid_request_error", "tools[0].type"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs, "tools": []any{map[string]any{"name": "f"}}}, 400, "invalid_request_error", "tools[0].input_schema"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs, "tool_choice": map[string]any{"type": "any"}}, 400, "invalid_request_error", "tool_choice"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs, "temperature": 1.5}, 400, "invalid_request_error", "temperature"},
		{map[string]any{"model": tiny.Name, "messages": msgs}, 400, "invalid_request_error", "max_tokens"},
		{map[string]any{"model": tiny.Name, "max_tokens": 0, "messages": msgs}, 400, "invalid_request_error", "max_tokens"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": []map[string]any{{"role": "assistant", "content": "y"}, {"role": "user", "content": "x"}}}, 400, "invalid_request_error", "messages[0].role"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": []map[string]any{{"role": "system", "content": "x"}}}, 400, "invalid_request_error", "messages[0].role"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": pic}}}}}}, 400, "invalid_request_error", "model loops/tiny takes [text] input only, not images"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs, "thinking": map[string]any{"type": "enabled"}}, 400, "invalid_request_error", "thinking"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs, "metadata": map[string]any{"other": 1}}, 400, "invalid_request_error", "metadata.other"},
		{map[string]any{"model": tiny.Name, "max_tokens": 4000000, "messages": msgs}, 400, "invalid_request_error", "max_tokens"},
		{map[string]any{"model": "tinker://nope/sampler_weights/x", "max_tokens": 4, "messages": msgs}, 404, "not_found_error", "nope"},
		{`{"model":"m","model":"m"}`, 400, "invalid_request_error", "model"},
		{`[1]`, 400, "invalid_request_error", "JSON object"},
	} {
		a := post(t, url, c.body, false)
		st, b := a.status, a.body
		require.Equal(t, c.status, st, "%v: %s", c.body, b)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(b, &e), string(b))
		require.Equal(t, "error", e.Type)
		require.Equal(t, c.typ, e.Error.Type, string(b))
		require.Contains(t, e.Error.Message, c.mention)
	}
	a := post(t, url, map[string]any{"model": "no/such-model", "max_tokens": 4, "messages": msgs}, false)
	require.Equal(t, 404, a.status, "an unknown model is Anthropic's not_found_error: %s", a.body)
	require.Contains(t, string(a.body), `"not_found_error"`)
	require.Contains(t, string(a.body), "no/such-model")
	a = post(t, url+"/count_tokens", map[string]any{"model": tiny.Name, "max_tokens": 4, "messages": msgs}, false)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, string(a.body), "max_tokens")
	require.Equal(t, http.StatusNotFound, post(t, base+"/anthropic/api/v1/complete", map[string]any{}, false).status)

	// The gateway authenticates the route with the same keys.
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("x-api-key", "tml-not-a-key")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestPrefill: a last assistant turn is a prefill: the answer continues it, its content is
// the continuation only, and it equals what the OpenAI completions route gives for the
// template's text followed by the prefill (loops/tiny's ChatML template written out here).
func TestPrefill(t *testing.T) {
	base := startServer(t)
	url := base + "/anthropic/api/v1/messages"
	msgs := []map[string]any{{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}}
	m := decode[message](t, post(t, url, map[string]any{"model": tiny.Name, "max_tokens": 8, "temperature": 0, "system": "Be brief.", "messages": msgs}, false))
	require.Len(t, m.Content, 1)

	oa := decode[struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}](t, postOpenAI(t, base+"/oai/api/v1/completions", map[string]any{"model": tiny.Name, "max_tokens": 8, "temperature": 0,
		"prompt": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\nThe color is"}))
	require.Equal(t, oa.Choices[0].Text, m.Content[0].Text, "the answer continues the prefill")
	require.Equal(t, oa.Usage.PromptTokens, m.Usage.InputTokens, "the prefill counts as input")

	count := decode[struct {
		InputTokens int `json:"input_tokens"`
	}](t, post(t, url+"/count_tokens", map[string]any{"model": tiny.Name, "system": "Be brief.", "messages": msgs}, true))
	require.Equal(t, m.Usage.InputTokens, count.InputTokens)
}

// TestPromptLimits: messages over loops/tiny's 2,048 tokens are refused with a 400 that
// gives the limit, by messages and by count_tokens alike: from their size in bytes when
// they cannot fit, before any work, and while tokenizing otherwise. Today's main tokenized
// them whole first, and count_tokens answered their count.
func TestPromptLimits(t *testing.T) {
	base := startServer(t)
	for _, c := range []struct {
		content, mention string
	}{
		{strings.Repeat("x", 1<<20), "1048576 bytes of text cannot fit in loops/tiny's limit of 2048 tokens"},
		{strings.Repeat("\U0001F642 ", 4000), "more than 2048 tokens"},
	} {
		msgs := []map[string]any{{"role": "user", "content": c.content}}
		for _, path := range []string{"/anthropic/api/v1/messages", "/anthropic/api/v1/messages/count_tokens"} {
			body := map[string]any{"model": tiny.Name, "messages": msgs}
			if !strings.HasSuffix(path, "count_tokens") {
				body["max_tokens"] = 4
			}
			a := post(t, base+path, body, false)
			require.Equal(t, http.StatusBadRequest, a.status, "%s: %s", path, a.body)
			var e struct {
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(a.body, &e))
			require.Equal(t, "invalid_request_error", e.Error.Type)
			require.Contains(t, e.Error.Message, c.mention)
			require.True(t, strings.HasPrefix(e.Error.Message, "messages"), e.Error.Message)
		}
	}
}

// TestCachedTokensInUsage: a conversation's second turn starts with its first turn's
// prompt, which the reference engine's prefix cache serves. Usage says so as Anthropic
// does: cache_read_input_tokens are the cached prompt tokens, input_tokens the rest (the
// two add up to count_tokens), non-streamed and in the stream's message_delta.
func TestCachedTokensInUsage(t *testing.T) {
	url := startServer(t) + "/anthropic/api/v1/messages"
	system := strings.Repeat("You are a careful assistant who answers briefly. ", 4)
	msgs := []map[string]any{{"role": "user", "content": "Hello world!"}}
	body := func() map[string]any {
		return map[string]any{"model": tiny.Name, "max_tokens": 4, "temperature": 0, "system": system, "messages": msgs}
	}
	count := func() int {
		return decode[struct {
			InputTokens int `json:"input_tokens"`
		}](t, post(t, url+"/count_tokens", map[string]any{"model": tiny.Name, "system": system, "messages": msgs}, true)).InputTokens
	}
	first := decode[message](t, post(t, url, body(), false))
	require.NotNil(t, first.Usage.CacheReadInputTokens)
	require.Zero(t, *first.Usage.CacheReadInputTokens, "nothing was cached yet")
	require.Equal(t, 0, *first.Usage.CacheCreationInputTokens)
	require.Equal(t, count(), first.Usage.InputTokens)

	msgs = append(msgs, map[string]any{"role": "assistant", "content": first.Content[0].Text}, map[string]any{"role": "user", "content": "And then?"})
	second := decode[message](t, post(t, url, body(), false))
	cached, prompt := *second.Usage.CacheReadInputTokens, count()
	require.GreaterOrEqual(t, cached, first.Usage.InputTokens/16*16-16, "the first turn's whole blocks, but maybe the one its end cut")
	require.Zero(t, cached%16)
	require.Positive(t, second.Usage.InputTokens)
	require.Equal(t, prompt, second.Usage.InputTokens+cached, "input_tokens leaves the cached tokens out")

	// The same turn again, streamed: message_start counts the prompt, message_delta splits it.
	evs := streamEvents(t, url, body())
	start := evs[0].data["message"].(map[string]any)["usage"].(map[string]any)
	require.Equal(t, float64(prompt), start["input_tokens"])
	delta := evs[len(evs)-2].data["usage"].(map[string]any)
	again := int(delta["cache_read_input_tokens"].(float64))
	require.GreaterOrEqual(t, again, cached, "the second turn's own blocks are cached now")
	require.Equal(t, float64(prompt-again), delta["input_tokens"])
	require.Equal(t, float64(second.Usage.OutputTokens), delta["output_tokens"])
}

// pic is a 24×16 grey PNG, base64.
const pic = "iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII="
