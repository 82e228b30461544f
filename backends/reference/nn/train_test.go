package nn

import (
	"math"
	"math/rand/v2"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func microConfig(tied bool) Config {
	return Config{Vocab: 40, Hidden: 16, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Inter: 24,
		MaxPos: 64, RopeTheta: 10000, Eps: 1e-6, Tied: tied}
}

func randomizeAdapter[T Float](a *Adapter[T], seed uint64, std float64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for _, p := range a.Params {
		for i := range p.W {
			p.W[i] = T(r.NormFloat64() * std)
		}
	}
}

func randSeq(r *rand.Rand, n, vocab, k int) ([]int, []int) {
	toks := make([]int, n)
	tg := make([]int, n*k)
	for i := range toks {
		toks[i] = r.IntN(vocab)
	}
	for i := range tg {
		tg[i] = r.IntN(vocab)
	}
	return toks, tg
}

// A nonlinear per-token loss so that dlp varies by token.
func testLoss(s, pos, k int, lp float64) (float64, float64) {
	w := 0.5 + 0.1*float64((s*7+pos*3+k)%5) - 0.2
	return -w*lp + 0.05*lp*lp, -w + 0.1*lp
}

func totalLoss(outs []Output) float64 {
	var s float64
	for _, o := range outs {
		for _, l := range o.Loss {
			s += l
		}
	}
	return s
}

func TestGradientsFiniteDifference(t *testing.T) {
	for _, tc := range []struct {
		name           string
		tied, qk, bias bool
	}{{"qwen3-tied", true, true, false}, {"qwen2-untied-bias", false, false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewRandom[float64](microConfig(tc.tied), RandomOptions{QKNorm: tc.qk, AttnBias: tc.bias, Std: 0.3, Seed: 7})
			require.NoError(t, err)
			ad1, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: true})
			require.NoError(t, err)
			ad2, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 2, Attn: true, MLP: false, Unembed: false})
			require.NoError(t, err)
			randomizeAdapter(ad1, 3, 0.2)
			randomizeAdapter(ad2, 4, 0.2)
			r := rand.New(rand.NewPCG(9, 9))
			var seqs []Seq[float64]
			for i, n := range []int{5, 7, 4} {
				ad := ad1
				if i == 1 {
					ad = ad2
				}
				k := 1
				if i == 2 {
					k = 2
				}
				toks, tg := randSeq(r, n, m.Cfg.Vocab, k)
				seqs = append(seqs, Seq[float64]{Tokens: toks, Targets: tg, K: k, Adapter: ad})
			}
			m.ForwardBackward(seqs, testLoss, true)
			const h = 1e-6
			worst := 0.0
			checked := 0
			for _, ad := range []*Adapter[float64]{ad1, ad2} {
				for _, p := range ad.Params {
					for trial := 0; trial < 2; trial++ {
						i := r.IntN(len(p.W))
						w0 := p.W[i]
						p.W[i] = w0 + h
						lp := totalLoss(m.ForwardBackward(seqs, testLoss, false))
						p.W[i] = w0 - h
						lm := totalLoss(m.ForwardBackward(seqs, testLoss, false))
						p.W[i] = w0
						fd := (lp - lm) / (2 * h)
						an := p.G[i]
						rel := math.Abs(fd-an) / math.Max(math.Abs(fd)+math.Abs(an), 1e-7)
						if math.Abs(fd-an) < 1e-9 {
							rel = 0
						}
						worst = max(worst, rel)
						checked++
						require.Lessf(t, rel, 1e-5, "%s[%d]: analytic %g, finite difference %g", p.Name, i, an, fd)
					}
				}
			}
			t.Logf("checked %d gradient entries, worst relative error %.2e", checked, worst)
		})
	}
}

// Rows of several adapters in one pass give the same results as separate passes.
func TestMultiAdapterBatchEqualsSeparate(t *testing.T) {
	m, err := NewRandom[float64](microConfig(true), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	mk := func(seed uint64) *Adapter[float64] {
		a, err := NewAdapter(m, LoraConfig{Rank: 4, Seed: seed, Attn: true, MLP: true, Unembed: true})
		require.NoError(t, err)
		randomizeAdapter(a, seed, 0.1)
		return a
	}
	a1, a2 := mk(1), mk(2)
	b1, b2 := a1.Clone(), a2.Clone()
	r := rand.New(rand.NewPCG(1, 2))
	loss := func(_, pos, k int, lp float64) (float64, float64) { return testLoss(0, pos, k, lp) }
	t1, g1 := randSeq(r, 6, 40, 1)
	t2, g2 := randSeq(r, 9, 40, 1)
	joint := m.ForwardBackward([]Seq[float64]{{Tokens: t1, Targets: g1, K: 1, Adapter: a1}, {Tokens: t2, Targets: g2, K: 1, Adapter: a2}}, loss, true)
	s1 := m.ForwardBackward([]Seq[float64]{{Tokens: t1, Targets: g1, K: 1, Adapter: b1}}, loss, true)
	s2 := m.ForwardBackward([]Seq[float64]{{Tokens: t2, Targets: g2, K: 1, Adapter: b2}}, loss, true)
	require.InDeltaSlice(t, s1[0].LogProbs, joint[0].LogProbs, 1e-12)
	require.InDeltaSlice(t, s2[0].LogProbs, joint[1].LogProbs, 1e-12)
	for i := range a1.Params {
		require.InDeltaSlice(t, b1.Params[i].G, a1.Params[i].G, 1e-12)
		require.InDeltaSlice(t, b2.Params[i].G, a2.Params[i].G, 1e-12)
	}
}

// float32 and float64 agree on the same weights.
func TestFloat32MatchesFloat64(t *testing.T) {
	cfg := microConfig(false)
	cfg.Hidden, cfg.Inter, cfg.Vocab = 64, 96, 300
	m64, err := NewRandom[float64](cfg, RandomOptions{QKNorm: true, Std: 0.1, Seed: 3})
	require.NoError(t, err)
	m32 := Convert[float32](m64)
	r := rand.New(rand.NewPCG(5, 5))
	toks, tg := randSeq(r, 40, cfg.Vocab, 1)
	o64 := m64.ForwardBackward([]Seq[float64]{{Tokens: toks, Targets: tg, K: 1}}, testLoss, false)
	o32 := m32.ForwardBackward([]Seq[float32]{{Tokens: toks, Targets: tg, K: 1}}, testLoss, false)
	worst := 0.0
	for i := range o64[0].LogProbs {
		worst = max(worst, math.Abs(o64[0].LogProbs[i]-o32[0].LogProbs[i]))
	}
	t.Logf("max |logprob f32 - f64| = %.2e", worst)
	require.Less(t, worst, 1e-4)
}

// TestTrainingStepAllocatesOnlyItsOutputs: a training step (and a forward-only pass) of a
// shape seen before takes every work array, list, layout and parallel task from its arena
// and pools; what it allocates is its result (the list of outputs, each sequence's
// log-probs and losses). The step covers two adapters, two targets per position, head
// chunks (more rows than headChunk) and the register-blocked attention backward (head
// size 32); the forward-only pass gives the step's log-probs with one layer's arrays.
func TestTrainingStepAllocatesOnlyItsOutputs(t *testing.T) {
	defer SetThreads(Threads())
	SetThreads(1)                                    // no worker goroutine is started, so the count is exact
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // a collection would empty the pools
	cfg := Config{Vocab: 97, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, Inter: 96,
		MaxPos: 256, RopeTheta: 10000, Eps: 1e-6, Tied: true}
	m, err := NewRandom[float32](cfg, RandomOptions{QKNorm: true, Std: 0.1, Seed: 3})
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(5, 1))
	var seqs []Seq[float32]
	for s := range 3 {
		ad, err := NewAdapter(m, LoraConfig{Rank: 4, Seed: uint64(s), Attn: true, MLP: true, Unembed: true})
		require.NoError(t, err)
		randomizeAdapter(ad, uint64(s), 0.05)
		tk, tg := randSeq(r, 100, cfg.Vocab, 2)
		seqs = append(seqs, Seq[float32]{Tokens: tk, Targets: tg, K: 2, Adapter: ad})
	}
	seqs[2].Adapter = seqs[1].Adapter // two segments, one of two sequences
	step := m.ForwardBackward(seqs, testLoss, true)
	allocs := testing.AllocsPerRun(3, func() { m.ForwardBackward(seqs, testLoss, true) })
	require.LessOrEqual(t, allocs, float64(1+2*len(seqs)), "training step")
	fwd := m.ForwardBackward(seqs, testLoss, false)
	require.Equal(t, step, fwd, "the forward-only pass gives the training step's log-probs and losses")
	allocs = testing.AllocsPerRun(3, func() { m.ForwardBackward(seqs, testLoss, false) })
	require.LessOrEqual(t, allocs, float64(1+2*len(seqs)), "forward-only pass")
}

// TestCheckpointedPassIsBitIdentical: a training pass that recomputes each layer in the
// backward pass (CheckpointRows) gives the same bits as one that keeps every layer's
// activations: log-probs, losses and every LoRA gradient, for two adapters (one with the
// unembedding LoRA of a tied model, which also adapts the embedding lookup), two targets
// per position, rows over several head chunks, Qwen3's q/k norms and Gemma 3's post-norms
// and sliding window.
func TestCheckpointedPassIsBitIdentical(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		opts RandomOptions
	}{
		{"qwen3-tied", microConfig(true), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7}},
		{"qwen2-bias", microConfig(false), RandomOptions{AttnBias: true, Std: 0.3, Seed: 8}},
		{"gemma3", gemmaMicro(), RandomOptions{Std: 0.3, Seed: 9}},
		{"qwen3_moe", moeMicro(true), RandomOptions{QKNorm: true, Std: 0.3, Seed: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewRandom[float64](tc.cfg, tc.opts)
			require.NoError(t, err)
			if tc.cfg.ModelType == gemma3Type {
				require.NotNil(t, m.Layers[0].PostAttnNorm, "the Gemma 3 layers have post-norms")
			}
			a1, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: true})
			require.NoError(t, err)
			a2, err := NewAdapter(m, LoraConfig{Rank: 2, Seed: 2, Attn: true, MLP: true})
			require.NoError(t, err)
			randomizeAdapter(a1, 3, 0.2)
			randomizeAdapter(a2, 4, 0.2)
			r := rand.New(rand.NewPCG(4, 4))
			var seqs []Seq[float64]
			for i, n := range []int{60, 64, 50, 63, 40, 47} { // 324 rows: two head chunks
				ad, k := a1, 1
				if i%3 == 1 {
					ad, k = a2, 2
				}
				toks, tg := randSeq(r, n, m.Cfg.Vocab, k)
				seqs = append(seqs, Seq[float64]{Tokens: toks, Targets: tg, K: k, Adapter: ad})
			}
			run := func(rows int) ([]Output, *Adapter[float64], *Adapter[float64]) {
				b1, b2 := a1.Clone(), a2.Clone()
				ss := append([]Seq[float64](nil), seqs...)
				for i := range ss {
					ss[i].Adapter = map[*Adapter[float64]]*Adapter[float64]{a1: b1, a2: b2}[ss[i].Adapter]
				}
				m.CheckpointRows = rows
				defer func() { m.CheckpointRows = 0 }()
				return m.ForwardBackward(ss, testLoss, true), b1, b2
			}
			o1, k1, k2 := run(-1)
			o2, c1, c2 := run(100)
			require.Equal(t, o1, o2, "log-probs and losses")
			for i := range k1.Params {
				require.NotZero(t, k1.Params[i].G[0]+k1.Params[i].G[len(k1.Params[i].G)-1], k1.Params[i].Name)
				require.Equal(t, k1.Params[i].G, c1.Params[i].G, k1.Params[i].Name)
			}
			for i := range k2.Params {
				require.Equal(t, k2.Params[i].G, c2.Params[i].G, k2.Params[i].Name)
			}
		})
	}
}
