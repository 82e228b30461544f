package nn

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// gemmaMicro is a tiny Gemma 3 config: layers sliding, full, sliding with a window of 3,
// an attention scale of query_pre_attn_scalar 6 (not the head width), tied embeddings.
func gemmaMicro() Config {
	c := microConfig(true)
	c.ModelType, c.Layers = gemma3Type, 3
	c.LayerTypes = []string{"sliding_attention", "full_attention", "sliding_attention"}
	c.SlidingWindow, c.QueryPreAttnScalar, c.RopeLocalBaseFreq = 3, 6, 100
	return c
}

// randomGemma is a float64 micro Gemma 3 with random norm weights (so that 1+w matters).
func randomGemma(t *testing.T, cfg Config) *Model[float64] {
	m, err := NewRandom[float64](cfg, RandomOptions{Std: 0.3, Seed: 7})
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(5, 5))
	norms := [][]float64{m.Norm}
	for _, L := range m.Layers {
		norms = append(norms, L.AttnNorm, L.PostAttnNorm, L.MLPNorm, L.PostMLPNorm, L.QNorm, L.KNorm)
	}
	for _, w := range norms {
		for i := range w {
			w[i] = 1 + 0.3*r.NormFloat64()
		}
	}
	return m
}

// TestGemma3GradientsFiniteDifference: the LoRA gradients of a Gemma 3 model (post-norms,
// gelu-tanh MLP, sliding windows shorter than the sequences, the scaled embedding of the
// tied unembedding LoRA) equal central finite differences of its loss.
func TestGemma3GradientsFiniteDifference(t *testing.T) {
	m := randomGemma(t, gemmaMicro())
	ad, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	require.True(t, ad.TiedEmbed)
	randomizeAdapter(ad, 3, 0.2)
	r := rand.New(rand.NewPCG(9, 9))
	var seqs []Seq[float64]
	for _, n := range []int{7, 5} {
		toks, tg := randSeq(r, n, m.Cfg.Vocab, 1)
		seqs = append(seqs, Seq[float64]{Tokens: toks, Targets: tg, K: 1, Adapter: ad})
	}
	m.ForwardBackward(seqs, testLoss, true)
	const h = 1e-5
	worst, largest := 0.0, 0.0
	for _, p := range ad.Params {
		for range 2 {
			i := r.IntN(len(p.W))
			w0 := p.W[i]
			p.W[i] = w0 + h
			lp := totalLoss(m.ForwardBackward(seqs, testLoss, false))
			p.W[i] = w0 - h
			lm := totalLoss(m.ForwardBackward(seqs, testLoss, false))
			p.W[i] = w0
			fd, an := (lp-lm)/(2*h), p.G[i]
			rel := math.Abs(fd-an) / math.Max(math.Abs(fd)+math.Abs(an), 1e-7)
			largest = max(largest, math.Abs(an))
			if math.Abs(fd-an) < 1e-9 {
				rel = 0
			}
			worst = max(worst, rel)
			require.Lessf(t, rel, 1e-5, "%s[%d]: analytic %g, finite difference %g", p.Name, i, an, fd)
		}
	}
	t.Logf("worst relative error %.2e (largest gradient checked %.2e)", worst, largest)
}

// TestGemma3CacheDecodingEqualsForward: token-by-token decoding with the KV cache (past the
// sliding window) gives the training pass's log-probs, with an adapter; and the window
// matters (a model whose layers are all global gives other log-probs).
func TestGemma3CacheDecodingEqualsForward(t *testing.T) {
	m := randomGemma(t, gemmaMicro())
	ad, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 1, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	randomizeAdapter(ad, 4, 0.2)
	r := rand.New(rand.NewPCG(2, 2))
	toks, tg := randSeq(r, 11, m.Cfg.Vocab, 1)
	want := m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: ad}}, testLoss, false)[0].LogProbs
	cache := m.NewCache()
	V := m.Cfg.Vocab
	for i, tok := range toks {
		lg := m.Logits(m.Step([]int{tok}, []int{i}, []*KVCache[float64]{cache}, ad), 1, ad)
		require.InDelta(t, want[i], lg[tg[i]]-logSumExp(lg[:V]), 1e-12, "position %d", i)
	}

	global := gemmaMicro()
	global.LayerTypes = []string{"full_attention", "full_attention", "full_attention"}
	mg := randomGemma(t, global)
	mg.cosL, mg.sinL = m.cosL, m.sinL
	mg.Cfg.gemma.sliding = []bool{true, false, true} // the same RoPE tables, no window
	mg.Cfg.gemma.window = 0
	other := mg.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: ad}}, testLoss, false)[0].LogProbs
	require.InDeltaSlice(t, want[:3], other[:3], 1e-12, "inside the window the layers agree")
	require.NotEqual(t, want[3:], other[3:], "past the window they differ")
}

// TestGemma3ConfigRefusals: what the engine does not compute is refused with a reason.
func TestGemma3ConfigRefusals(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`"final_logit_softcapping": 30.0`, "softcapping"},
		{`"attn_logit_softcapping": 50.0`, "softcapping"},
		{`"hidden_activation": "gelu"`, "hidden_activation"},
		{`"use_bidirectional_attention": true`, "bidirectional"},
		{`"layer_types": ["chunked_attention"]`, "layer_types[0]"},
		{`"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4}}`, "yarn"},
	} {
		dir := t.TempDir()
		cfg := `{"model_type": "gemma3_text", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, ` +
			`"num_attention_heads": 1, "head_dim": 4, "intermediate_size": 4, ` + tc.json + `}`
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644))
		_, err := ReadConfig(dir)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestGemma3Transformers checks the engine against transformers 5 + PEFT
// (testdata/gemma3_transformers.py) on a tiny random Gemma3ForCausalLM whose sequence is
// longer than its sliding window: base and adapted log-probs in float64 (1e-5) and float32
// (1e-4), the LoRA gradients in float64 (1e-5 relative to the largest), and adapters the
// engine trained or wrote (one with an unembedding LoRA on the tied matrix, which PEFT's
// ensure_weight_tying applies to the embedding lookup too, scaled by √hidden), saved and
// loaded by PEFT, give the engine's log-probs (1e-5). The float64
// bounds are float32's: transformers computes Gemma's RMSNorm in float32 whatever the
// model's dtype (x.float()), so its float64 model rounds there. It runs when
// LOOPS_TORCH_PYTHON names a python with torch, transformers and peft (make test-export).
func TestGemma3Transformers(t *testing.T) {
	py := os.Getenv("LOOPS_TORCH_PYTHON")
	if py == "" {
		t.Skip("LOOPS_TORCH_PYTHON not set (make test-export sets it)")
	}
	dir := t.TempDir()
	run := func(args ...string) []byte {
		cmd := exec.Command(py, append([]string{"testdata/gemma3_transformers.py"}, args...)...)
		cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
		out, err := cmd.Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			t.Log(string(ee.Stderr))
		}
		require.NoError(t, err)
		return out
	}
	var fx struct {
		Tokens, Targets        []int
		Base64, Lora64, Lora32 []float64
		Grads                  map[string][]float64
	}
	require.NoError(t, json.Unmarshal(run("make", dir), &fx))
	model, adapter := filepath.Join(dir, "model"), filepath.Join(dir, "adapter")
	m64, err := Load[float64](model)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, true}, m64.Cfg.gemma.sliding)
	require.Less(t, m64.Cfg.gemma.window, len(fx.Tokens))
	seq := func(a *Adapter[float64]) []Seq[float64] {
		return []Seq[float64]{{Tokens: fx.Tokens, Targets: fx.Targets, K: 1, Adapter: a}}
	}
	nll := func(s, pos, k int, lp float64) (float64, float64) { return -lp, -1 }
	require.InDeltaSlice(t, fx.Base64, m64.ForwardBackward(seq(nil), nll, false)[0].LogProbs, 1e-5)

	a64, err := LoadAdapter(adapter, m64, false, 64)
	require.NoError(t, err)
	got := m64.ForwardBackward(seq(a64), nll, true)[0].LogProbs
	require.InDeltaSlice(t, fx.Lora64, got, 1e-5)
	require.Len(t, a64.Params, len(fx.Grads))
	var scale float64
	for _, g := range fx.Grads {
		for _, v := range g {
			scale = max(scale, math.Abs(v))
		}
	}
	for _, p := range a64.Params {
		want, ok := fx.Grads[p.Name]
		require.True(t, ok, p.Name)
		require.InDeltaSlice(t, want, p.G, 1e-5*scale, p.Name)
	}

	m32, err := Load[float32](model)
	require.NoError(t, err)
	a32, err := LoadAdapter(adapter, m32, false, 64)
	require.NoError(t, err)
	out32 := m32.ForwardBackward([]Seq[float32]{{Tokens: fx.Tokens, Targets: fx.Targets, K: 1, Adapter: a32}}, nll, false)
	require.InDeltaSlice(t, fx.Lora32, out32[0].LogProbs, 1e-4)

	// a step of AdamW on the engine, saved, loaded by PEFT; and an adapter with an
	// unembedding LoRA on the tied matrix (saved with ensure_weight_tying: PEFT adapts the
	// embedding lookup too, scaled by √hidden as the base lookup is)
	a64.AdamStep(AdamParams{LR: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8})
	tied, err := NewAdapter(m64, LoraConfig{Rank: 4, Seed: 5, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	require.True(t, tied.TiedEmbed)
	randomizeAdapter(tied, 6, 0.15)
	toks, _ := json.Marshal(fx.Tokens)
	tgts, _ := json.Marshal(fx.Targets)
	for name, a := range map[string]*Adapter[float64]{"trained": a64, "tied": tied} {
		path := filepath.Join(dir, name)
		_, err = SaveAdapter(path, a, model, false)
		require.NoError(t, err)
		saved, err := LoadAdapter(path, m64, false, 64) // the float32 weights PEFT reads
		require.NoError(t, err)
		mine := m64.ForwardBackward(seq(saved), nll, false)[0].LogProbs
		require.NotEqual(t, got, mine)
		var peftLP []float64
		require.NoError(t, json.Unmarshal(run("score", model, path, string(toks), string(tgts)), &peftLP))
		require.InDeltaSlice(t, peftLP, mine, 1e-5, name)
	}
}
