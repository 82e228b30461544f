package reference

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
)

func qwen3Small() nn.Config {
	return nn.Config{Architectures: []string{"Qwen3ForCausalLM"}, Vocab: 151936, Hidden: 1024, Layers: 28, Heads: 16,
		KVHeads: 8, HeadDim: 128, Inter: 3072, MaxPos: 4096, RopeTheta: 1e6, Eps: 1e-6, Tied: true}
}

func models(b *testing.B) map[string]nn.Config {
	m := map[string]nn.Config{"tiny": tiny.Config()}
	if os.Getenv("LOOPS_BENCH_LARGE") == "1" {
		m["qwen3-0.6b-shape"] = qwen3Small()
	}
	return m
}

var cache = map[string]*nn.Model[float32]{}

func load(b *testing.B, name string, cfg nn.Config) *nn.Model[float32] {
	if m, ok := cache[name]; ok {
		return m
	}
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.02, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	cache[name] = m
	return m
}

func ceLoss(_, _, _ int, lp float64) (float64, float64) { return -lp, -1 }

// BenchmarkForwardBackward measures training throughput: 4 sequences of 128 tokens (tiny)
// or 2 of 128 (large), rank-16 LoRA on every target.
func BenchmarkForwardBackward(b *testing.B) {
	for name, cfg := range models(b) {
		b.Run(name, func(b *testing.B) {
			m := load(b, name, cfg)
			ad, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 16, Seed: 1, Attn: true, MLP: true, Unembed: true})
			if err != nil {
				b.Fatal(err)
			}
			nseq, n := 4, 128
			if name != "tiny" {
				nseq = 2
			}
			r := rand.New(rand.NewPCG(1, 1))
			var seqs []nn.Seq[float32]
			tokens := 0
			for s := 0; s < nseq; s++ {
				tk, tg := make([]int, n), make([]int, n)
				for i := range tk {
					tk[i], tg[i] = r.IntN(cfg.Vocab), r.IntN(cfg.Vocab)
				}
				seqs = append(seqs, nn.Seq[float32]{Tokens: tk, Targets: tg, K: 1, Adapter: ad})
				tokens += n
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m.ForwardBackward(seqs, ceLoss, true)
			}
			b.ReportMetric(float64(tokens*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkSample measures generation throughput: a 32-token prompt, 4 samples of 64
// tokens (tiny) or 2 of 16 (large), temperature 1, with a rank-16 adapter.
func BenchmarkSample(b *testing.B) {
	for name, cfg := range models(b) {
		b.Run(name, func(b *testing.B) {
			m := load(b, name, cfg)
			ad, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 16, Seed: 1, Attn: true, MLP: true, Unembed: true})
			if err != nil {
				b.Fatal(err)
			}
			ns, mt := 4, 64
			if name != "tiny" {
				ns, mt = 2, 16
			}
			prompt := make([]int, 32)
			for i := range prompt {
				prompt[i] = i + 1
			}
			seed := uint64(1)
			b.ReportAllocs()
			b.ResetTimer()
			gen := 0
			for i := 0; i < b.N; i++ {
				out, _ := m.Sample(prompt, ad, ns, nn.SampleParams{MaxTokens: mt, Temperature: 1, TopP: 1, Seed: &seed}, false, 0)
				for _, s := range out {
					gen += len(s.Tokens)
				}
			}
			b.ReportMetric(float64(gen)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkKernels measures the three float32 matrix products on the shapes of a
// Qwen3-0.6B-sized layer with 512 rows (4×128 tokens): forward (A·Bᵀ), input gradient
// (A·B), LoRA weight gradient (Aᵀ·B), the lm_head chunk (32 rows × 151936) and decoding (4 rows).
func BenchmarkKernels(b *testing.B) {
	type shape struct {
		name    string
		op      string
		M, N, K int
	}
	for _, sh := range []shape{
		{"MatMulT/512x1024x1024", "nt", 512, 1024, 1024},
		{"MatMulT/512x3072x1024", "nt", 512, 3072, 1024},
		{"MatMulT/32x151936x1024", "nt", 32, 151936, 1024},
		{"MatMulT/4x3072x1024", "nt", 4, 3072, 1024},
		{"MatMulT/512x16x1024", "nt", 512, 16, 1024},
		{"MatMul/512x1024x3072", "nn", 512, 1024, 3072},
		{"MatMul/32x1024x151936", "nn", 32, 1024, 151936},
		{"MatMul/256x1024x151936", "nn", 256, 1024, 151936}, // lm_head dX, one head chunk
		{"MatMul/512x1024x2048", "nn", 512, 1024, 2048},     // o_proj dX
		{"MatMulTN/16x1024x512", "tn", 16, 1024, 512},
	} {
		b.Run(sh.name, func(b *testing.B) {
			M, N, K := sh.M, sh.N, sh.K
			A, B, C := make([]float32, M*K), make([]float32, N*K), make([]float32, M*N)
			for i := range A {
				A[i] = float32(i%7) * 0.1
			}
			for i := range B {
				B[i] = float32(i%5) * 0.1
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				switch sh.op {
				case "nt":
					nn.MatMulT(C, A, B, M, N, K, false)
				case "nn":
					nn.MatMul(C, A, B, M, N, K, false)
				case "tn":
					nn.MatMulTN(C, A, B, M, N, K)
				}
			}
			b.ReportMetric(2*float64(M*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkMatMulT measures the core kernel on a 256×1024·(1024×1024)ᵀ product.
func BenchmarkMatMulT(b *testing.B) {
	M, N, K := 256, 1024, 1024
	A, B, C := make([]float32, M*K), make([]float32, N*K), make([]float32, M*N)
	for i := range A {
		A[i] = float32(i%7) * 0.1
	}
	for i := range B {
		B[i] = float32(i%5) * 0.1
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		nn.MatMulT(C, A, B, M, N, K, false)
	}
	b.ReportMetric(2*float64(M*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
