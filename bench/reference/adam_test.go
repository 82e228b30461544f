package reference

import (
	"testing"

	"github.com/loops-dev/loops/backends/reference/nn"
)

// BenchmarkAdamStep is one optimizer step over a rank-16 LoRA of a Qwen3-0.6B-shaped model
// on attention and MLP (28 layers × 7 projections, ~9.6M float32 weights): the part of
// optim_step that the update norm (issue 13) adds to. Compare with a baseline tree side by
// side (README, "AdamStep and the update norm").
func BenchmarkAdamStep(b *testing.B) {
	a := &nn.Adapter[float32]{}
	const n = 16 * 3072
	for range 28 * 7 {
		p := &nn.Param[float32]{W: make([]float32, n), G: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
		for j := range p.W {
			p.W[j] = float32(j%97) * 1e-3
		}
		a.Params = append(a.Params, p)
	}
	b.SetBytes(28 * 7 * n * 4)
	for b.Loop() {
		for _, p := range a.Params {
			for j := range p.G {
				p.G[j] = 1e-3
			}
		}
		a.AdamStep(nn.AdamParams{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12})
	}
}
