package nn

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/stretchr/testify/require"
)

// moeMicro is a tiny Qwen3-MoE config: three layers of which the middle one is a dense MLP
// (mlp_only_layers), four experts, top-2.
func moeMicro(normTopK bool) Config {
	c := microConfig(false)
	c.ModelType, c.Layers = qwen3MoeType, 3
	c.NumExperts, c.TopK, c.MoEInter, c.NormTopK, c.MLPOnlyLayers = 4, 2, 12, normTopK, []int{1}
	return c
}

func randomMoEModel(t *testing.T, cfg Config) *Model[float64] {
	m, err := NewRandom[float64](cfg, RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, true}, m.Cfg.moe.sparse)
	return m
}

// TestMoEGradientsFiniteDifference: the LoRA gradients of a Qwen3-MoE model (the experts'
// per-expert LoRA, attention and head LoRA, the gradient through the router's weights with
// and without norm_topk_prob) equal central finite differences of its loss, in a batch
// whose sequences use the adapter, no adapter and the adapter again (the experts' rows
// then fall in several segments).
func TestMoEGradientsFiniteDifference(t *testing.T) {
	for _, norm := range []bool{true, false} {
		m := randomMoEModel(t, moeMicro(norm))
		ad, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 1, Attn: true, MLP: true, Unembed: true})
		require.NoError(t, err)
		require.Equal(t, []string{"gate_up_proj", "down_proj"}, ad.TargetParameters())
		require.Equal(t, []string{"q_proj", "k_proj", "v_proj", "o_proj", "lm_head"}, ad.TargetModules())
		require.Nil(t, ad.Layers[1][TGate], "the dense MLP layer of a MoE model is not adapted")
		randomizeAdapter(ad, 3, 0.3)
		r := rand.New(rand.NewPCG(9, 9))
		var seqs []Seq[float64]
		for i, n := range []int{7, 4, 5} {
			toks, tg := randSeq(r, n, m.Cfg.Vocab, 1)
			s := Seq[float64]{Tokens: toks, Targets: tg, K: 1, Adapter: ad}
			if i == 1 {
				s.Adapter = nil
			}
			seqs = append(seqs, s)
		}
		m.ForwardBackward(seqs, testLoss, true)
		const h = 1e-5
		worst := 0.0
		for _, p := range ad.Params {
			for range 3 {
				i := r.IntN(len(p.W))
				w0 := p.W[i]
				p.W[i] = w0 + h
				lp := totalLoss(m.ForwardBackward(seqs, testLoss, false))
				p.W[i] = w0 - h
				lm := totalLoss(m.ForwardBackward(seqs, testLoss, false))
				p.W[i] = w0
				fd, an := (lp-lm)/(2*h), p.G[i]
				rel := math.Abs(fd-an) / math.Max(math.Abs(fd)+math.Abs(an), 1e-7)
				if math.Abs(fd-an) < 1e-9 {
					rel = 0
				}
				worst = max(worst, rel)
				require.Lessf(t, rel, 1e-5, "norm_topk_prob %v: %s[%d]: analytic %g, finite difference %g", norm, p.Name, i, an, fd)
			}
		}
		t.Logf("norm_topk_prob %v: worst relative error %.2e", norm, worst)
	}
}

// TestMoECacheDecodingEqualsForward: token-by-token decoding with the KV cache, and a
// batched step of several rows, give the training pass's log-probs, with an adapter.
func TestMoECacheDecodingEqualsForward(t *testing.T) {
	m := randomMoEModel(t, moeMicro(true))
	ad, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 1, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	randomizeAdapter(ad, 4, 0.3)
	r := rand.New(rand.NewPCG(2, 2))
	toks, tg := randSeq(r, 11, m.Cfg.Vocab, 1)
	want := m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: ad}}, testLoss, false)[0].LogProbs
	V := m.Cfg.Vocab
	for _, mode := range []prodMode{prodFwd, prodRows, prodWide} {
		cache := m.NewCache()
		segs := []seg[float64]{{0, 1, ad}}
		for i, tok := range toks {
			lg := m.Logits(m.step([]int{tok}, []int{i}, []*KVCache[float64]{cache}, segs, mode, nil), 1, ad)
			require.InDelta(t, want[i], lg[tg[i]]-logSumExp(lg[:V]), 1e-12, "mode %d position %d", mode, i)
		}
	}
	// a prefill of all rows at once
	cache := m.NewCache()
	caches := make([]*KVCache[float64], len(toks))
	pos := make([]int, len(toks))
	for i := range toks {
		caches[i], pos[i] = cache, i
	}
	lg := m.Logits(m.Step(toks, pos, caches, ad), len(toks), ad)
	for i := range toks {
		require.InDelta(t, want[i], lg[i*V+tg[i]]-logSumExp(lg[i*V:(i+1)*V]), 1e-12, "prefill position %d", i)
	}
}

// TestMoEDecodingRowsAreIndependent: in float32, a row decoded in a batch with other
// sequences' rows (routed to the same experts or not, with other adapters) gets the bits
// it gets decoded alone, in the decoding product modes that promise it (prodRows, prodWide).
func TestMoEDecodingRowsAreIndependent(t *testing.T) {
	m64 := randomMoEModel(t, moeMicro(true))
	m := Convert[float32](m64)
	ad, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 1, Attn: true, MLP: true})
	require.NoError(t, err)
	randomizeAdapter(ad, 4, 0.3)
	r := rand.New(rand.NewPCG(5, 5))
	const n = 9
	prompts := make([][]int, n)
	for i := range prompts {
		prompts[i], _ = randSeq(r, 3+i%4, m.Cfg.Vocab, 1)
	}
	adOf := func(i int) *Adapter[float32] {
		if i%3 == 1 {
			return nil
		}
		return ad
	}
	for _, mode := range []prodMode{prodRows, prodWide} { // prodFwd's dense products depend on the row count
		prefill := func(i int) *KVCache[float32] {
			c := m.NewCache()
			for p, tok := range prompts[i] {
				m.step([]int{tok}, []int{p}, []*KVCache[float32]{c}, []seg[float32]{{0, 1, adOf(i)}}, mode, nil)
			}
			return c
		}
		D := m.Cfg.Hidden
		alone := make([][]float32, n)
		for i := range n {
			h := m.step([]int{i + 1}, []int{len(prompts[i])}, []*KVCache[float32]{prefill(i)}, []seg[float32]{{0, 1, adOf(i)}}, mode, nil)
			alone[i] = append([]float32(nil), h...)
		}
		toks, pos, caches := make([]int, n), make([]int, n), make([]*KVCache[float32], n)
		var segs []seg[float32]
		for i := range n {
			toks[i], pos[i], caches[i] = i+1, len(prompts[i]), prefill(i)
			segs = append(segs, seg[float32]{i, i + 1, adOf(i)})
		}
		h := m.step(toks, pos, caches, segs, mode, nil)
		for i := range n {
			require.Equal(t, alone[i], h[i*D:(i+1)*D], "mode %d row %d", mode, i)
		}
	}
}

// TestMoEAdapterRoundTrip: an expert LoRA saved (PEFT's target_parameters layout: lora_B
// [out, r·E], expert e's column k at k·E+e) and loaded back holds the same weights,
// moments and gradients, and gives the same log-probs; a clone is independent.
func TestMoEAdapterRoundTrip(t *testing.T) {
	m := randomMoEModel(t, moeMicro(true))
	ad, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 1, Attn: true, MLP: true})
	require.NoError(t, err)
	randomizeAdapter(ad, 5, 0.3)
	r := rand.New(rand.NewPCG(3, 3))
	toks, tg := randSeq(r, 6, m.Cfg.Vocab, 1)
	seqs := []Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: ad}}
	m.ForwardBackward(seqs, testLoss, true)
	ad.AdamStep(AdamParams{LR: 0.01, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8})
	want := m.ForwardBackward(seqs, testLoss, true)[0].LogProbs
	dir := t.TempDir()
	_, err = SaveAdapter(dir, ad, "base", true)
	require.NoError(t, err)
	_, err = SaveGradients(dir, ad)
	require.NoError(t, err)

	pc, err := peft.ReadConfig(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"gate_up_proj", "down_proj"}, pc.TargetParameters)
	f, err := safetensors.Open(filepath.Join(dir, peft.AdapterWeightsFile))
	require.NoError(t, err)
	defer f.Close()
	key := "base_model.model.model.layers.0.mlp.experts.lora_B.weight" // down_proj: [D, r·E]
	require.Equal(t, []int64{16, 8}, f.Tensors[key].Shape)
	d, _, err := f.ReadFloat64(key)
	require.NoError(t, err)
	B := ad.Experts[0][expDown].Pairs[3].B.W // expert 3's [16, 2]
	require.InDelta(t, B[5*2+1], d[5*8+1*4+3], 1e-7, "B_e[o,k] is stored at [o, k·E+e]")
	require.Contains(t, f.Tensors, "base_model.model.model.layers.2.mlp.experts.base_layer.lora_A.weight")

	// PEFT's keys: one ".base_layer" per later targeted parameter of the experts module
	require.Equal(t, "base_model.model.model.layers.2.mlp.experts", expertKey(2, expGateUp, []string{"gate_up_proj"}))
	require.Equal(t, "base_model.model.model.layers.2.mlp.experts", expertKey(2, expDown, []string{"down_proj", "gate_up_proj"}))
	require.Equal(t, "base_model.model.model.layers.2.mlp.experts.base_layer", expertKey(2, expGateUp, []string{"down_proj", "gate_up_proj"}))

	back, err := LoadAdapter(dir, m, true, 8)
	require.NoError(t, err)
	require.NoError(t, LoadGradients(dir, back))
	require.Len(t, back.Params, len(ad.Params))
	for i, p := range ad.Params {
		q := back.Params[i]
		require.Equal(t, p.Name, q.Name)
		require.InDeltaSlice(t, p.W, q.W, 1e-6, p.Name) // float32 in the files
		require.InDeltaSlice(t, p.M, q.M, 1e-6, p.Name)
		require.InDeltaSlice(t, p.V, q.V, 1e-6, p.Name)
		require.InDeltaSlice(t, p.G, q.G, 1e-5, p.Name)
	}
	got := m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: back}}, testLoss, false)[0].LogProbs
	require.InDeltaSlice(t, want, got, 1e-5) // the weights were rounded to float32

	cl := ad.Clone()
	cl.Experts[0][expGateUp].Pairs[1].A.W[0] += 1
	require.NotEqual(t, cl.Experts[0][expGateUp].A.W, ad.Experts[0][expGateUp].A.W, "a clone's expert views are its own")
	require.Equal(t, cl.Experts[0][expGateUp].A.W[1*2*16], cl.Experts[0][expGateUp].Pairs[1].A.W[0])

	// an adapter listing the dense MLP names is refused on a MoE model
	cfg := `{"peft_type": "LORA", "r": 2, "lora_alpha": 32, "target_modules": ["q_proj", "gate_proj"]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), []byte(cfg), 0o644))
	_, err = LoadAdapter(dir, m, false, 8)
	require.ErrorContains(t, err, "the MLP LoRA is the experts'")
}

// TestMoEMerged: the merged model (each expert W + scale·B_e·A_e) gives the adapted
// logits; written as transformers writes a checkpoint (per-expert tensors) and loaded
// again, it gives them too.
func TestMoEMerged(t *testing.T) {
	m := randomMoEModel(t, moeMicro(true))
	a, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	randomizeAdapter(a, 6, 0.2)
	toks, pos := []int{1, 5, 9, 3, 7}, []int{0, 1, 2, 3, 4}
	logits := func(m *Model[float64], a *Adapter[float64]) []float64 {
		c := m.NewCache()
		return m.Logits(m.Step(toks, pos, []*KVCache[float64]{c, c, c, c, c}, a), len(toks), a)
	}
	want := logits(m, a)
	merged := Merged(m, a)
	require.InDeltaSlice(t, want, logits(merged, nil), 1e-9)
	var bytes int64
	dir := t.TempDir()
	ts := merged.Tensors()
	for _, x := range ts {
		bytes += 4 * int64(len(x.Data))
	}
	require.Equal(t, bytes, MergedBytes(m, a))
	_, err = safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"})
	require.NoError(t, err)
	require.NoError(t, WriteConfig(dir, merged.Cfg, nil))
	back, err := Load[float64](dir)
	require.NoError(t, err)
	require.InDeltaSlice(t, want, logits(back, nil), 1e-5) // the tensors are float32
}

// TestMoEConfigRefusals: what the engine does not compute is refused with a reason.
func TestMoEConfigRefusals(t *testing.T) {
	base := `{"model_type": "qwen3_moe", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 2, ` +
		`"num_attention_heads": 1, "head_dim": 4, "intermediate_size": 4, "moe_intermediate_size": 2, `
	for _, tc := range []struct{ json, want string }{
		{`"num_experts": 4, "num_experts_per_tok": 2, "output_router_logits": true, "router_aux_loss_coef": 0.001`, "load-balancing loss"},
		{`"num_experts": 4, "num_experts_per_tok": 2, "use_sliding_window": true`, "use_sliding_window"},
		{`"num_experts": 4, "num_experts_per_tok": 5`, "num_experts_per_tok 5"},
		{`"num_experts": 0`, "num_experts 0"},
		{`"num_experts": 4, "num_local_experts": 8, "num_experts_per_tok": 2`, "disagree"},
		{`"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": -1`, "decoder_sparse_step"},
		{`"num_experts": 4, "num_experts_per_tok": 2, "hidden_act": "gelu"`, "hidden_act"},
	} {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(base+tc.json+`}`), 0o644))
		_, err := ReadConfig(dir)
		require.ErrorContains(t, err, tc.want)
	}
	dir := t.TempDir()
	ok := base + `"num_local_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 2, "output_router_logits": true, "router_aux_loss_coef": 0}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(ok), 0o644))
	c, err := ReadConfig(dir)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true}, c.moe.sparse, "decoder_sparse_step 2: the second layer is sparse")
}

// TestQwen3MoeTransformers checks the engine against transformers 5 + PEFT
// (testdata/qwen3moe_transformers.py) on a tiny random Qwen3MoeForCausalLM (hidden 64, 4
// experts, top-2, norm_topk_prob, a dense layer between two sparse ones): base and
// adapted log-probs in float64 (1e-5) and float32 (1e-4), the LoRA gradients (attention
// and every expert's gate_up_proj and down_proj, PEFT's target_parameters) in float64
// (1e-5 relative to the largest), and an adapter the engine trained, saved and loaded by
// PEFT, gives the engine's log-probs (1e-5). The float64 bounds are float32's:
// transformers computes the RMSNorms and the router's softmax in float32 whatever the
// model's dtype. It runs when LOOPS_TORCH_PYTHON names a python with torch, transformers
// and peft (make test-export).
func TestQwen3MoeTransformers(t *testing.T) {
	py := os.Getenv("LOOPS_TORCH_PYTHON")
	if py == "" {
		t.Skip("LOOPS_TORCH_PYTHON not set (make test-export sets it)")
	}
	dir := t.TempDir()
	run := func(args ...string) []byte {
		cmd := exec.Command(py, append([]string{"testdata/qwen3moe_transformers.py"}, args...)...)
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
	require.Equal(t, []bool{true, false, true}, m64.Cfg.moe.sparse)
	seq := func(a *Adapter[float64]) []Seq[float64] {
		return []Seq[float64]{{Tokens: fx.Tokens, Targets: fx.Targets, K: 1, Adapter: a}}
	}
	nll := func(s, pos, k int, lp float64) (float64, float64) { return -lp, -1 }
	base := m64.ForwardBackward(seq(nil), nll, false)[0].LogProbs
	require.InDeltaSlice(t, fx.Base64, base, 1e-5)
	t.Logf("float64 base log-probs: max |Δ| %.2e", maxAbsDiff(fx.Base64, base))

	a64, err := LoadAdapter(adapter, m64, false, 64)
	require.NoError(t, err)
	require.NotNil(t, a64.Experts)
	got := m64.ForwardBackward(seq(a64), nll, true)[0].LogProbs
	require.InDeltaSlice(t, fx.Lora64, got, 1e-5)
	t.Logf("float64 adapted log-probs: max |Δ| %.2e", maxAbsDiff(fx.Lora64, got))
	require.Len(t, a64.Params, len(fx.Grads))
	var scale, worst float64
	for _, g := range fx.Grads {
		for _, v := range g {
			scale = max(scale, math.Abs(v))
		}
	}
	for _, p := range a64.Params {
		want, ok := fx.Grads[p.Name]
		require.True(t, ok, p.Name)
		g := p.stored(p.G)
		require.InDeltaSlice(t, want, g, 1e-5*scale, p.Name)
		worst = max(worst, maxAbsDiff(want, g))
	}
	t.Logf("LoRA gradients: max |Δ| %.2e (largest gradient %.2e)", worst, scale)

	m32, err := Load[float32](model)
	require.NoError(t, err)
	a32, err := LoadAdapter(adapter, m32, false, 64)
	require.NoError(t, err)
	out32 := m32.ForwardBackward([]Seq[float32]{{Tokens: fx.Tokens, Targets: fx.Targets, K: 1, Adapter: a32}}, nll, false)
	require.InDeltaSlice(t, fx.Lora32, out32[0].LogProbs, 1e-4)
	t.Logf("float32 adapted log-probs: max |Δ| %.2e", maxAbsDiff(fx.Lora32, out32[0].LogProbs))

	// a step of AdamW on the engine, saved, loaded by PEFT
	a64.AdamStep(AdamParams{LR: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8})
	path := filepath.Join(dir, "trained")
	_, err = SaveAdapter(path, a64, model, false)
	require.NoError(t, err)
	saved, err := LoadAdapter(path, m64, false, 64) // the float32 weights PEFT reads
	require.NoError(t, err)
	mine := m64.ForwardBackward(seq(saved), nll, false)[0].LogProbs
	require.NotEqual(t, got, mine)
	toks, _ := json.Marshal(fx.Tokens)
	tgts, _ := json.Marshal(fx.Targets)
	var peftLP []float64
	require.NoError(t, json.Unmarshal(run("score", model, path, string(toks), string(tgts)), &peftLP))
	require.InDeltaSlice(t, peftLP, mine, 1e-5)
	t.Logf("trained adapter in PEFT: max |Δ| %.2e", maxAbsDiff(peftLP, mine))

	// a new adapter's expert lora_A (E·r rows) is the torch worker's, bit for bit in float32
	fresh, err := NewAdapter(m32, LoraConfig{Rank: 3, Seed: 11, Attn: true, MLP: true})
	require.NoError(t, err)
	var specs [][]any
	for _, x := range []*ExpertLoRA[float32]{fresh.Experts[0][expGateUp], fresh.Experts[2][expDown]} {
		specs = append(specs, []any{x.A.Name, x.A.Shape[0], x.A.Shape[1]})
	}
	sj, _ := json.Marshal(specs)
	var worker map[string][]float32
	require.NoError(t, json.Unmarshal(run("init", "11", "3", string(sj)), &worker))
	for _, x := range []*ExpertLoRA[float32]{fresh.Experts[0][expGateUp], fresh.Experts[2][expDown]} {
		require.Equal(t, worker[x.A.Name], x.A.W, x.A.Name)
	}
}

func maxAbsDiff(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

// FuzzLoadMoEAdapter drives LoadAdapter on the micro MoE model with arbitrary adapter
// files (the seeds: a saved expert LoRA, one target parameter only, unknown or swapped
// target_parameters, a model's dense MLP names); it fails on any panic, and an adapter
// it accepts must fit the model: every expert view inside its tensors.
func FuzzLoadMoEAdapter(f *testing.F) {
	m64, err := NewRandom[float64](moeMicro(true), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(f, err)
	m := Convert[float32](m64)
	a, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 3, Attn: true, MLP: true})
	require.NoError(f, err)
	randomizeAdapter(a, 5, 0.1)
	src := f.TempDir()
	_, err = SaveAdapter(src, a, "micro", true)
	require.NoError(f, err)
	var files [3][]byte
	for i, name := range []string{peft.AdapterConfigFile, peft.AdapterWeightsFile, peft.OptimizerFile} {
		files[i], err = os.ReadFile(filepath.Join(src, name))
		require.NoError(f, err)
	}
	cfg := string(files[0])
	f.Add(files[0], files[1], files[2])
	for _, tp := range []string{`["down_proj"]`, `["gate_up_proj"]`, `["down_proj", "gate_up_proj"]`, `["w1"]`, `[]`} {
		f.Add([]byte(regexpReplace(cfg, `"target_parameters": \[[^\]]*\]`, `"target_parameters": `+tp)), files[1], files[2])
	}
	f.Add([]byte(`{"r": 2, "target_modules": ["gate_proj"], "target_parameters": ["down_proj"]}`), files[1], files[2])
	f.Add([]byte(`{"r": 1, "target_parameters": ["down_proj"]}`), files[1], files[2])
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, cfg, weights, optim []byte) {
		writeFolder(t, dir, [3][]byte{cfg, weights, optim})
		a, err := LoadAdapter(dir, m, true, 8)
		if err != nil {
			return
		}
		for _, p := range a.Params {
			require.Len(t, p.W, p.Shape[0]*p.Shape[1], p.Name)
		}
		for _, x := range a.Experts {
			for _, e := range x {
				if e == nil {
					continue
				}
				require.Len(t, e.Pairs, 4)
				for _, p := range e.Pairs {
					require.Len(t, p.A.W, p.Rank*p.In)
					require.Len(t, p.B.W, p.Out*p.Rank)
				}
			}
		}
		m.ForwardBackward([]Seq[float32]{{Tokens: []int{1, 2, 3}, Targets: []int{2, 3, 4}, K: 1, Adapter: a}}, testLoss, true)
	})
}

func regexpReplace(s, pat, with string) string {
	return regexp.MustCompile(pat).ReplaceAllString(s, with)
}

// LoraParamsPerRank (the replica plan's LoRA size) counts what an adapter of every target
// holds per unit of rank, the experts' LoRA included (rank r per expert).
func TestLoraParamsPerRank(t *testing.T) {
	for name, cfg := range map[string]Config{"dense": microConfig(false), "qwen3_moe": moeMicro(true)} {
		m, err := NewRandom[float64](cfg, RandomOptions{QKNorm: true, Std: 0.3, Seed: 3})
		require.NoError(t, err)
		a, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: true})
		require.NoError(t, err)
		n := 0
		for _, p := range a.Params {
			n += len(p.W)
		}
		require.Equal(t, n, 3*m.LoraParamsPerRank(), name)
	}
}
