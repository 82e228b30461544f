package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// benchDecodeConfig is loops/tiny's shape (backends/tiny.Config, which nn cannot import).
var benchDecodeConfig = Config{
	Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3",
	Vocab: 512, Hidden: 256, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 64, Inter: 768,
	MaxPos: 2048, RopeTheta: 1e6, Eps: 1e-6, Tied: true, HiddenAct: "silu",
}

// BenchmarkDecode times batched decoding on a loops/tiny-shaped model: per iteration, M
// one-sample generations (16 prompt tokens each, prefilled outside the timer) decode 64
// tokens together through Model.Decode. It reports ns per generated token and the
// allocations of the decoding steps.
func BenchmarkDecode(b *testing.B) {
	m, err := NewRandom[float32](benchDecodeConfig, RandomOptions{Seed: 7, QKNorm: true})
	require.NoError(b, err)
	const prompt, steps = 16, 64
	for _, M := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("M=%d", M), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				b.StopTimer()
				seqs := make([]*GenSeq[float32], M)
				for i := range seqs {
					p := make([]int, prompt)
					for k := range p {
						p[k] = (i*7 + k*13) % 512
					}
					seed := uint64(i)
					g := m.NewGen(p, nil, 1, SampleParams{MaxTokens: steps + 1, Temperature: 1, Seed: &seed}, false, 0)
					for !g.Prefilled() {
						g.Prefill()
					}
					seqs[i] = g.Start()
				}
				b.StartTimer()
				for range steps {
					m.Decode(seqs)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*M*steps), "ns/token")
		})
	}
}

// BenchmarkPrefill times prefilling one prompt of P tokens on a loops/tiny-shaped model
// (what every sampling request pays before its first token), in ns per prompt token.
func BenchmarkPrefill(b *testing.B) {
	m, err := NewRandom[float32](benchDecodeConfig, RandomOptions{Seed: 7, QKNorm: true})
	require.NoError(b, err)
	for _, P := range []int{4, 16, 64, 256} {
		b.Run(fmt.Sprintf("P=%d", P), func(b *testing.B) {
			b.ReportAllocs()
			p := make([]int, P)
			for k := range p {
				p[k] = (k * 13) % 512
			}
			seed := uint64(1)
			for range b.N {
				g := m.NewGen(p, nil, 1, SampleParams{MaxTokens: 1, Temperature: 1, Seed: &seed}, false, 0)
				for !g.Prefilled() {
					g.Prefill()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*P), "ns/token")
		})
	}
}

// TestPrefillTogetherIsBitIdentical: prompts of several adapters (and the base model)
// prefilled together (PrefillPieces of whole chunks: those of at most prefillRowsMax tokens
// in one step, the longer one in another) give each the logits, prompt scores and KV cache
// bits it gets from Prefill alone.
func TestPrefillTogetherIsBitIdentical(t *testing.T) {
	cfg := benchDecodeConfig
	cfg.Layers = 2
	m, err := NewRandom[float32](cfg, RandomOptions{Seed: 7, QKNorm: true})
	require.NoError(t, err)
	ads := testAdapters(t, m, rand.New(rand.NewPCG(1, 2)), 4, 4)
	lengths := []int{5, 16, 64, 3, 100, 40}
	mk := func() []*Gen[float32] { return testGens(m, lengths, []*Adapter[float32]{ads[0], nil, ads[1]}) }
	alone, together := mk(), mk()
	for _, g := range alone {
		for !g.Prefilled() {
			g.Prefill()
		}
	}
	total := 0
	for _, n := range lengths {
		total += n
	}
	var pieces []Piece[float32]
	for _, g := range together {
		pieces = append(pieces, Piece[float32]{g, g.NextChunk()})
	}
	require.Equal(t, total, PrefillPieces(pieces))
	for i := range alone {
		requireSamePrefill(t, i, alone[i], together[i])
	}
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}
