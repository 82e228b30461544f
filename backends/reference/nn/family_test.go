package nn

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadConfigRefusesOtherFamilies(t *testing.T) {
	dir := t.TempDir()
	write := func(cfg string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644))
	}
	write(`{"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]}`)
	_, err := ReadConfig(dir)
	require.ErrorContains(t, err, "model family gpt_oss")
	require.ErrorContains(t, err, "--backend torch, which serves it")
	write(`{"model_type": "mamba"}`)
	_, err = ReadConfig(dir)
	require.ErrorContains(t, err, `model family "mamba" is not served by the reference engine`)
	write(`{"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4}`)
	_, err = ReadConfig(dir)
	require.NoError(t, err)
}

// TestTorchModelTypesMatchWorker keeps TorchModelTypes in step with the torch worker's
// family files: every model_type a family file declares is either served here or listed.
func TestTorchModelTypesMatchWorker(t *testing.T) {
	files, err := filepath.Glob("../../torch/loops_worker/families/*.py")
	require.NoError(t, err)
	name := regexp.MustCompile(`name="([a-z0-9_]+)"`)
	publisher := regexp.MustCompile(`publisher="([^"]+)"`)
	renderer := regexp.MustCompile(`renderer="([^"]+)"`)
	types := regexp.MustCompile(`model_types=\(([^)]*)\)`)
	vision := regexp.MustCompile(`vision=\(([^)]*)\)`) // VL checkpoints whose language model the family serves
	str := regexp.MustCompile(`"([a-z0-9_]+)"`)
	want := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		n, m := name.FindSubmatch(b), types.FindSubmatch(b)
		if n == nil || m == nil {
			continue // __init__.py
		}
		declared := str.FindAllSubmatch(m[1], -1)
		if v := vision.FindSubmatch(b); v != nil {
			declared = append(declared, str.FindAllSubmatch(v[1], -1)...)
		}
		for _, s := range declared {
			mt := string(s[1])
			if !slices.Contains(ServedModelTypes, mt) {
				want[mt] = string(n[1])
				continue
			}
			// a family both engines serve: the catalog says the same of it
			fam := Family{Name: string(n[1]), Publisher: string(publisher.FindSubmatch(b)[1]), Renderer: string(renderer.FindSubmatch(b)[1])}
			require.Equal(t, fam, Families[mt], f)
		}
	}
	require.NotEmpty(t, want)
	require.Equal(t, want, TorchModelTypes)
	require.Len(t, Families, len(ServedModelTypes))
}
