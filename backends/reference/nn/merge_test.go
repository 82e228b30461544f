package nn

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMerged: the merged model's logits equal the base model's with the adapter applied,
// for tied and untied heads, with and without an adapted head, and for a tied head adapted
// by the shared-matrix rule (merged into the one matrix, still tied) or the head-only rule
// of older checkpoints (the head is untied); the base is unchanged.
func TestMerged(t *testing.T) {
	for _, tied := range []bool{true, false} {
		for _, unembed := range []bool{true, false} {
			for _, headOnly := range []bool{false, true} {
				m, err := NewRandom[float64](microConfig(tied), RandomOptions{QKNorm: true, AttnBias: true, Std: 0.3, Seed: 7})
				require.NoError(t, err)
				a, err := NewAdapter(m, LoraConfig{Rank: 3, Seed: 1, Attn: true, MLP: true, Unembed: unembed})
				require.NoError(t, err)
				require.Equal(t, tied && unembed, a.TiedEmbed)
				if headOnly {
					a.TiedEmbed = false
				}
				for i, p := range a.Params { // B is zero at creation: give it values
					for j := range p.W {
						p.W[j] = 0.05 * math.Sin(float64(i*131+j))
					}
				}
				embed0 := append([]float64(nil), m.Embed...)
				q0 := append([]float64(nil), m.Layers[0].Lin[TQ].W...)

				merged := Merged(m, a)
				require.Equal(t, tied && !(unembed && headOnly), merged.Cfg.Tied)
				toks := []int{1, 5, 9, 3, 7}
				pos := []int{0, 1, 2, 3, 4}
				caches := make([]*KVCache[float64], len(toks))
				c1, c2 := m.NewCache(), merged.NewCache()
				for i := range caches {
					caches[i] = c1
				}
				want := m.Logits(m.Step(toks, pos, caches, a), len(toks), a)
				for i := range caches {
					caches[i] = c2
				}
				got := merged.Logits(merged.Step(toks, pos, caches, nil), len(toks), nil)
				require.InDeltaSlice(t, want, got, 1e-9)

				require.Equal(t, embed0, m.Embed, "the base embedding is unchanged")
				require.Equal(t, q0, m.Layers[0].Lin[TQ].W, "the base weights are unchanged")
				require.Equal(t, tied, m.Cfg.Tied)
				bytes := int64(0)
				for _, ts := range merged.Tensors() {
					bytes += 4 * int64(len(ts.Data))
				}
				require.Equal(t, bytes, MergedBytes(m, a))
			}
		}
	}
}
