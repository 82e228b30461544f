package infer

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// tinyText loads loops/tiny's tokenizer files as the adapter does.
func tinyText(t *testing.T) *Text {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tx, err := loadText(&loopsv1.ModelInfo{Name: tiny.Name, TokenizerId: dir})
	require.NoError(t, err)
	return tx
}

func TestTinyChatTemplate(t *testing.T) {
	tx := tinyText(t)
	require.NotNil(t, tx.tmpl, "loops/tiny ships a chat template")
	out, err := tx.Render([]Message{{Role: "system", Content: "S"}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Yo"}, {Role: "user", Content: "Again"}}, nil)
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n", out)
	// Chat markers encode to their added tokens, and decode leaves special tokens out.
	toks := tx.Encode(out)
	imStart, _ := tx.tok.TokenID(tiny.IMStart)
	require.Equal(t, int32(imStart), toks[0])
	require.Equal(t, "S", tx.Decode(tx.Encode("<|im_start|>S<|im_end|>")))
}

// qwenTemplate is Qwen2.5's chat template without its tool-calling branches.
const qwenTemplate = `{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`

// mistralTemplate checks alternation with raise_exception and uses bos_token, as Mistral's
// and Llama 2's templates do.
const mistralTemplate = `{{- bos_token }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- '[INST] ' + message['content'] | trim + ' [/INST]' }}
    {%- else %}
        {{- ' ' + message['content'].strip() + eos_token }}
    {%- endif %}
{%- endfor %}
`

// TestHuggingFaceTemplates renders templates written like Qwen's and Mistral's (loop
// variables, undefined attributes, filters, string methods, raise_exception, bos_token) the
// way transformers does.
func TestHuggingFaceTemplates(t *testing.T) {
	tx := tinyText(t)
	tmpl, err := compileTemplate(qwenTemplate)
	require.NoError(t, err)
	tx.tmpl = tmpl
	out, err := tx.Render([]Message{{Role: "user", Content: "Hi"}}, nil)
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", out)

	tmpl, err = compileTemplate(mistralTemplate)
	require.NoError(t, err)
	tx.tmpl, tx.bos, tx.eos = tmpl, "<s>", "</s>"
	out, err = tx.Render([]Message{{Role: "user", Content: " Hi "}, {Role: "assistant", Content: " Yo "}, {Role: "user", Content: "Again"}}, nil)
	require.NoError(t, err)
	require.Equal(t, "<s>[INST] Hi [/INST] Yo</s>[INST] Again [/INST]", out)

	_, err = tx.Render([]Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, nil)
	var ae *Error
	require.True(t, errors.As(err, &ae), "%v", err)
	require.Equal(t, http.StatusBadRequest, ae.Status)
	require.Equal(t, "messages", ae.Param)
	require.Contains(t, ae.Message, "Conversation roles must alternate")
}

func TestNoChatTemplate(t *testing.T) {
	tx := tinyText(t)
	tx.tmpl = nil
	_, err := tx.Render([]Message{{Role: "user", Content: "x"}}, nil)
	var ae *Error
	require.True(t, errors.As(err, &ae))
	require.Equal(t, http.StatusBadRequest, ae.Status)
}

func TestTokenizerDirFromHubCache(t *testing.T) {
	hub := t.TempDir()
	t.Setenv("HF_HUB_CACHE", hub)
	snap := filepath.Join(hub, "models--org--m", "snapshots", "abc")
	require.NoError(t, os.MkdirAll(snap, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(snap, "tokenizer.json"), []byte("{}"), 0o644))
	dir, err := tokenizerDir("org/m")
	require.NoError(t, err)
	require.Equal(t, snap, dir)
	_, err = tokenizerDir("org/missing")
	require.Error(t, err)
}

func TestSamplerCacheIsBounded(t *testing.T) {
	c := newSamplerCache(2)
	c.put("a", sampler{id: "1"})
	c.put("b", sampler{id: "2"})
	_, ok := c.get("a") // a is now the most recent
	require.True(t, ok)
	c.put("c", sampler{id: "3"})
	require.Equal(t, 2, c.len())
	_, ok = c.get("b")
	require.False(t, ok, "the least recently used entry is forgotten")
	c.drop("a", "other")
	_, ok = c.get("a")
	require.True(t, ok, "drop forgets only the sampler it names")
	c.drop("a", "1")
	_, ok = c.get("a")
	require.False(t, ok)
}

func TestParseModel(t *testing.T) {
	for in, want := range map[string][2]string{
		"loops/tiny":                              {"loops/tiny", ""},
		"tinker://r/sampler_weights/s":            {"", "tinker://r/sampler_weights/s"},
		"loops/tiny;tinker://r/sampler_weights/s": {"loops/tiny", "tinker://r/sampler_weights/s"},
	} {
		b, p, err := ParseModel(in)
		require.NoError(t, err)
		require.Equal(t, want, [2]string{b, p})
	}
	for _, bad := range []string{";tinker://x", "loops/tiny;x", "a;"} {
		_, _, err := ParseModel(bad)
		require.Error(t, err, bad)
	}
}
