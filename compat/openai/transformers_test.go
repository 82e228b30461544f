package openai

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
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
	convs := [][]message{
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
		got, err := tx.render(c)
		require.NoError(t, err)
		require.Equal(t, res[i].Text, got, "rendering %d", i)
		require.Equal(t, res[i].IDs, tx.encode(got), "tokens %d", i)
	}
}
