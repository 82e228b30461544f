package openai_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
)

type embeddingResp struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// embed posts body to /embeddings and returns the decoded 200 answer.
func embed(t *testing.T, url string, body any) embeddingResp {
	t.Helper()
	status, raw := call(t, "POST", url+"/embeddings", keyA, body)
	require.Equal(t, http.StatusOK, status, string(raw))
	var r embeddingResp
	require.NoError(t, json.Unmarshal(raw, &r), string(raw))
	return r
}

// floats decodes item i's embedding as floats (encoding_format float).
func (r embeddingResp) floats(t *testing.T, i int) []float32 {
	t.Helper()
	var v []float32
	require.NoError(t, json.Unmarshal(r.Data[i].Embedding, &v))
	return v
}

// meanHidden is the reference: loops/tiny loaded in float64 from the folder tiny.Write
// writes, the final normalised hidden states of toks, averaged over the tokens.
func meanHidden(t *testing.T, m *nn.Model[float64], toks []int32) []float64 {
	t.Helper()
	ids, pos, caches := make([]int, len(toks)), make([]int, len(toks)), make([]*nn.KVCache[float64], len(toks))
	c := m.NewCache()
	for i, tok := range toks {
		ids[i], pos[i], caches[i] = int(tok), i, c
	}
	h := m.Step(ids, pos, caches, nil)
	D := m.Cfg.Hidden
	out := make([]float64, D)
	for i := range ids {
		for d := range D {
			out[d] += h[i*D+d] / float64(len(ids))
		}
	}
	return out
}

// TestEmbeddings: POST /embeddings answers OpenAI's shape for every input form, each vector
// the mean over the input's tokens of loops/tiny's final hidden state (checked against a
// float64 forward pass here, and against transformers with LOOPS_TORCH_PYTHON set: make
// test-export), base64 the same float32 bytes little-endian, usage the inputs' tokens.
func TestEmbeddings(t *testing.T) {
	base := startServer(t, nil)
	url := base + "/oai/api/v1"
	dir := filepath.Join(t.TempDir(), "tiny")
	require.NoError(t, tiny.Write(dir))
	m, err := nn.Load[float64](dir)
	require.NoError(t, err)
	D := m.Cfg.Hidden

	inputs := [][]int32{{3, 14, 15, 92, 65, 35, 89, 79, 32, 38}, {7}, make([]int32, 600)}
	for i := range inputs[2] { // longer than one chunk of the engine's forward steps (nn.PrefillChunk)
		inputs[2][i] = int32((i*37 + 11) % tiny.VocabLen)
	}
	r := embed(t, url, map[string]any{"model": tiny.Name, "input": inputs})
	require.Equal(t, "list", r.Object)
	require.Equal(t, tiny.Name, r.Model)
	require.Len(t, r.Data, len(inputs))
	require.Equal(t, 611, r.Usage.PromptTokens)
	require.Equal(t, 611, r.Usage.TotalTokens)
	got := make([][]float32, len(inputs))
	for i := range inputs {
		require.Equal(t, "embedding", r.Data[i].Object)
		require.Equal(t, i, r.Data[i].Index)
		got[i] = r.floats(t, i)
		require.Len(t, got[i], D)
		want := meanHidden(t, m, inputs[i])
		for d := range D {
			require.InDelta(t, want[d], float64(got[i][d]), 1e-5, "input %d, dimension %d", i, d)
		}
	}
	require.NotEqual(t, got[0], got[1])

	// One token array alone, and with dimensions equal to the hidden size: the same vector.
	one := embed(t, url, map[string]any{"model": tiny.Name, "input": inputs[0], "dimensions": D})
	require.Len(t, one.Data, 1)
	require.Equal(t, got[0], one.floats(t, 0))

	// base64: the float32 values, little-endian.
	b64 := embed(t, url, map[string]any{"model": tiny.Name, "input": inputs[:2], "encoding_format": "base64"})
	for i := range 2 {
		var s string
		require.NoError(t, json.Unmarshal(b64.Data[i].Embedding, &s))
		raw, err := base64.StdEncoding.DecodeString(s)
		require.NoError(t, err)
		require.Len(t, raw, 4*D)
		v := make([]float32, D)
		for d := range v {
			v[d] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*d:]))
		}
		require.Equal(t, got[i], v)
	}

	// Text: tokenized as /completions tokenizes its prompt (the same usage), and a string
	// equals a list of that one string.
	text := embed(t, url, map[string]any{"model": tiny.Name, "input": "hello, world"})
	list := embed(t, url, map[string]any{"model": tiny.Name, "input": []string{"hello, world", "another text"}})
	require.Equal(t, text.floats(t, 0), list.floats(t, 0))
	require.NotEqual(t, list.floats(t, 0), list.floats(t, 1))
	var comp struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	status, raw := call(t, "POST", url+"/completions", keyA, map[string]any{"model": tiny.Name, "prompt": "hello, world", "max_tokens": 1})
	require.Equal(t, http.StatusOK, status, string(raw))
	require.NoError(t, json.Unmarshal(raw, &comp))
	require.Equal(t, comp.Usage.PromptTokens, text.Usage.PromptTokens)

	if py := os.Getenv("LOOPS_TORCH_PYTHON"); py != "" {
		in, err := json.Marshal(map[string]any{"inputs": inputs, "embeddings": got})
		require.NoError(t, err)
		cmd := exec.CommandContext(t.Context(), py, "testdata/embed_compare.py", dir)
		cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
		cmd.Stdin = bytes.NewReader(in)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		t.Logf("transformers vs loops embeddings: %s", out)
	}
}

// TestEmbeddingBadRequests: each bound and malformed field is a 4xx that names the field
// and the limit, before any work.
func TestEmbeddingBadRequests(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	body := func(input any, extra ...any) map[string]any {
		m := map[string]any{"model": tiny.Name, "input": input}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i].(string)] = extra[i+1]
		}
		return m
	}
	many := make([]string, 129)
	for i := range many {
		many[i] = "x"
	}
	big := make([][]int32, 33) // 33 × 2,000 tokens > 65,536 in all, each within 2,048
	for i := range big {
		big[i] = make([]int32, 2000)
	}
	for name, tc := range map[string]struct {
		body     any
		status   int
		param    string
		contains []string
	}{
		"empty string":     {body(""), 400, "input", []string{"must not be empty"}},
		"empty list":       {body([]string{}), 400, "input", []string{"string, a list of token ids"}},
		"empty item":       {body([]string{"a", ""}), 400, "input[1]", []string{"must not be empty"}},
		"empty token list": {body([][]int{{1}, {}}), 400, "input[1]", nil},
		"number":           {body(5), 400, "input", nil},
		"object":           {body(map[string]any{"a": 1}), 400, "input", nil},
		"float token":      {body([]float64{1.5}), 400, "input[0]", nil},
		"negative token":   {body([]int{-1}), 400, "input[0]", nil},
		"token past vocab": {body([]int{tiny.VocabLen}), 400, "", []string{"vocabulary"}},
		"too many items":   {body(many), 400, "input", []string{"129 items", "at most 128"}},
		"item too long":    {body(make([]int, 2049)), 400, "input", []string{"2049 tokens", "at most 2048"}},
		"text too long":    {body(strings.Repeat("\U0001F642 ", 4000)), 400, "input", []string{"more than 2048 tokens"}},
		"too many tokens":  {body(big), 400, "input", []string{"65536 tokens"}},
		"encoding_format":  {body("a", "encoding_format", "hex"), 400, "encoding_format", []string{`"float" or "base64"`}},
		"dimensions zero":  {body("a", "dimensions", 0), 400, "dimensions", nil},
		"dimensions type":  {body("a", "dimensions", "64"), 400, "dimensions", nil},
		"dimensions other": {body("a", "dimensions", 64), 400, "dimensions", []string{"hidden size 256"}},
		// refused before any work: an input the engine would refuse is not reached
		"dimensions first": {body([]int{tiny.VocabLen}, "dimensions", 64), 400, "dimensions", []string{"hidden size 256"}},
		"no model":         {map[string]any{"input": "a"}, 400, "model", nil},
		"no input":         {map[string]any{"model": tiny.Name}, 400, "input", []string{"required"}},
		"unknown field":    {body("a", "truncate", true), 400, "truncate", nil},
		"unknown model":    {map[string]any{"model": "no/such", "input": "a"}, 404, "", nil},
	} {
		t.Run(name, func(t *testing.T) {
			status, raw := call(t, "POST", url+"/embeddings", keyA, tc.body)
			require.Equal(t, tc.status, status, string(raw))
			var e errResp
			require.NoError(t, json.Unmarshal(raw, &e), string(raw))
			require.NotEmpty(t, e.Error.Message)
			if tc.param != "" {
				require.NotNil(t, e.Error.Param, string(raw))
				require.Equal(t, tc.param, *e.Error.Param)
			}
			for _, c := range tc.contains {
				require.Contains(t, e.Error.Message, c)
			}
		})
	}
}
