package openai_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
)

type topChat struct {
	Choices []struct {
		Logprobs struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float32 `json:"logprob"`
				Bytes       []int   `json:"bytes"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float32 `json:"logprob"`
					Bytes   []int   `json:"bytes"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
}

// TestTopLogprobs: chat top_logprobs and completion logprobs k carry the engine's
// alternatives (the engine's values are checked against float64 in backends/reference):
// k of them per token, most likely first, the greedy token first with its own logprob; a
// stream carries the same ones.
func TestTopLogprobs(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	body := map[string]any{"model": tiny.Name, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 4,
		"messages": []map[string]any{{"role": "user", "content": "Hello"}}}
	st, b := call(t, "POST", url+"/chat/completions", keyA, body)
	require.Equal(t, http.StatusOK, st, string(b))
	var plain topChat
	require.NoError(t, json.Unmarshal(b, &plain))
	content := plain.Choices[0].Logprobs.Content
	require.NotEmpty(t, content)
	for _, tok := range content {
		require.Len(t, tok.TopLogprobs, 4)
		require.Equal(t, tok.Token, tok.TopLogprobs[0].Token, "greedy: the sampled token is the most likely")
		require.Equal(t, tok.Logprob, tok.TopLogprobs[0].Logprob)
		for j := 1; j < 4; j++ {
			require.LessOrEqual(t, tok.TopLogprobs[j].Logprob, tok.TopLogprobs[j-1].Logprob)
		}
	}

	body["stream"] = true
	var streamed []json.RawMessage
	for _, c := range stream(t, url+"/chat/completions", body) {
		for _, ch := range c["choices"].([]any) {
			if lp, ok := ch.(map[string]any)["logprobs"].(map[string]any); ok {
				for _, tok := range lp["content"].([]any) {
					raw, err := json.Marshal(tok)
					require.NoError(t, err)
					streamed = append(streamed, raw)
				}
			}
		}
	}
	require.Len(t, streamed, len(content))
	for i, raw := range streamed {
		want, err := json.Marshal(content[i])
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(raw), "token %d", i)
	}

	st, b = call(t, "POST", url+"/completions", keyA, map[string]any{"model": tiny.Name, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "logprobs": 2})
	require.Equal(t, http.StatusOK, st, string(b))
	var cmpl struct {
		Choices []struct {
			Logprobs struct {
				TokenLogprobs []float32            `json:"token_logprobs"`
				TopLogprobs   []map[string]float32 `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(b, &cmpl))
	lp := cmpl.Choices[0].Logprobs
	require.Len(t, lp.TopLogprobs, len(lp.TokenLogprobs))
	for i, m := range lp.TopLogprobs {
		require.NotEmpty(t, m)
		require.LessOrEqual(t, len(m), 2)
		best := float32(-1e9)
		for _, v := range m {
			best = max(best, v)
		}
		require.Equal(t, lp.TokenLogprobs[i], best, "greedy: the sampled token has the top logprob")
	}
}
