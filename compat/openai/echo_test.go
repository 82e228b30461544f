package openai_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
)

// legacyLogprobs is a completion choice's logprobs as a client reads them.
type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type legacyCompletion struct {
	Choices []struct {
		Text         string         `json:"text"`
		Index        int            `json:"index"`
		Logprobs     legacyLogprobs `json:"logprobs"`
		FinishReason string         `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func complete(t *testing.T, url string, body map[string]any) legacyCompletion {
	t.Helper()
	st, b := call(t, "POST", url+"/completions", keyA, body)
	require.Equal(t, http.StatusOK, st, string(b))
	var out legacyCompletion
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	return out
}

// TestEcho: echo with logprobs returns the prompt's own log-probs (first null) and then the
// sampled tokens', in OpenAI's legacy shape, for max_tokens 0, 1 and more, string and token
// prompts, batched. Each prompt position's alternatives are checked against the
// alternatives of a token sampled after that prefix (a separate request: the decoding
// path, not the prompt scoring path), so the prompt log-probs are the model's next-token
// distribution at each position.
func TestEcho(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	const prompt = "hello world, the cat sat"

	one := complete(t, url, map[string]any{"model": tiny.Name, "prompt": prompt, "echo": true, "logprobs": 5, "max_tokens": 1, "temperature": 0, "seed": 1234})
	require.Len(t, one.Choices, 1)
	lp := one.Choices[0].Logprobs
	n := one.Usage.PromptTokens
	require.Greater(t, n, 2)
	require.Equal(t, 1, one.Usage.CompletionTokens)
	require.Len(t, lp.Tokens, n+1, "the prompt's tokens, then the sampled one")
	require.Len(t, lp.TokenLogprobs, n+1)
	require.Len(t, lp.TopLogprobs, n+1)
	require.Nil(t, lp.TokenLogprobs[0], "the first prompt token has no context")
	require.Nil(t, lp.TopLogprobs[0])
	joined := ""
	for i, tok := range lp.Tokens {
		require.Equal(t, len(joined), lp.TextOffset[i], "text_offset of token %d", i)
		joined += tok
	}
	require.Equal(t, one.Choices[0].Text, joined, "the text is the prompt and the completion, token by token")
	require.Equal(t, prompt, one.Choices[0].Text[:len(prompt)])

	// The same prompt as token ids, scored alone (max_tokens 0): the same log-probs.
	ids := tokenIDsOf(t, prompt)
	require.Len(t, ids, n)
	zero := complete(t, url, map[string]any{"model": tiny.Name, "prompt": ids, "echo": true, "logprobs": 5, "max_tokens": 0})
	z := zero.Choices[0]
	require.Equal(t, prompt, z.Text, "max_tokens 0: the prompt alone")
	require.Equal(t, "length", z.FinishReason)
	require.Equal(t, 0, zero.Usage.CompletionTokens)
	require.Equal(t, lp.Tokens[:n], z.Logprobs.Tokens)
	for i := 1; i < n; i++ {
		require.InDelta(t, *lp.TokenLogprobs[i], *z.Logprobs.TokenLogprobs[i], 1e-6, "token %d", i)
	}

	// Position i's alternatives are those of a token greedily sampled after ids[:i]; the
	// prompt's own token's log-prob is among them when it is in the top 5.
	for i := 1; i < n; i++ {
		next := complete(t, url, map[string]any{"model": tiny.Name, "prompt": ids[:i], "logprobs": 5, "max_tokens": 1, "temperature": 0})
		want := next.Choices[0].Logprobs.TopLogprobs[0]
		got := lp.TopLogprobs[i]
		require.Len(t, got, len(want), "position %d", i)
		for k, v := range want {
			require.InDelta(t, v, got[k], 1e-4, "position %d, token %q", i, k)
		}
		if v, ok := got[lp.Tokens[i]]; ok {
			require.InDelta(t, v, *lp.TokenLogprobs[i], 1e-4, "position %d", i)
		}
		require.LessOrEqual(t, *lp.TokenLogprobs[i], 0.0)
	}
	// The sampled token after the prompt is the one a plain request samples.
	plain := complete(t, url, map[string]any{"model": tiny.Name, "prompt": prompt, "logprobs": 0, "max_tokens": 1, "temperature": 0})
	require.Equal(t, plain.Choices[0].Logprobs.Tokens[0], lp.Tokens[n])
	require.InDelta(t, *plain.Choices[0].Logprobs.TokenLogprobs[0], *lp.TokenLogprobs[n], 1e-5)

	// Batched token prompts (as lm-eval's local-completions sends them), logprobs 1 and
	// more tokens: each choice echoes its own prompt; logprobs 0 leaves top_logprobs null.
	batch := complete(t, url, map[string]any{"model": tiny.Name, "prompt": [][]int32{ids, ids[:2]}, "echo": true, "logprobs": 0, "max_tokens": 3, "temperature": 0})
	require.Len(t, batch.Choices, 2)
	require.Len(t, batch.Choices[0].Logprobs.Tokens, n+3)
	require.Len(t, batch.Choices[1].Logprobs.Tokens, 2+3)
	require.Nil(t, batch.Choices[1].Logprobs.TopLogprobs[1])
	for i := 1; i < n; i++ {
		require.InDelta(t, *lp.TokenLogprobs[i], *batch.Choices[0].Logprobs.TokenLogprobs[i], 1e-6)
	}
	require.InDelta(t, *lp.TokenLogprobs[1], *batch.Choices[1].Logprobs.TokenLogprobs[1], 1e-6)

	// echo without logprobs: the text only; n choices each echo the prompt.
	plainEcho := complete(t, url, map[string]any{"model": tiny.Name, "prompt": []string{"ab", prompt}, "echo": true, "max_tokens": 2, "n": 2})
	require.Len(t, plainEcho.Choices, 4)
	for i, c := range plainEcho.Choices {
		want := []string{"ab", prompt}[i/2]
		require.Equal(t, want, c.Text[:len(want)])
		require.Empty(t, c.Logprobs.Tokens)
	}
}

// TestEchoBounds: the echo options are range-checked before any work.
func TestEchoBounds(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	long := make([]int, 1000)
	for i := range long {
		long[i] = 5 + i%50
	}
	over := make([]int, 2049)
	for name, tc := range map[string]struct {
		body  map[string]any
		param string
	}{
		"logprobs over 5":           {map[string]any{"prompt": "a", "echo": true, "logprobs": 6, "max_tokens": 1}, "logprobs"},
		"echo not a bool":           {map[string]any{"prompt": "a", "echo": 1}, "echo"},
		"echo streamed":             {map[string]any{"prompt": "a", "echo": true, "stream": true}, "echo"},
		"max_tokens 0 without echo": {map[string]any{"prompt": "a", "max_tokens": 0}, "max_tokens"},
		"prompt over the model":     {map[string]any{"prompt": over, "echo": true, "logprobs": 1, "max_tokens": 0}, "prompt"},
		"prompt + sampled token":    {map[string]any{"prompt": over[:2048], "echo": true, "logprobs": 1, "max_tokens": 0}, ""},
		"alternatives":              {map[string]any{"prompt": long, "echo": true, "logprobs": 5, "max_tokens": 1, "n": 30}, "logprobs"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.body["model"] = tiny.Name
			st, b := call(t, "POST", url+"/completions", keyA, tc.body)
			require.Equal(t, http.StatusBadRequest, st, string(b))
			var e errResp
			require.NoError(t, json.Unmarshal(b, &e), string(b))
			require.NotEmpty(t, e.Error.Message)
			t.Log(e.Error.Message)
			if tc.param != "" {
				require.NotNil(t, e.Error.Param, e.Error.Message)
				require.Equal(t, tc.param, *e.Error.Param, e.Error.Message)
			}
		})
	}
}

// tokenIDsOf is text tokenized with loops/tiny's tokenizer.
func tokenIDsOf(t *testing.T, text string) []int32 {
	t.Helper()
	var out []int32
	for _, id := range tiny.Tokenizer().Encode(text) {
		out = append(out, int32(id))
	}
	return out
}

// TestTopLogprobsKeysUnique: on loops/tiny, whose byte tokens are not valid UTF-8 alone,
// no legacy top_logprobs object repeats a key (before, most objects of a long sample did,
// and a parser kept the last, often not the most likely), and in a greedy sample each
// token's own key holds its logprob, the largest of the object (lm-eval's greedy test).
func TestTopLogprobsKeysUnique(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	for _, temp := range []float64{0, 1} {
		st, b := call(t, "POST", url+"/completions", keyA, map[string]any{"model": tiny.Name, "prompt": "é ü — ", "echo": true,
			"logprobs": 5, "max_tokens": 96, "temperature": temp, "seed": 7})
		require.Equal(t, http.StatusOK, st, string(b))
		objects, dups := duplicateKeys(t, b)
		require.Greater(t, objects, 96)
		require.Zero(t, dups, "objects with a repeated key")
		if temp != 0 {
			continue
		}
		var out legacyCompletion
		require.NoError(t, json.Unmarshal(b, &out))
		lp := out.Choices[0].Logprobs
		for i := out.Usage.PromptTokens; i < len(lp.Tokens); i++ {
			best := -1e9
			for _, v := range lp.TopLogprobs[i] {
				best = max(best, v)
			}
			require.InDelta(t, best, *lp.TokenLogprobs[i], 1e-6, "token %d %q", i, lp.Tokens[i])
			require.InDelta(t, *lp.TokenLogprobs[i], lp.TopLogprobs[i][lp.Tokens[i]], 1e-6, "token %d %q", i, lp.Tokens[i])
		}
	}
}

// duplicateKeys walks a JSON document and counts its objects and those that repeat a key.
func duplicateKeys(t *testing.T, b []byte) (objects, dups int) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func() // reads one value
	walk = func() {
		tok, err := dec.Token()
		require.NoError(t, err)
		switch tok {
		case json.Delim('{'):
			objects++
			seen, dup := map[string]bool{}, false
			for dec.More() {
				k, err := dec.Token()
				require.NoError(t, err)
				dup = dup || seen[k.(string)]
				seen[k.(string)] = true
				walk()
			}
			_, err = dec.Token()
			require.NoError(t, err)
			if dup {
				dups++
			}
		case json.Delim('['):
			for dec.More() {
				walk()
			}
			_, err = dec.Token()
			require.NoError(t, err)
		}
	}
	walk()
	return objects, dups
}
