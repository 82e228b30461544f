package openai_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/compat/openai"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

const keyA, keyB = "tml-openai-key-a", "tml-openai-key-b"

// startServer runs a gateway with the reference engine on 127.0.0.1:0 and two keys.
func startServer(t *testing.T, edit func(*gateway.Config)) string {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b"})
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: t.TempDir(), Keys: keys}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := gateway.New(t.Context(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

// call sends an OpenAI request and returns the status and the raw body.
func call(t *testing.T, method, url, key string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		switch b := body.(type) {
		case string:
			rd = strings.NewReader(b)
		default:
			raw, err := json.Marshal(b)
			require.NoError(t, err)
			rd = bytes.NewReader(raw)
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

type chatResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text     string `json:"text"`
		Logprobs *struct {
			Content []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"content"`
			Tokens        []string  `json:"tokens"`
			TokenLogprobs []float64 `json:"token_logprobs"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
		// PromptTokensDetails.CachedTokens: the prompt tokens served from the prefix cache
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

type errResp struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func ok(t *testing.T, status int, body []byte) chatResp {
	t.Helper()
	require.Equal(t, http.StatusOK, status, string(body))
	var r chatResp
	require.NoError(t, json.Unmarshal(body, &r), string(body))
	return r
}

// decodeText is the text of sampled tokens as the adapter returns it: special tokens left out.
func decodeText(toks []int32) string {
	tok := tiny.Tokenizer()
	special := map[int]bool{}
	for _, s := range tok.Specials {
		special[s.ID] = true
	}
	var ids []int
	for _, id := range toks {
		if !special[int(id)] {
			ids = append(ids, int(id))
		}
	}
	return tok.Decode(ids)
}

func TestChatAndCompletions(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	chat := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, map[string]any{
		"model": tiny.Name, "max_tokens": 6, "temperature": 0,
		"messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}},
	}))
	require.Equal(t, "chat.completion", chat.Object)
	require.Equal(t, tiny.Name, chat.Model)
	require.Len(t, chat.Choices, 1)
	require.Equal(t, "assistant", chat.Choices[0].Message.Role)
	require.Contains(t, []string{"stop", "length"}, chat.Choices[0].FinishReason)
	// The prompt is the chat template's rendering, tokenized.
	rendered := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello world!<|im_end|>\n<|im_start|>assistant\n"
	require.Equal(t, len(tiny.Tokenizer().Encode(rendered)), chat.Usage.PromptTokens)
	require.Positive(t, chat.Usage.CompletionTokens)
	require.Equal(t, chat.Usage.PromptTokens+chat.Usage.CompletionTokens, chat.Usage.TotalTokens)

	// Content parts are text joined by newlines; logprobs: one per sampled token.
	parts := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, map[string]any{
		"model": tiny.Name, "max_completion_tokens": 4, "logprobs": true, "top_logprobs": 0,
		"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "Hello"}}}},
	}))
	require.NotNil(t, parts.Choices[0].Logprobs)
	require.Len(t, parts.Choices[0].Logprobs.Content, parts.Usage.CompletionTokens)

	cmpl := okFn(t)(call(t, "POST", url+"/completions", keyA, map[string]any{
		"model": tiny.Name, "prompt": "The quick brown fox", "max_tokens": 5, "n": 3, "logprobs": 0,
	}))
	require.Len(t, cmpl.Choices, 3)
	for i, c := range cmpl.Choices {
		require.Equal(t, i, c.Index)
		require.NotNil(t, c.Logprobs)
		require.Len(t, c.Logprobs.TokenLogprobs, len(c.Logprobs.Tokens))
	}
	require.Equal(t, len(tiny.Tokenizer().Encode("The quick brown fox")), cmpl.Usage.PromptTokens)

	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	status, body := call(t, "GET", url+"/models", keyA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.NoError(t, json.Unmarshal(body, &models))
	require.Equal(t, "list", models.Object)
	require.Equal(t, tiny.Name, models.Data[0].ID)
}

// ok returns a checker of (status, body) pairs, so that call's two results pass straight in.
func okFn(t *testing.T) func(int, []byte) chatResp {
	return func(status int, body []byte) chatResp { return ok(t, status, body) }
}

func TestGreedyEqualsLoopsSample(t *testing.T) {
	base := startServer(t, nil)
	url := base + "/oai/api/v1"
	prompt := tiny.Tokenizer().Encode("What is the capital of France?")
	toks := make([]int32, len(prompt))
	for i, id := range prompt {
		toks[i] = int32(id)
	}
	ctx := t.Context()
	sampling := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, base, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, base, withKey(keyA))
	sm, err := sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{BaseModel: tiny.Name})
	require.NoError(t, err)
	op, err := sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: sm.GetId(), Prompt: toks, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 12, Temperature: 0, TopP: 1, TopK: -1}})
	require.NoError(t, err)
	want := wait(t, ops, op).GetSample().GetSequences()[0]

	for _, prompt := range []any{"What is the capital of France?", toks} {
		got := okFn(t)(call(t, "POST", url+"/completions", keyA, map[string]any{
			"model": tiny.Name, "prompt": prompt, "max_tokens": 12, "temperature": 0,
		}))
		require.Equal(t, decodeText(want.GetTokens()), got.Choices[0].Text)
		require.Equal(t, len(want.GetTokens()), got.Usage.CompletionTokens)
		require.Equal(t, len(toks), got.Usage.PromptTokens)
	}
	// Several prompts: n choices each, in order; usage sums over them.
	got := okFn(t)(call(t, "POST", url+"/completions", keyA, map[string]any{
		"model": tiny.Name, "prompt": []any{"What is the capital of France?", toks}, "max_tokens": 12, "temperature": 0, "n": 2,
	}))
	require.Len(t, got.Choices, 4)
	for i, c := range got.Choices {
		require.Equal(t, i, c.Index)
		require.Equal(t, decodeText(want.GetTokens()), c.Text)
	}
	require.Equal(t, 2*len(toks), got.Usage.PromptTokens)
	require.Equal(t, 4*len(want.GetTokens()), got.Usage.CompletionTokens)
}

func TestSeedStopAndN(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1/completions"
	req := map[string]any{"model": tiny.Name, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 1, "seed": 7, "n": 2}
	a := okFn(t)(call(t, "POST", url, keyA, req))
	b := okFn(t)(call(t, "POST", url, keyA, req))
	require.Len(t, a.Choices, 2)
	for i := range a.Choices {
		require.Equal(t, a.Choices[i].Text, b.Choices[i].Text, "same seed, same output")
	}

	greedy := okFn(t)(call(t, "POST", url, keyA, map[string]any{"model": tiny.Name, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}))
	text := greedy.Choices[0].Text
	require.GreaterOrEqual(t, len(text), 4, "greedy output %q is too short to pick a stop sequence", text)
	stop := text[len(text)/2 : len(text)/2+2]
	stopped := okFn(t)(call(t, "POST", url, keyA, map[string]any{"model": tiny.Name, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stop": []string{stop}}))
	require.Equal(t, text[:strings.Index(text, stop)], stopped.Choices[0].Text, "the text ends before the stop sequence")
	require.Equal(t, "stop", stopped.Choices[0].FinishReason)
}

func TestStream(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	msgs := []map[string]any{{"role": "user", "content": "Hello"}}
	plain := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, map[string]any{"model": tiny.Name, "messages": msgs, "max_tokens": 8, "temperature": 0}))

	chunks := stream(t, url+"/chat/completions", map[string]any{"model": tiny.Name, "messages": msgs, "max_tokens": 8, "temperature": 0,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	var content strings.Builder
	finish := ""
	for _, c := range chunks[:len(chunks)-1] {
		require.Equal(t, "chat.completion.chunk", c["object"])
		require.Contains(t, c, "usage")
		require.Nil(t, c["usage"])
		for _, ch := range c["choices"].([]any) {
			ch := ch.(map[string]any)
			if d, ok := ch["delta"].(map[string]any)["content"].(string); ok {
				content.WriteString(d)
			}
			if fr, ok := ch["finish_reason"].(string); ok {
				finish = fr
			}
		}
	}
	require.Equal(t, plain.Choices[0].Message.Content, content.String())
	require.Equal(t, plain.Choices[0].FinishReason, finish)
	last := chunks[len(chunks)-1]
	require.Empty(t, last["choices"])
	require.InDelta(t, float64(plain.Usage.TotalTokens), last["usage"].(map[string]any)["total_tokens"], 0)

	// Completions stream; no usage chunk unless asked.
	chunks = stream(t, url+"/completions", map[string]any{"model": tiny.Name, "prompt": "Hello", "max_tokens": 4, "stream": true})
	for _, c := range chunks {
		require.Equal(t, "text_completion", c["object"])
		require.NotContains(t, c, "usage")
	}
}

// stream posts a streaming request and returns its data chunks; the stream must end with
// [DONE].
func stream(t *testing.T, url string, body any) []map[string]any {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+keyA)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var out []map[string]any
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "not an SSE data line: %q", line)
		require.False(t, done, "data after [DONE]")
		if data == "[DONE]" {
			done = true
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &m))
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	require.True(t, done, "the stream ends with [DONE]")
	require.NotEmpty(t, out)
	return out
}

func TestCheckpointsAndWorkspaces(t *testing.T) {
	base := startServer(t, nil)
	url := base + "/oai/api/v1"
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, base, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, base, withKey(keyA))
	created := wait(t, ops, must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMlp: true}})))
	saved := wait(t, ops, must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{
		TrainingRunId: created.GetTrainingRun().GetId(), Name: "step1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})))
	path := saved.GetSaveWeights().GetPath()
	require.Contains(t, path, "/sampler_weights/")

	msgs := []map[string]any{{"role": "user", "content": "Hi"}}
	for _, model := range []string{path, tiny.Name + ";" + path} {
		r := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, map[string]any{"model": model, "messages": msgs, "max_tokens": 3}))
		require.Equal(t, model, r.Model)
	}
	// Embeddings from the checkpoint (its adapter applied: backends/reference TestEmbed).
	emb := embed(t, url, map[string]any{"model": path, "input": []int{1, 2, 3}})
	require.Equal(t, path, emb.Model)
	require.Len(t, emb.floats(t, 0), 256)
	status, body := call(t, "POST", url+"/embeddings", keyB, map[string]any{"model": path, "input": "x"})
	require.Equal(t, http.StatusNotFound, status, string(body))

	status, body = call(t, "GET", url+"/models", keyA, nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, string(body), path)

	// Another key's workspace: the checkpoint is a 404, and is not listed.
	status, body = call(t, "POST", url+"/chat/completions", keyB, map[string]any{"model": path, "messages": msgs})
	require.Equal(t, http.StatusNotFound, status, string(body))
	var e errResp
	require.NoError(t, json.Unmarshal(body, &e))
	require.Equal(t, "invalid_request_error", e.Error.Type)
	require.NotEmpty(t, e.Error.Message)
	status, body = call(t, "GET", url+"/models", keyB, nil)
	require.Equal(t, http.StatusOK, status)
	require.NotContains(t, string(body), path)
	for model, want := range map[string]int{path: 200, tiny.Name: 200, tiny.Name + ";" + path: 200, "no/such": 404} {
		for _, p := range []string{model, neturl.PathEscape(model)} {
			status, body = call(t, "GET", url+"/models/"+p, keyA, nil)
			require.Equal(t, want, status, "%s: %s", p, body)
			if want == 200 {
				require.Contains(t, string(body), `"id":"`+model+`"`)
			}
		}
	}
	status, body = call(t, "GET", url+"/models/"+path, keyB, nil)
	require.Equal(t, http.StatusNotFound, status, string(body))

	// A checkpoint on another base model is refused.
	status, body = call(t, "POST", url+"/chat/completions", keyA, map[string]any{"model": "other/model;" + path, "messages": msgs})
	require.Equal(t, http.StatusBadRequest, status, string(body))
	// No key, a bad key.
	status, _ = call(t, "GET", url+"/models", "", nil)
	require.Equal(t, http.StatusUnauthorized, status)
	status, _ = call(t, "GET", url+"/models", "tml-unknown", nil)
	require.Equal(t, http.StatusUnauthorized, status)
}

func TestBadRequests(t *testing.T) {
	url := startServer(t, func(c *gateway.Config) { c.Limits.MaxBodyBytes = 4096 }) + "/oai/api/v1"
	msgs := []map[string]any{{"role": "user", "content": "Hi"}}
	chat := func(extra map[string]any) map[string]any { return chatBody("Hi", extra) }
	for name, tc := range map[string]struct {
		path   string
		body   any
		status int
		param  string
	}{
		"tools":               {"/chat/completions", chat(map[string]any{"tools": []any{map[string]any{"type": "function"}}}), 400, "tools[0].function"},
		"custom tool":         {"/chat/completions", chat(map[string]any{"tools": []any{map[string]any{"type": "custom", "custom": map[string]any{"name": "f"}}}}), 400, "tools[0].type"},
		"tool name":           {"/chat/completions", chat(map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "a b"}}}}), 400, "tools[0].name"},
		"tool choice unknown": {"/chat/completions", chat(map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "g"}}}), 400, "tool_choice"},
		"choice, no tools":    {"/chat/completions", chat(map[string]any{"tool_choice": "required"}), 400, "tool_choice"},
		"store":               {"/chat/completions", chat(map[string]any{"store": true}), 400, "store"},
		"service_tier":        {"/chat/completions", chat(map[string]any{"service_tier": "flex"}), 400, "service_tier"},
		"unknown field":       {"/chat/completions", chat(map[string]any{"foo": 1}), 400, "foo"},
		"top_logprobs":        {"/chat/completions", chat(map[string]any{"logprobs": true, "top_logprobs": 21}), 400, "top_logprobs"},
		"top without logprob": {"/chat/completions", chat(map[string]any{"top_logprobs": 2}), 400, "top_logprobs"},
		"completion logprob":  {"/completions", map[string]any{"model": tiny.Name, "prompt": "x", "logprobs": 6}, 400, "logprobs"},
		"n zero":              {"/chat/completions", chat(map[string]any{"n": 0}), 400, "n"},
		"n too large":         {"/chat/completions", chat(map[string]any{"n": 100000}), 400, "n"},
		"max_tokens -1":       {"/chat/completions", chat(map[string]any{"max_tokens": -1}), 400, "max_tokens"},
		"max_tokens float":    {"/chat/completions", chat(map[string]any{"max_tokens": 1.5}), 400, "max_tokens"},
		"max_tokens huge":     {"/chat/completions", chat(map[string]any{"max_tokens": 1 << 40}), 400, "max_tokens"},
		"temperature":         {"/chat/completions", chat(map[string]any{"temperature": -1}), 400, "temperature"},
		"top_p":               {"/chat/completions", chat(map[string]any{"top_p": 0}), 400, "top_p"},
		"top_k":               {"/chat/completions", chat(map[string]any{"top_k": -2}), 400, "top_k"},
		"seed":                {"/chat/completions", chat(map[string]any{"seed": "x"}), 400, "seed"},
		"stop count":          {"/chat/completions", chat(map[string]any{"stop": []string{"a", "b", "c", "d", "e"}}), 400, "stop"},
		"penalty":             {"/chat/completions", chat(map[string]any{"presence_penalty": 2.5}), 400, "presence_penalty"},
		"frequency_penalty":   {"/chat/completions", chat(map[string]any{"frequency_penalty": -2.01}), 400, "frequency_penalty"},
		"min_p":               {"/chat/completions", chat(map[string]any{"min_p": 1.5}), 400, "min_p"},
		"logit_bias value":    {"/chat/completions", chat(map[string]any{"logit_bias": map[string]any{"5": 101}}), 400, "logit_bias.5"},
		"logit_bias key":      {"/chat/completions", chat(map[string]any{"logit_bias": map[string]any{"x": 1}}), 400, "logit_bias"},
		"logit_bias vocab":    {"/chat/completions", chat(map[string]any{"logit_bias": map[string]any{"100000": 1}}), 400, ""},
		"format type":         {"/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "xml"}}), 400, "response_format.type"},
		"format no name":      {"/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"schema": map[string]any{}}}}), 400, "response_format.json_schema.name"},
		"format keyword":      {"/chat/completions", chat(map[string]any{"response_format": jsonSchema(map[string]any{"type": "string", "pattern": "^a$"})}), 400, "response_format.json_schema.schema"},
		"format with stop":    {"/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "json_object"}, "stop": "x"}), 400, "stop"},
		"role":                {"/chat/completions", chat(map[string]any{"messages": []map[string]any{{"role": "function", "content": "x"}}}), 400, "messages[0].role"},
		"orphan tool message": {"/chat/completions", chat(map[string]any{"messages": []map[string]any{{"role": "tool", "content": "x", "tool_call_id": "1"}}}), 400, "messages[0].tool_call_id"},
		"message name":        {"/chat/completions", chat(map[string]any{"messages": []map[string]any{{"role": "user", "content": "x", "name": "bob"}}}), 400, "messages[0].name"},
		"image, text model":   {"/chat/completions", chat(map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + pic}}}}}}), 400, "messages"},
		"image url":           {"/chat/completions", chat(map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/a.png"}}}}}}), 400, "messages[0].content[0].image_url.url"},
		"no messages":         {"/chat/completions", map[string]any{"model": tiny.Name}, 400, "messages"},
		"no model":            {"/chat/completions", map[string]any{"messages": msgs}, 400, "model"},
		"usage, no stream":    {"/chat/completions", chat(map[string]any{"stream_options": map[string]any{"include_usage": true}}), 400, "stream_options"},
		"prompts × n":         {"/completions", map[string]any{"model": tiny.Name, "prompt": []string{"a", "b"}, "n": 200}, 400, "prompt"},
		"empty prompt":        {"/completions", map[string]any{"model": tiny.Name, "prompt": []any{"a", ""}}, 400, "prompt[1]"},
		"echo streamed":       {"/completions", map[string]any{"model": tiny.Name, "prompt": "a", "echo": true, "stream": true}, 400, "echo"},
		"token out of range":  {"/completions", map[string]any{"model": tiny.Name, "prompt": []int{1, 1 << 40}}, 400, "prompt[1]"},
		"malformed":           {"/chat/completions", `{"model":`, 400, ""},
		"not an object":       {"/chat/completions", `[1]`, 400, ""},
		"unknown model":       {"/chat/completions", chat(map[string]any{"model": "no/such-model"}), 404, "model"},
		"vocab":               {"/completions", map[string]any{"model": tiny.Name, "prompt": []int{100000}}, 400, ""},
		"too long for model":  {"/completions", map[string]any{"model": tiny.Name, "prompt": "hi", "max_tokens": 1 << 20}, 400, ""},
		"body too large":      {"/completions", map[string]any{"model": tiny.Name, "prompt": strings.Repeat("x", 8192)}, 413, ""},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := call(t, "POST", url+tc.path, keyA, tc.body)
			require.Equal(t, tc.status, status, string(body))
			var e errResp
			require.NoError(t, json.Unmarshal(body, &e), string(body))
			require.NotEmpty(t, e.Error.Message)
			require.NotEmpty(t, e.Error.Type)
			if tc.param != "" {
				require.NotNil(t, e.Error.Param, string(body))
				require.Equal(t, tc.param, *e.Error.Param)
			}
		})
	}
	status, body := call(t, "GET", url+"/nope", keyA, nil)
	require.Equal(t, http.StatusNotFound, status, string(body))
}

// chatBody is a chat request for loops/tiny with one user message, and extra's fields.
func chatBody(content string, extra map[string]any) map[string]any {
	m := map[string]any{"model": tiny.Name, "messages": []map[string]any{{"role": "user", "content": content}}}
	maps.Copy(m, extra)
	return m
}

func withKey(key string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", key)
			return next(ctx, req)
		}
	}))
}

func wait(t *testing.T, ops loopsv1connect.OperationServiceClient, op *loopsv1.Operation) *loopsv1.Operation {
	t.Helper()
	for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
		var err error
		op, err = ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
		require.NoError(t, err)
	}
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
	return op
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// countingSampling counts the samplers the adapter creates.
type countingSampling struct {
	loopsv1connect.SamplingServiceHandler
	created atomic.Int32
}

func (c *countingSampling) CreateSampler(ctx context.Context, req *loopsv1.CreateSamplerRequest) (*loopsv1.Sampler, error) {
	c.created.Add(1)
	return c.SamplingServiceHandler.CreateSampler(ctx, req)
}

// TestOneSamplerPerWorkspaceAndModel: requests reuse the sampler of their (workspace, model),
// so serving many requests does not create a sampler each.
func TestOneSamplerPerWorkspaceAndModel(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	svc := srv.Core().Services()
	sampling := &countingSampling{SamplingServiceHandler: svc.Sampling}
	h := openai.NewHandler(openai.Services{Sampling: sampling, Operations: svc.Operations, Models: svc.Models, Checkpoints: svc.Checkpoints},
		openai.Options{Workspace: auth.Workspace})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(auth.WithWorkspace(r.Context(), r.Header.Get("X-Workspace"))))
	}))
	t.Cleanup(ts.Close)
	send := func(ws string) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", ts.URL+openai.Prefix+"completions",
			strings.NewReader(`{"model":"loops/tiny","prompt":"Hi","max_tokens":2}`))
		require.NoError(t, err)
		req.Header.Set("X-Workspace", ws)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	}
	for range 5 {
		send("ws-one")
	}
	require.Equal(t, int32(1), sampling.created.Load())
	send("ws-two")
	send("ws-two")
	require.Equal(t, int32(2), sampling.created.Load(), "one sampler per workspace")
}

// TestCachedTokensInUsage: a conversation's second turn starts with its first turn's
// prompt, which the reference engine's prefix cache serves; usage says how many tokens.
func TestCachedTokensInUsage(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You are a careful assistant who answers briefly. ", 4)}, {"role": "user", "content": "Hello world!"}}
	first := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, map[string]any{"model": tiny.Name, "max_tokens": 4, "temperature": 0, "messages": msgs}))
	require.Zero(t, first.Usage.PromptTokensDetails.CachedTokens)
	msgs = append(msgs, map[string]any{"role": "assistant", "content": first.Choices[0].Message.Content}, map[string]any{"role": "user", "content": "And then?"})
	second := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, map[string]any{"model": tiny.Name, "max_tokens": 4, "temperature": 0, "messages": msgs}))
	c := second.Usage.PromptTokensDetails.CachedTokens
	require.GreaterOrEqual(t, c, first.Usage.PromptTokens/16*16-16, "the first turn's whole blocks, but maybe the one its end cut")
	require.Less(t, c, second.Usage.PromptTokens)
	require.Zero(t, c%16)
}

// pic is a 24×16 grey PNG, base64.
const pic = "iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII="
