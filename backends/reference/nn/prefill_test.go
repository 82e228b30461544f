package nn

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// prefillWhole prefills g as the code before prefill pieces did, one whole chunk per
// step: the row kernels for a chunk of at most prefillRowsMax tokens, linFwd's products
// for a longer one, and the logits of each headChunk rows of a chunk through Logits.
func prefillWhole[T Float](g *Gen[T]) {
	m := g.m
	for !g.Prefilled() {
		c0, c1 := g.filled, min(g.filled+PrefillChunk, len(g.prompt))
		pos := make([]int, c1-c0)
		caches := make([]*KVCache[T], c1-c0)
		for i := range pos {
			pos[i], caches[i] = c0+i, g.base
		}
		mode := prodFwd
		if c1-c0 <= prefillRowsMax {
			mode = prodRows
		}
		h := m.step(g.prompt[c0:c1], pos, caches, []seg[T]{{0, c1 - c0, g.ad}}, mode, nil)
		D, V := m.Cfg.Hidden, m.Cfg.Vocab
		g.filled = c1
		if g.Scores == nil {
			if c1 == len(g.prompt) {
				g.last = m.Logits(h[(c1-c0-1)*D:], 1, g.ad)
			}
			continue
		}
		for r0 := c0; r0 < c1; r0 += headChunk {
			r1 := min(r0+headChunk, c1)
			lg := m.Logits(h[(r0-c0)*D:(r1-c0)*D], r1-r0, g.ad)
			for r := r0; r < r1; r++ {
				g.scoreRow(r, lg[(r-r0)*V:(r-r0+1)*V])
			}
		}
	}
}

// TestPrefillPiecesAreBitIdentical: prompts (one and several chunks long, of several
// adapters and the base model, scored or not) prefilled in pieces of random sizes, several
// prompts per step, get the logits, prompt scores and cache bits of their whole chunks run
// one per step as before pieces existed, with every kernel, packed weights or not.
func TestPrefillPiecesAreBitIdentical(t *testing.T) {
	cfg := benchDecodeConfig
	cfg.Layers = 1
	lengths := []int{600, 530, 40, 3, 1100, 5, 70, 259, 770}
	for _, kn := range availableKernels {
		for _, packed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/packed=%v", kn.name, packed), func(t *testing.T) {
				withKernel(kn, func() {
					m, err := NewRandom[float32](cfg, RandomOptions{Seed: 7, QKNorm: true})
					require.NoError(t, err)
					if !packed {
						m.packs = nil
					}
					r := rand.New(rand.NewPCG(3, 4))
					ads := testAdapters(t, m, r, 4, 8)
					mk := func() []*Gen[float32] { return testGens(m, lengths, []*Adapter[float32]{nil, ads[0], ads[1]}) }
					whole, pieces := mk(), mk()
					for _, g := range whole {
						prefillWhole(g)
					}
					for steps := 0; ; steps++ {
						var ps []Piece[float32]
						for _, g := range pieces {
							if !g.Prefilled() && r.IntN(3) > 0 {
								n := 1 + r.IntN(12)
								if r.IntN(8) == 0 {
									n = 1 + r.IntN(PrefillChunk)
								}
								ps = append(ps, Piece[float32]{g, n})
							}
						}
						if len(ps) == 0 {
							done := true
							for _, g := range pieces {
								done = done && g.Prefilled()
							}
							if done {
								t.Logf("%d steps", steps)
								break
							}
							continue
						}
						PrefillPieces(ps)
					}
					for i := range whole {
						requireSamePrefill(t, i, whole[i], pieces[i])
					}
				})
			})
		}
	}
}

// requireSamePrefill checks that two generations of prompt i were prefilled to the same
// bits: logits after the prompt, cache, scores.
func requireSamePrefill(t *testing.T, i int, a, b *Gen[float32]) {
	t.Helper()
	require.True(t, b.Prefilled())
	require.Equal(t, bitsOf(a.last), bitsOf(b.last), "prompt %d: last logits", i)
	for l := range a.base.K {
		require.Equal(t, bitsOf(a.base.K[l]), bitsOf(b.base.K[l]), "prompt %d layer %d keys", i, l)
		require.Equal(t, bitsOf(a.base.V[l]), bitsOf(b.base.V[l]), "prompt %d layer %d values", i, l)
	}
	if a.Scores != nil {
		require.Equal(t, fmt.Sprint(a.Scores), fmt.Sprint(b.Scores), "prompt %d: scores", i)
	}
}

// testAdapters makes adapters of m (attention, MLP and unembedding) of the given ranks,
// their B factors random so that every LoRA term counts.
func testAdapters(t *testing.T, m *Model[float32], r *rand.Rand, ranks ...int) []*Adapter[float32] {
	var ads []*Adapter[float32]
	for s, rank := range ranks {
		ad, err := NewAdapter(m, LoraConfig{Rank: rank, Seed: uint64(s + 1), Attn: true, MLP: true, Unembed: true})
		require.NoError(t, err)
		for _, l := range append(ad.Layers, [NumLayerTargets]*Pair[float32]{ad.Head}) {
			for _, p := range l {
				if p != nil {
					for i := range p.B.W {
						p.B.W[i] = float32(r.NormFloat64() * 0.05)
					}
				}
			}
		}
		ads = append(ads, ad)
	}
	return ads
}

// testGens makes a one-token generation of a prompt of each length, prompt i with adapter
// ads[i mod len(ads)] (nil: the base model), scored (log-probs for even i, top 3(i mod 3)).
func testGens(m *Model[float32], lengths []int, ads []*Adapter[float32]) []*Gen[float32] {
	var gens []*Gen[float32]
	for i, n := range lengths {
		p := make([]int, n)
		for k := range p {
			p[k] = (i*31 + k*7) % m.Cfg.Vocab
		}
		gens = append(gens, m.NewGen(p, ads[i%len(ads)], 1, SampleParams{MaxTokens: 1, Temperature: 1}, i%2 == 0, 3*(i%3)))
	}
	return gens
}
