package infer

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestTransformersChatTemplateAgrees checks that the adapter's chat prompt for loops/tiny
// (gonja rendering the model's chat_template, then the Go tokenizer) is token for token what
// transformers' apply_chat_template(add_generation_prompt=True) gives. It runs when
// LOOPS_PYTHON (or python3) can import transformers and jinja2, and is skipped otherwise;
// clients/openai/run.sh (make test-clients) runs it with its venv.
func TestTransformersChatTemplateAgrees(t *testing.T) {
	py := os.Getenv("LOOPS_PYTHON")
	if py == "" {
		if p, err := exec.LookPath("python3"); err == nil {
			py = p
		}
	}
	if py == "" || exec.Command(py, "-c", "import transformers, jinja2").Run() != nil {
		t.Skip("python with transformers and jinja2 not available (set LOOPS_PYTHON)")
	}
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tx, err := loadText(&loopsv1.ModelInfo{Name: tiny.Name, TokenizerId: dir})
	require.NoError(t, err)
	convs := [][]Message{
		{{Role: "user", Content: "Hello world!"}},
		{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What is 2+2?"}, {Role: "assistant", Content: "Four."}, {Role: "user", Content: "naïve café — 東京 🙂"}},
		{{Role: "user", Content: "  spaces\tand\nnew lines  "}},
	}
	script := `
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for conv in json.loads(sys.stdin.read()):
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out.append({"text": text, "ids": ids})
print(json.dumps(out))
`
	in := make([][]map[string]string, len(convs))
	for i, c := range convs {
		for _, m := range c {
			in[i] = append(in[i], map[string]string{"role": m.Role, "content": m.Content})
		}
	}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	cmd := exec.Command(py, "-c", script, dir)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "TRANSFORMERS_VERBOSITY=error")
	cmd.Stdin = bytes.NewReader(b)
	outb, err := cmd.Output()
	require.NoError(t, err, string(outb))
	var res []struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	}
	require.NoError(t, json.Unmarshal(outb, &res))
	for i, c := range convs {
		got, err := tx.Render(c, nil)
		require.NoError(t, err)
		require.Equal(t, res[i].Text, got, "rendering %d", i)
		require.Equal(t, res[i].IDs, tx.Encode(got), "tokens %d", i)
	}
}

// TestJinja2Agrees renders Hugging Face style chat templates with gonja and with Python's
// jinja2 as transformers sets it up (a sandboxed environment, trim_blocks, lstrip_blocks) and
// requires the same text: Qwen2.5's (without tools), a Mistral-style one and
// testdata/qwen3_style.jinja, Qwen3's structure (reversed loops, namespaces, string methods,
// `is string`, `is defined`, <think> splitting), and Qwen2-VL's (testdata/qwen2_vl.jinja) on
// messages with image parts. It runs when LOOPS_PYTHON (or python3) can
// import jinja2.
func TestJinja2Agrees(t *testing.T) {
	py := os.Getenv("LOOPS_PYTHON")
	if py == "" {
		if p, err := exec.LookPath("python3"); err == nil {
			py = p
		}
	}
	if py == "" || exec.Command(py, "-c", "import jinja2").Run() != nil {
		t.Skip("python with jinja2 not available (set LOOPS_PYTHON)")
	}
	qwen3, err := os.ReadFile("testdata/qwen3_style.jinja")
	require.NoError(t, err)
	qwenVL, err := os.ReadFile("testdata/qwen2_vl.jinja")
	require.NoError(t, err)
	templates := []string{qwenTemplate, mistralTemplate, string(qwen3)}
	convs := [][]Message{
		{{Role: "user", Content: "Hi"}},
		{{Role: "system", Content: " Be brief. "}, {Role: "user", Content: "Hi"}},
		{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "<think>\nhmm\n</think>\n\nYo"}, {Role: "user", Content: "Again ünïcode 🙂"}},
		{{Role: "system", Content: "S"}, {Role: "user", Content: "Q"}, {Role: "assistant", Content: "<think>\nlast\n</think>\nA"}},
	}
	type pair struct {
		src  string
		conv []Message
	}
	var pairs []pair
	for _, src := range templates {
		for _, c := range convs {
			pairs = append(pairs, pair{src, c})
		}
	}
	// Qwen2-VL's template on text, and on messages with image parts (the list of parts the
	// chat routes give a template).
	pic := &Image{}
	for _, c := range append(convs,
		[]Message{{Role: "user", Parts: []Part{{Text: "What is"}, {Image: pic}, {Text: "this?"}}}},
		[]Message{{Role: "system", Content: "S"}, {Role: "user", Parts: []Part{{Image: pic}, {Image: pic}, {Text: "Compare."}}}, {Role: "assistant", Content: "A"}}) {
		pairs = append(pairs, pair{string(qwenVL), c})
	}
	type job struct {
		Template string           `json:"template"`
		Messages []map[string]any `json:"messages"`
	}
	var jobs []job
	for _, p := range pairs {
		j := job{Template: p.src}
		for _, m := range p.conv {
			msg := map[string]any{"role": m.Role, "content": m.Content}
			if len(m.Parts) > 0 {
				parts := []map[string]string{}
				for _, part := range m.Parts {
					if part.Image != nil {
						parts = append(parts, map[string]string{"type": "image"})
					} else {
						parts = append(parts, map[string]string{"type": "text", "text": part.Text})
					}
				}
				msg["content"] = parts
			}
			j.Messages = append(j.Messages, msg)
		}
		jobs = append(jobs, j)
	}
	script := `
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(msg):
    raise ValueError(msg)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.globals["raise_exception"] = raise_exception
out = []
for j in json.loads(sys.stdin.read()):
    try:
        out.append(env.from_string(j["template"]).render(messages=j["messages"], add_generation_prompt=True, bos_token="<s>", eos_token="</s>"))
    except ValueError as e:
        out.append(None)
print(json.dumps(out))
`
	b, err := json.Marshal(jobs)
	require.NoError(t, err)
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = bytes.NewReader(b)
	outb, err := cmd.Output()
	require.NoError(t, err, string(outb))
	var want []*string
	require.NoError(t, json.Unmarshal(outb, &want))
	require.Len(t, want, len(jobs))
	for i, p := range pairs {
		tmpl, err := compileTemplate(p.src)
		require.NoError(t, err)
		tx := &Text{tmpl: tmpl, bos: "<s>", eos: "</s>"}
		got, err := tx.Render(p.conv, nil)
		if want[i] == nil {
			require.Error(t, err, "job %d: jinja2 raised", i)
		} else {
			require.NoError(t, err, "job %d", i)
			require.Equal(t, *want[i], got, "job %d", i)
		}
	}
}

// TestTransformersToolsAgree: with tools and tool calls, the adapter's chat prompt for
// loops/tiny is token for token transformers' apply_chat_template(messages, tools=…): tool
// definitions with nested schemas in the client's key order, non-ASCII text, floats and
// quotes, an assistant turn of two calls and their tool results. Skipped like
// TestTransformersChatTemplateAgrees without a python with transformers.
func TestTransformersToolsAgree(t *testing.T) {
	py := os.Getenv("LOOPS_PYTHON")
	if py == "" {
		if p, err := exec.LookPath("python3"); err == nil {
			py = p
		}
	}
	if py == "" || exec.Command(py, "-c", "import transformers, jinja2").Run() != nil {
		t.Skip("python with transformers and jinja2 not available (set LOOPS_PYTHON)")
	}
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tx, err := loadText(&loopsv1.ModelInfo{Name: tiny.Name, TokenizerId: dir})
	require.NoError(t, err)
	tools := []Tool{
		{Name: "get_weather", Description: "Météo d'une \"ville\" — 東京 ok", Parameters: json.RawMessage(`{"type": "object", "required": ["city"], "properties": {"zeta": {"type": "number", "minimum": 0.5, "maximum": 1e20, "default": 3}, "city": {"type": "string", "enum": ["Paris", "Tōkyō"]}}, "additionalProperties": false}`)},
		{Name: "get_time"},
	}
	msgs := []Message{
		{Role: "system", Content: "Use tools."},
		{Role: "user", Content: "Weather in Paris and the time?"},
		{Role: "assistant", Content: "Checking.", ToolCalls: []ToolCall{
			{ID: "a", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris", "zeta": 2.5}`)},
			{ID: "b", Name: "get_time", Arguments: json.RawMessage(`{}`)}}},
		{Role: "tool", Content: `{"sky": "clear"}`, ToolCallID: "a", Name: "get_weather"},
		{Role: "tool", Content: "12:00", ToolCallID: "b", Name: "get_time"},
	}
	// The same conversation as transformers takes it (the JSON text keeps the key order).
	var toolJSONs []string
	for _, tl := range tools {
		raw, err := toolJSON(tl)
		require.NoError(t, err)
		toolJSONs = append(toolJSONs, string(raw))
	}
	conv := `[{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris and the time?"},
	  {"role": "assistant", "content": "Checking.", "tool_calls": [
	    {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "zeta": 2.5}}},
	    {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
	  {"role": "tool", "content": "{\"sky\": \"clear\"}", "tool_call_id": "a", "name": "get_weather"},
	  {"role": "tool", "content": "12:00", "tool_call_id": "b", "name": "get_time"}]`
	script := `
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
job = json.loads(sys.stdin.read())
text = tok.apply_chat_template(job["messages"], tools=job["tools"], tokenize=False, add_generation_prompt=True)
print(json.dumps({"text": text, "ids": tok(text, add_special_tokens=False)["input_ids"]}))
`
	in := `{"messages": ` + conv + `, "tools": [` + strings.Join(toolJSONs, ", ") + `]}`
	cmd := exec.Command(py, "-c", script, dir)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "TRANSFORMERS_VERBOSITY=error")
	cmd.Stdin = strings.NewReader(in)
	outb, err := cmd.Output()
	require.NoError(t, err, string(outb))
	var res struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	}
	require.NoError(t, json.Unmarshal(outb, &res))
	got, err := tx.Render(msgs, tools)
	require.NoError(t, err)
	require.Equal(t, res.Text, got)
	require.Equal(t, res.IDs, tx.Encode(got))
}
