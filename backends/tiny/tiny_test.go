package tiny

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/tokenizer"
	"github.com/stretchr/testify/require"
)

var texts = []string{"Hello world", "Hello world! The quick brown fox.", "  two  spaces\tand\ttabs\n\nnew lines",
	"naïve café — 東京 🙂 done", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|endoftext|>", "x = x + 1024 // ok", ""}

func TestWriteLoadAndRoundTrip(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Write(dir))
	require.NoError(t, Write(dir)) // idempotent
	m, err := nn.Load[float32](dir)
	require.NoError(t, err)
	require.Equal(t, VocabLen, m.Cfg.Vocab)
	t.Logf("tiny model: %d parameters", m.ParamCount())
	tok, err := tokenizer.LoadHF(filepath.Join(dir, "tokenizer.json"))
	require.NoError(t, err)
	require.Equal(t, VocabLen, tok.Size())
	mem := Tokenizer()
	for _, s := range texts {
		ids := mem.Encode(s)
		require.Equal(t, s, mem.Decode(ids))
		require.Equal(t, s, tok.Decode(ids))
		require.Equal(t, ids, tok.Encode(s))
	}
	id, ok := tok.TokenID(EOS)
	require.True(t, ok)
	require.Equal(t, []int{id}, tok.Encode(EOS))
	require.Less(t, len(mem.Encode("Hello world")), len("Hello world"), "BPE merges should compress")
}

// TestTransformersAgrees checks that transformers' AutoTokenizer loads the folder offline
// and encodes and decodes like the Go tokenizer. It runs when LOOPS_PYTHON (or python3)
// can import transformers, and is skipped otherwise.
func TestTransformersAgrees(t *testing.T) {
	py := os.Getenv("LOOPS_PYTHON")
	if py == "" {
		for _, c := range []string{"../../.venv/bin/python", "python3"} {
			if p, err := exec.LookPath(c); err == nil {
				py = p
				break
			}
		}
	}
	if py == "" || exec.Command(py, "-c", "import transformers").Run() != nil {
		t.Skip("python with transformers not available (set LOOPS_PYTHON)")
	}
	dir := t.TempDir()
	require.NoError(t, Write(dir))
	mem := Tokenizer()
	script := `
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = json.loads(sys.stdin.read())
out = []
for s in texts:
    ids = tok.encode(s, add_special_tokens=True)
    out.append({"ids": ids, "text": tok.decode(ids)})
print(json.dumps({"out": out, "eos": tok.eos_token_id, "vocab": len(tok)}))
`
	cmd := exec.Command(py, "-c", script, dir)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "TRANSFORMERS_VERBOSITY=error")
	in, _ := jsonMarshal(texts)
	cmd.Stdin = bytesReader(in)
	b, err := cmd.Output()
	require.NoError(t, err, string(b))
	var res struct {
		Out []struct {
			IDs  []int  `json:"ids"`
			Text string `json:"text"`
		} `json:"out"`
		EOS   int `json:"eos"`
		Vocab int `json:"vocab"`
	}
	require.NoError(t, jsonUnmarshal(b, &res))
	eos, _ := mem.TokenID(EOS)
	require.Equal(t, eos, res.EOS)
	require.Equal(t, VocabLen, res.Vocab)
	for i, s := range texts {
		want := mem.Encode(s)
		if len(want) == 0 {
			want = nil
		}
		got := res.Out[i].IDs
		if len(got) == 0 {
			got = nil
		}
		require.Equal(t, want, got, "encoding %q", s)
		require.Equal(t, s, res.Out[i].Text)
	}
}

// TestRegisterInHubCache: the snapshot holds everything transformers needs to load
// loops/tiny by name offline (config, tokenizer, weights), and registering again keeps it.
func TestRegisterInHubCache(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, Write(dir))
	for range 2 {
		snap, err := RegisterInHubCache(dir)
		require.NoError(t, err)
		for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors"} {
			want, err := os.ReadFile(filepath.Join(dir, f))
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(snap, f))
			require.NoError(t, err, f)
			require.Equal(t, want, got, f)
		}
	}
}
