package nn

import "testing"

// BenchmarkAdamStep times one AdamW step over 9.4M float32 adapter weights (a rank-32
// adapter of the Qwen3-0.6B shape is ~10M), the optimizer's whole cost per optim_step.
func BenchmarkAdamStep(b *testing.B) {
	a := &Adapter[float32]{}
	for i := range 36 {
		n := 1024 * 256
		q := &Param[float32]{Shape: [2]int{256, 1024}, W: make([]float32, n), G: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
		for j := range q.W {
			q.W[j] = float32((i+j)%97) * 1e-3
		}
		a.Params = append(a.Params, q)
	}
	p := AdamParams{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.01, GradClipNorm: 1}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for i, q := range a.Params {
			for j := range q.G {
				q.G[j] = float32((i*7+j)%31-15) * 1e-4
			}
		}
		b.StartTimer()
		a.AdamStep(p)
	}
}
