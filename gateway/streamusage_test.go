package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// streamCutMaxTokens is long enough that a greedy stream of loops/tiny is still decoding
// when the test's client goes away (checked: the stream's usage is below it).
const streamCutMaxTokens = 1500

// TestDisconnectedStreamIsMetered: a client that reads a few chunks of a streamed answer
// and closes the stream is metered its prompt and at least every token it was sent, on the
// OpenAI and on the Anthropic route (before, both were metered nothing).
func TestDisconnectedStreamIsMetered(t *testing.T) {
	url := startServer(t)
	usage := loopsv1connect.NewUsageServiceClient(http.DefaultClient, url, withKey(keyA))
	totals := func() (prompt, sampled int64) {
		for _, b := range must(usage.GetUsage(t.Context(), &loopsv1.GetUsageRequest{})).GetBuckets() {
			switch b.GetKind() {
			case loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS:
				prompt += b.GetAmount()
			case loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:
				sampled += b.GetAmount()
			}
		}
		return prompt, sampled
	}
	post := func(path string, body map[string]any) *http.Response {
		t.Helper()
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, bytes.NewReader(raw))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+keyA)
		req.Header.Set("x-api-key", keyA)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		return resp
	}
	// readChunks reads n data events that carry text and closes the stream.
	readChunks := func(resp *http.Response, n int, hasText func(map[string]any) bool) {
		t.Helper()
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for got := 0; got < n && sc.Scan(); {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var d map[string]any
			require.NoError(t, json.Unmarshal([]byte(data), &d))
			if hasText(d) {
				got++
			}
		}
		require.NoError(t, sc.Err())
	}
	const chunks = 5
	for _, route := range []struct {
		name, path string
		body       func(stream bool, maxTokens int) map[string]any
		// promptTokens is the prompt's token count, read from a short answer's usage.
		promptTokens func(*http.Response) int64
		hasText      func(map[string]any) bool
	}{
		{
			name: "openai", path: "/oai/api/v1/completions",
			body: func(stream bool, maxTokens int) map[string]any {
				return map[string]any{"model": tiny.Name, "prompt": "Once upon a time", "max_tokens": maxTokens, "temperature": 0, "stream": stream}
			},
			promptTokens: func(resp *http.Response) int64 {
				defer resp.Body.Close()
				var out struct {
					Usage struct {
						PromptTokens int64 `json:"prompt_tokens"`
					} `json:"usage"`
				}
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
				return out.Usage.PromptTokens
			},
			hasText: func(d map[string]any) bool {
				ch, _ := d["choices"].([]any)
				return len(ch) > 0 && ch[0].(map[string]any)["text"] != ""
			},
		},
		{
			name: "anthropic", path: "/anthropic/api/v1/messages",
			body: func(stream bool, maxTokens int) map[string]any {
				return map[string]any{"model": tiny.Name, "max_tokens": maxTokens, "temperature": 0, "stream": stream,
					"messages": []map[string]any{{"role": "user", "content": "Once upon a time"}}}
			},
			promptTokens: func(resp *http.Response) int64 {
				defer resp.Body.Close()
				var out struct {
					Usage struct {
						InputTokens int64 `json:"input_tokens"`
					} `json:"usage"`
				}
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
				return out.Usage.InputTokens
			},
			hasText: func(d map[string]any) bool { return d["type"] == "content_block_delta" },
		},
	} {
		t.Run(route.name, func(t *testing.T) {
			prompt := route.promptTokens(post(route.path, route.body(false, 1)))
			require.Positive(t, prompt)
			p0, s0 := totals()
			readChunks(post(route.path, route.body(true, streamCutMaxTokens)), chunks, route.hasText)
			var p, s int64
			require.Eventually(t, func() bool {
				p, s = totals()
				return p > p0
			}, 20*time.Second, 20*time.Millisecond, "the cut stream's prompt is metered")
			require.Equal(t, prompt, p-p0, "its prompt, once")
			require.GreaterOrEqual(t, s-s0, int64(chunks), "at least every token sent (a chunk holds one or more)")
			require.Less(t, s-s0, int64(streamCutMaxTokens), "the stream was cut before its end")
		})
	}
}
