package nn

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
)

// sharedMatrixModel is m with its tied matrix replaced by W + Scale·B·A of a's head LoRA
// (the embedding and the head both), computed here row by row in float64: the model the
// shared-matrix rule means. Its other weights are m's.
func sharedMatrixModel(m *Model[float64], a *Adapter[float64]) *Model[float64] {
	out := *m
	out.packs = new(weightPacks)
	p := a.Head
	W := make([]float64, len(m.Embed))
	for o := range p.Out {
		for i := range p.In {
			var d float64
			for k := range p.Rank {
				d += p.B.W[o*p.Rank+k] * p.A.W[k*p.In+i]
			}
			W[o*p.In+i] = m.Embed[o*p.In+i] + float64(a.Scale)*d
		}
	}
	out.Embed = W
	out.Head = Linear[float64]{W: W, Out: m.Head.Out, In: m.Head.In}
	return &out
}

// TestTiedUnembedAdaptsSharedMatrix: on a model with tied embeddings a new adapter's
// unembedding LoRA adapts the shared matrix. Training log-probs and cached decoding equal
// the model whose one matrix is W+ΔW with only the layer LoRAs applied, and the head LoRA's
// gradients are the sum of the head's and the embedding lookup's (the finite-difference
// test checks them against the loss; here the embedding part is checked to be there: a
// head-only adapter's gradients differ).
func TestTiedUnembedAdaptsSharedMatrix(t *testing.T) {
	m, err := NewRandom[float64](microConfig(true), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	a, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	require.True(t, a.TiedEmbed)
	randomizeAdapter(a, 3, 0.2)
	layersOnly := a.Clone()
	layersOnly.Head, layersOnly.TiedEmbed = nil, false
	ref := sharedMatrixModel(m, a)

	r := rand.New(rand.NewPCG(4, 4))
	toks, tg := randSeq(r, 9, m.Cfg.Vocab, 1)
	got := m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: a}}, testLoss, true)
	want := ref.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: layersOnly}}, testLoss, false)
	require.InDeltaSlice(t, want[0].LogProbs, got[0].LogProbs, 1e-12)

	pos := make([]int, len(toks))
	caches := make([]*KVCache[float64], len(toks))
	c1, c2 := m.NewCache(), ref.NewCache()
	for i := range pos {
		pos[i], caches[i] = i, c1
	}
	lg := m.Logits(m.Step(toks, pos, caches, a), len(toks), a)
	for i := range caches {
		caches[i] = c2
	}
	lgRef := ref.Logits(ref.Step(toks, pos, caches, layersOnly), len(toks), layersOnly)
	require.InDeltaSlice(t, lgRef, lg, 1e-12)

	headOnly := a.Clone()
	headOnly.TiedEmbed = false
	headOnly.ZeroGrad()
	m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: headOnly}}, testLoss, true)
	require.NotEqual(t, headOnly.Head.A.G, a.Head.A.G, "the embedding lookup adds to the head LoRA's gradient")
}

// TestTiedUnembedCheckpointMarker: a new tied adapter's adapter_config.json carries PEFT's
// ensure_weight_tying and loads with the shared-matrix rule; the same files without the
// marker (a checkpoint written before the rule) load with the head-only rule they were
// trained with, give its log-probs (those of a model whose head alone is W+ΔW) and save
// without the marker again. On an untied model the marker is never written.
func TestTiedUnembedCheckpointMarker(t *testing.T) {
	m, err := NewRandom[float64](microConfig(true), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	a, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 1, Attn: true, Unembed: true})
	require.NoError(t, err)
	randomizeAdapter(a, 5, 0.2)
	dir := t.TempDir()
	_, err = SaveAdapter(dir, a, "micro", true)
	require.NoError(t, err)
	pc, err := peft.ReadConfig(dir)
	require.NoError(t, err)
	require.True(t, pc.EnsureWeightTying)
	b, err := LoadAdapter(dir, m, true, 8)
	require.NoError(t, err)
	require.True(t, b.TiedEmbed)

	// the old format: the same folder without the marker
	raw, err := os.ReadFile(filepath.Join(dir, peft.AdapterConfigFile))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	delete(cfg, "ensure_weight_tying")
	raw, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), raw, 0o644))
	old, err := LoadAdapter(dir, m, true, 8)
	require.NoError(t, err)
	require.False(t, old.TiedEmbed, "a checkpoint without the marker keeps the head-only rule")
	untied := Merged(m, old) // head-only: a head of its own, the embedding unchanged
	require.False(t, untied.Cfg.Tied)
	require.Equal(t, m.Embed, untied.Embed)
	toks, tg := randSeq(rand.New(rand.NewPCG(2, 2)), 7, m.Cfg.Vocab, 1)
	got := m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: old}}, testLoss, false)
	want := untied.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1}}, testLoss, false)
	require.InDeltaSlice(t, want[0].LogProbs, got[0].LogProbs, 1e-12)
	shared := m.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: b}}, testLoss, false)
	require.NotEqual(t, shared[0].LogProbs, got[0].LogProbs)
	resaved := t.TempDir()
	_, err = SaveAdapter(resaved, old, "micro", true)
	require.NoError(t, err)
	pc, err = peft.ReadConfig(resaved)
	require.NoError(t, err)
	require.False(t, pc.EnsureWeightTying, "a resumed old checkpoint is saved in its own rule")

	mu, err := NewRandom[float64](microConfig(false), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	au, err := NewAdapter(mu, LoraConfig{Rank: 2, Seed: 1, Unembed: true})
	require.NoError(t, err)
	require.False(t, au.TiedEmbed)
	_, err = SaveAdapter(t.TempDir(), au, "micro", false)
	require.NoError(t, err)
}
