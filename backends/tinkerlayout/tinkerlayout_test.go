package tinkerlayout

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
)

// adapterFile writes a PEFT-layout adapter of a 1-layer model (q_proj and lm_head, r 2)
// and returns its bytes.
func adapterFile(t *testing.T, names ...string) []byte {
	t.Helper()
	var ts []safetensors.Tensor
	for i, n := range names {
		d := make([]float32, 6)
		for j := range d {
			d[j] = float32(i*10 + j)
		}
		ts = append(ts, safetensors.Tensor{Name: n, Shape: []int64{2, 3}, Data: d})
	}
	p := filepath.Join(t.TempDir(), "a.safetensors")
	_, err := safetensors.Write(p, ts, map[string]string{"format": "pt", "loops.seed": "7"})
	require.NoError(t, err)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

// tensors reads every tensor of a safetensors image as float64, with its metadata.
func tensors(t *testing.T, b []byte) (map[string][]float64, map[string]string) {
	t.Helper()
	f, err := safetensors.Parse(bytes.NewReader(b), int64(len(b)), safetensors.Limits{})
	require.NoError(t, err)
	out := map[string][]float64{}
	for k := range f.Tensors {
		d, _, err := f.ReadFloat64(k)
		require.NoError(t, err)
		out[k] = d
	}
	return out, f.Metadata
}

func rename(t *testing.T, b []byte, fn func(string) string) ([]byte, map[string]string) {
	t.Helper()
	rn, err := RenameTensors(bytes.NewReader(b), int64(len(b)), fn)
	require.NoError(t, err)
	var out bytes.Buffer
	_, err = out.ReadFrom(rn)
	require.NoError(t, err)
	require.EqualValues(t, out.Len(), rn.Size)
	return out.Bytes(), rn.Modules
}

func TestNames(t *testing.T) {
	for peftName, tinkerName := range map[string]string{
		"base_model.model.lm_head.lora_A.weight":                            "base_model.model.model.unembed_tokens.lora_A.weight",
		"base_model.model.lm_head.lora_B.weight.exp_avg_sq":                 "base_model.model.model.unembed_tokens.lora_B.weight.exp_avg_sq",
		"base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight":    "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight",
		"base_model.model.model.layers.0.mlp.down_proj.lora_B.weight":       "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight",
		"base_model.model.model.embed_tokens.lora_embedding_A":              "base_model.model.model.embed_tokens.lora_embedding_A",
		"base_model.model.model.language_model.layers.0.mlp.up_proj.lora_A": "base_model.model.model.language_model.layers.0.mlp.up_proj.lora_A",
	} {
		require.Equal(t, tinkerName, TinkerName(peftName, ""))
		require.Equal(t, peftName, PEFTName(tinkerName, ""))
	}
	// The cookbook's build_lora_adapter names a tied model's unembedding LoRA embed_tokens
	// (lora_A/lora_B); PEFT's own embedding LoRA (lora_embedding_A/B) stays what it is.
	require.Equal(t, "base_model.model.lm_head.lora_B.weight", PEFTName("base_model.model.model.embed_tokens.lora_B.weight", ""))
	require.Equal(t, "base_model.model.model.embed_tokens.lora_embedding_B", PEFTName("base_model.model.model.embed_tokens.lora_embedding_B", ""))
}

// TestVisionLanguageNames: a vision-language checkpoint's language model is named under
// model.language_model. in PEFT's names (the torch worker's, PEFT's on the full VL model);
// Tinker names it as the text model (the cookbook's Qwen3.5 merge adds the prefix itself).
func TestVisionLanguageNames(t *testing.T) {
	const vl = "model.language_model."
	for peftName, tinkerName := range map[string]string{
		"base_model.model.model.language_model.layers.0.linear_attn.in_proj_qkv.lora_A.weight": "base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_A.weight",
		"base_model.model.model.language_model.layers.1.mlp.experts.lora_B.weight.exp_avg":     "base_model.model.model.layers.1.mlp.experts.lora_B.weight.exp_avg",
		"base_model.model.lm_head.lora_A.weight":                                               "base_model.model.model.unembed_tokens.lora_A.weight",
	} {
		require.Equal(t, tinkerName, TinkerName(peftName, vl))
		require.Equal(t, peftName, PEFTName(tinkerName, vl))
		require.Equal(t, peftName, PEFTName(peftName, vl), "PEFT's names are kept")
	}
	// the cookbook's build_lora_adapter on the VL model: VL names, a tied head as the
	// language model's embed_tokens lora_A/lora_B
	require.Equal(t, "base_model.model.lm_head.lora_B.weight", PEFTName("base_model.model.model.language_model.embed_tokens.lora_B.weight", vl))
	// a text model's names are never given the prefix
	require.Equal(t, "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", PEFTName("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", ""))

	// ToPEFT on a VL base model reads either naming into PEFT's
	for name, prefix := range map[string]string{"tinker": "base_model.model.model.", "peft": "base_model.model.model.language_model."} {
		dir := t.TempDir()
		w := adapterFile(t, prefix+"layers.0.self_attn.q_proj.lora_A.weight", prefix+"layers.0.self_attn.q_proj.lora_B.weight")
		require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterWeightsFile), w, 0o644))
		cfg, _ := json.Marshal(map[string]any{"r": 2, "lora_alpha": 32, "target_modules": []string{"q_proj"}})
		require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), cfg, 0o644))
		changed, err := ToPEFT(dir, Base{Family: "qwen3_5", LanguageModelPrefix: vl})
		require.NoError(t, err, name)
		require.Equal(t, name == "tinker", changed, name)
		b, err := os.ReadFile(filepath.Join(dir, peft.AdapterWeightsFile))
		require.NoError(t, err)
		got, _ := tensors(t, b)
		want, _ := tensors(t, w)
		require.Equal(t, want[prefix+"layers.0.self_attn.q_proj.lora_B.weight"], got["base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight"], name)
		require.Len(t, got, 2, name)
	}
}

func TestRenameTensorsRoundTrip(t *testing.T) {
	orig := adapterFile(t,
		"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
		"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
		"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight")
	want, meta := tensors(t, orig)

	text := func(f func(string, string) string) func(string) string {
		return func(k string) string { return f(k, "") }
	}
	tk, mods := rename(t, orig, text(TinkerName))
	require.Equal(t, map[string]string{"lm_head": "unembed_tokens"}, mods)
	got, gotMeta := tensors(t, tk)
	require.Equal(t, meta, gotMeta)
	require.Len(t, got, 4)
	require.Equal(t, want["base_model.model.lm_head.lora_B.weight"], got["base_model.model.model.unembed_tokens.lora_B.weight"])
	require.Equal(t, want["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"], got["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"])
	// The data section is copied byte for byte.
	f, _ := safetensors.Parse(bytes.NewReader(orig), int64(len(orig)), safetensors.Limits{})
	g, _ := safetensors.Parse(bytes.NewReader(tk), int64(len(tk)), safetensors.Limits{})
	require.Equal(t, orig[f.DataOffset():], tk[g.DataOffset():])

	back, mods := rename(t, tk, text(PEFTName))
	require.Equal(t, map[string]string{"unembed_tokens": "lm_head"}, mods)
	gotBack, _ := tensors(t, back)
	require.Equal(t, want, gotBack)

	// Nothing to rename: the original bytes.
	same, mods := rename(t, back, text(PEFTName))
	require.Empty(t, mods)
	require.Equal(t, back, same)
}

func TestRenameTensorsRefuses(t *testing.T) {
	both := adapterFile(t, "base_model.model.lm_head.lora_A.weight", "base_model.model.model.unembed_tokens.lora_A.weight")
	rn, err := RenameTensors(bytes.NewReader(both), int64(len(both)), func(k string) string { return PEFTName(k, "") })
	require.ErrorContains(t, err, "two tensors are named base_model.model.lm_head.lora_A.weight")
	// With the error, the stream is the original file.
	var out bytes.Buffer
	_, _ = out.ReadFrom(rn)
	require.Equal(t, both, out.Bytes())

	for name, b := range map[string][]byte{"short": []byte("1234"), "garbage": []byte("12345678garbage"), "huge header": append([]byte{0, 0, 0, 0, 0, 0, 0, 1}, make([]byte, 64)...)} {
		rn, err := RenameTensors(bytes.NewReader(b), int64(len(b)), func(k string) string { return PEFTName(k, "") })
		require.Error(t, err, name)
		out.Reset()
		_, _ = out.ReadFrom(rn)
		require.Equal(t, b, out.Bytes(), name)
	}
}

func TestRenameTargetModules(t *testing.T) {
	in := []byte(`{"r": 4, "lora_alpha": 32, "target_modules": ["q_proj", "lm_head"], "base_model_name_or_path": "x"}`)
	out, changed, err := RenameTargetModules(in, TinkerModules)
	require.NoError(t, err)
	require.True(t, changed)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(out, &cfg))
	require.Equal(t, []any{"q_proj", "unembed_tokens"}, cfg["target_modules"])
	require.EqualValues(t, 4, cfg["r"])
	require.Equal(t, "x", cfg["base_model_name_or_path"])

	out, changed, err = RenameTargetModules([]byte(`{"target_modules": ["q_proj"]}`), TinkerModules)
	require.NoError(t, err)
	require.False(t, changed)
	require.Equal(t, `{"target_modules": ["q_proj"]}`, string(out))
	_, _, err = RenameTargetModules([]byte(`[1]`), TinkerModules)
	require.Error(t, err)
}

// TestToPEFT converts the folders Tinker's tools write: a Tinker-layout download, and the
// cookbook's build_lora_adapter output for a tied model (unembedding as embed_tokens).
func TestToPEFT(t *testing.T) {
	for name, tc := range map[string]struct {
		head, module string
	}{
		"tinker":        {"base_model.model.model.unembed_tokens", "unembed_tokens"},
		"cookbook tied": {"base_model.model.model.embed_tokens", "embed_tokens"},
		"peft":          {"base_model.model.lm_head", "lm_head"},
	} {
		dir := t.TempDir()
		w := adapterFile(t, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", tc.head+".lora_A.weight", tc.head+".lora_B.weight")
		require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterWeightsFile), w, 0o644))
		cfg, _ := json.Marshal(map[string]any{"r": 2, "lora_alpha": 32, "target_modules": []string{"q_proj", tc.module}})
		require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), cfg, 0o644))
		changed, err := ToPEFT(dir, Base{})
		require.NoError(t, err, name)
		require.Equal(t, tc.module != "lm_head", changed, name)
		b, err := os.ReadFile(filepath.Join(dir, peft.AdapterWeightsFile))
		require.NoError(t, err)
		got, _ := tensors(t, b)
		require.Contains(t, got, "base_model.model.lm_head.lora_B.weight", name)
		c, err := peft.ReadConfig(dir)
		require.NoError(t, err)
		require.Equal(t, []string{"q_proj", "lm_head"}, c.TargetModules, name)
		// Tinker's unembedding adapts a tied model's shared matrix; PEFT's own keeps its config
		require.Equal(t, tc.module != "lm_head", c.EnsureWeightTying, name)
		es, _ := os.ReadDir(dir)
		require.Len(t, es, 2, name) // no temporary file left
	}
}

// FuzzRenameTensors: any bytes convert without panicking, and a conversion's output is a
// valid safetensors file of the size it announced.
func FuzzRenameTensors(f *testing.F) {
	f.Add([]byte("12345678garbage"))
	f.Add(adapterFileFuzz(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		rn, err := RenameTensors(bytes.NewReader(b), int64(len(b)), func(k string) string { return TinkerName(k, "") })
		var out bytes.Buffer
		_, _ = out.ReadFrom(rn)
		if err != nil {
			require.Equal(t, b, out.Bytes())
			return
		}
		require.EqualValues(t, out.Len(), rn.Size)
		_, err = safetensors.Parse(bytes.NewReader(out.Bytes()), int64(out.Len()), safetensors.Limits{})
		require.NoError(t, err)
	})
}

func adapterFileFuzz(f *testing.F) []byte {
	p := filepath.Join(f.TempDir(), "a.safetensors")
	_, err := safetensors.Write(p, []safetensors.Tensor{
		{Name: "base_model.model.lm_head.lora_A.weight", Shape: []int64{1, 2}, Data: []float32{1, 2}},
		{Name: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", Shape: []int64{1, 1}, Data: []float32{3}},
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	return b
}

// TestToTinkerRefusesHeadOnlyTied: an adapter saved with the head-only rule on a tied
// model (loops.unembed = head-only) is refused with ErrHeadOnlyTied and its original
// bytes; one with the shared rule, or without the key, or head-only without a head LoRA,
// converts.
func TestToTinkerRefusesHeadOnlyTied(t *testing.T) {
	write := func(meta map[string]string, names ...string) []byte {
		var ts []safetensors.Tensor
		for _, n := range names {
			ts = append(ts, safetensors.Tensor{Name: n, Shape: []int64{2, 3}, Data: make([]float32, 6)})
		}
		p := filepath.Join(t.TempDir(), "a.safetensors")
		_, err := safetensors.Write(p, ts, meta)
		require.NoError(t, err)
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return b
	}
	head := []string{"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"}
	q := []string{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"}
	for _, tc := range []struct {
		meta    string
		names   []string
		refused bool
		// a file without metadata, whose config and base model say head-only
		// (CheckpointFromConfig)
		headOnlyTied bool
	}{
		{peft.UnembedHeadOnly, head, true, false},
		{peft.UnembedShared, head, false, false},
		{"", head, false, false},
		{peft.UnembedHeadOnly, q, false, false},
		{"", head, true, true},
		{"", q, false, true},
		{peft.UnembedShared, head, false, true}, // the file's own word wins
	} {
		meta := map[string]string{"format": "pt"}
		if tc.meta != "" {
			meta[peft.UnembedMetaKey] = tc.meta
		}
		b := write(meta, tc.names...)
		rn, err := ToTinker(bytes.NewReader(b), int64(len(b)), Checkpoint{HeadOnlyTied: tc.headOnlyTied})
		var out bytes.Buffer
		_, rerr := out.ReadFrom(rn)
		require.NoError(t, rerr)
		if tc.refused {
			require.ErrorIs(t, err, ErrHeadOnlyTied)
			require.Equal(t, b, out.Bytes(), "the original bytes")
			continue
		}
		require.NoError(t, err)
		got, _ := tensors(t, out.Bytes())
		for _, n := range tc.names {
			require.Contains(t, got, TinkerName(n, ""))
		}
	}
}

// TestCheckpointFromConfig: an adapter on a model with tied embeddings follows the head-only
// rule unless its config says ensure_weight_tying.
func TestCheckpointFromConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg      string
		tied     bool
		headOnly bool
	}{
		{`{"r": 4}`, true, true},
		{`{"r": 4, "ensure_weight_tying": false}`, true, true},
		{`{"r": 4, "ensure_weight_tying": true}`, true, false},
		{`{"r": 4}`, false, false},
	} {
		ck, err := CheckpointFromConfig([]byte(tc.cfg), Base{Family: "qwen3", TiedEmbeddings: tc.tied, LanguageModelPrefix: "p."})
		require.NoError(t, err)
		require.Equal(t, Checkpoint{Rank: 4, Family: "qwen3", LanguageModelPrefix: "p.", HeadOnlyTied: tc.headOnly}, ck, tc.cfg)
	}
}

// TestToPEFTReadsPEFTTiedSave: PEFT's own save of a tied model's unembedding under
// ensure_weight_tying (the head's pair, the embedding's lora_embedding_A/B copies of it,
// target_modules naming model.embed_tokens) becomes the head's pair alone, values as stored,
// with lm_head in target_modules and ensure_weight_tying kept.
func TestToPEFTReadsPEFTTiedSave(t *testing.T) {
	dir := t.TempDir()
	var ts []safetensors.Tensor
	want := map[string][]float64{}
	for i, n := range []string{
		"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
		"base_model.model.model.embed_tokens.lora_embedding_A", "base_model.model.lm_head.lora_A.weight",
		"base_model.model.model.embed_tokens.lora_embedding_B", "base_model.model.lm_head.lora_B.weight",
	} {
		d := []float32{float32(i), float32(i) + 0.5}
		ts = append(ts, safetensors.Tensor{Name: n, Shape: []int64{1, 2}, Data: d})
		if !strings.Contains(n, "lora_embedding") {
			want[n] = []float64{float64(d[0]), float64(d[1])}
		}
	}
	_, err := safetensors.Write(filepath.Join(dir, peft.AdapterWeightsFile), ts, map[string]string{"format": "pt"})
	require.NoError(t, err)
	cfg, _ := json.Marshal(map[string]any{"r": 1, "lora_alpha": 8, "ensure_weight_tying": true,
		"target_modules": []string{"q_proj", "model.embed_tokens"}})
	require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), cfg, 0o644))
	changed, err := ToPEFT(dir, Base{})
	require.NoError(t, err)
	require.True(t, changed)
	b, err := os.ReadFile(filepath.Join(dir, peft.AdapterWeightsFile))
	require.NoError(t, err)
	got, meta := tensors(t, b)
	require.Equal(t, want, got)
	require.Equal(t, "pt", meta["format"])
	c, err := peft.ReadConfig(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"q_proj", "lm_head"}, c.TargetModules)
	require.True(t, c.EnsureWeightTying)
	es, _ := os.ReadDir(dir)
	require.Len(t, es, 2) // no temporary file left
}

// FuzzToPEFT: any weights file converts in place without panicking; a folder it changes
// holds a valid safetensors file, and one it leaves alone is as it was. (A refusal may come
// after a first step rewrote the file: imports convert in a staging folder they discard.)
func FuzzToPEFT(f *testing.F) {
	f.Add([]byte("12345678garbage"))
	f.Add(adapterFileFuzz(f))
	p := filepath.Join(f.TempDir(), "tied.safetensors")
	_, err := safetensors.Write(p, []safetensors.Tensor{
		{Name: "base_model.model.lm_head.lora_A.weight", Shape: []int64{1, 2}, Data: []float32{1, 2}},
		{Name: "base_model.model.lm_head.lora_B.weight", Shape: []int64{1, 1}, Data: []float32{3}},
		{Name: "base_model.model.model.embed_tokens.lora_embedding_A", Shape: []int64{1, 1}, Data: []float32{3}},
		{Name: "base_model.model.model.embed_tokens.lora_embedding_B", Shape: []int64{2, 1}, Data: []float32{1, 2}},
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	tied, _ := os.ReadFile(p)
	f.Add(tied)
	_, experts := expertAdapter(f)
	rn, err := ToTinker(bytes.NewReader(experts), int64(len(experts)), Checkpoint{Rank: exR, Family: "nemotron_h"})
	if err != nil {
		f.Fatal(err)
	}
	nemotron, _ := io.ReadAll(rn)
	f.Add(nemotron)
	// the base models it converts for: a text model, a VL checkpoint, MoE families
	bases := []Base{{}, {Family: "qwen3_5", LanguageModelPrefix: "model.language_model."}, {Family: "qwen3_moe"}, {Family: "nemotron_h"}, {Family: "gpt_oss"}}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, base := range bases {
			fuzzToPEFT(t, b, base)
		}
	})
}

func fuzzToPEFT(t *testing.T, b []byte, base Base) {
	{
		dir := t.TempDir()
		wp := filepath.Join(dir, peft.AdapterWeightsFile)
		require.NoError(t, os.WriteFile(wp, b, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile),
			[]byte(`{"r": 1, "lora_alpha": 8, "target_modules": ["model.embed_tokens", "unembed_tokens"]}`), 0o644))
		changed, err := ToPEFT(dir, base)
		if err != nil {
			return
		}
		got, rerr := os.ReadFile(wp)
		require.NoError(t, rerr)
		if !changed {
			require.Equal(t, b, got)
			return
		}
		_, err = safetensors.Parse(bytes.NewReader(got), int64(len(got)), safetensors.Limits{})
		require.NoError(t, err)
	}
}
