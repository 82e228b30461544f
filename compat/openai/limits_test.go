package openai_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
)

// TestPromptLimits: prompts over loops/tiny's 2,048 tokens are a 400 context_length_exceeded
// that gives the limit and the fix, found from their size in bytes when they cannot fit
// (before any rendering or tokenizing) and while tokenizing otherwise; and
// n × max_tokens × top_logprobs is bounded before any work. Today's main tokenized any
// prompt whole before its length was checked, and let the product grow unbounded.
func TestPromptLimits(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	chat := func(content string, extra map[string]any) map[string]any {
		m := chatBody(content, map[string]any{"max_tokens": 4})
		maps.Copy(m, extra)
		return m
	}
	for name, tc := range map[string]struct {
		path     string
		body     any
		param    string
		code     string
		contains []string
	}{
		"chat bytes":        {"/chat/completions", chat(strings.Repeat("x", 1<<20), nil), "messages", "context_length_exceeded", []string{"1048576 bytes", "limit of 2048 tokens", "shorten"}},
		"chat tokens":       {"/chat/completions", chat(strings.Repeat("\U0001F642 ", 4000), nil), "messages", "context_length_exceeded", []string{"more than 2048 tokens"}},
		"completion bytes":  {"/completions", map[string]any{"model": tiny.Name, "prompt": []string{"ok", strings.Repeat("y", 1<<20)}}, "prompt[1]", "context_length_exceeded", []string{"bytes"}},
		"completion tokens": {"/completions", map[string]any{"model": tiny.Name, "prompt": strings.Repeat("\U0001F642 ", 4000)}, "prompt", "context_length_exceeded", []string{"more than 2048 tokens"}},
		"token ids":         {"/completions", map[string]any{"model": tiny.Name, "prompt": make([]int, 2049)}, "prompt", "context_length_exceeded", []string{"2049 tokens"}},
		"top_logprobs": {"/chat/completions", chat("Hi", map[string]any{"n": 32, "max_tokens": 1024, "logprobs": true, "top_logprobs": 20}),
			"top_logprobs", "invalid_value", []string{"655360 alternatives", "131072", "lower n, max_tokens or top_logprobs"}},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := call(t, "POST", url+tc.path, keyA, tc.body)
			require.Equal(t, http.StatusBadRequest, status, string(body))
			var e errResp
			require.NoError(t, json.Unmarshal(body, &e), string(body))
			require.Equal(t, "invalid_request_error", e.Error.Type)
			require.NotNil(t, e.Error.Param, string(body))
			require.Equal(t, tc.param, *e.Error.Param)
			require.NotNil(t, e.Error.Code, string(body))
			require.Equal(t, tc.code, *e.Error.Code)
			for _, c := range tc.contains {
				require.Contains(t, e.Error.Message, c)
			}
		})
	}
	// Within the bounds the same requests are served.
	status, body := call(t, "POST", url+"/chat/completions", keyA, chat("Hi", map[string]any{"n": 2, "max_tokens": 4, "logprobs": true, "top_logprobs": 20}))
	require.Equal(t, http.StatusOK, status, string(body))
}
