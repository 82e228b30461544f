package oracle

import (
	"math"
	"sort"
)

// AdamParams are Tinker's AdamW parameters. GradClipNorm 0 turns clipping off.
type AdamParams struct {
	LR, Beta1, Beta2, Eps, WeightDecay, GradClipNorm float64
}

// AdamState is AdamW's per-parameter state.
type AdamState struct {
	Step int
	M, V map[string][]float64
}

// NewAdamState returns a fresh (step 0) state.
func NewAdamState() *AdamState {
	return &AdamState{M: map[string][]float64{}, V: map[string][]float64{}}
}

// GlobalNorm is the L2 norm of every gradient together.
func GlobalNorm(g map[string][]float64) float64 {
	keys := make([]string, 0, len(g))
	for k := range g {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := 0.0
	for _, k := range keys {
		for _, v := range g[k] {
			s += v * v
		}
	}
	return math.Sqrt(s)
}

// AdamStep applies one AdamW step to params in place, as torch does:
// clip_grad_norm_ (g ·= min(1, clip/(‖g‖+1e-6)) when GradClipNorm > 0), then
// p ← p·(1 − lr·wd), then m ← β1·m + (1−β1)·g, v ← β2·v + (1−β2)·g²,
// p ← p − lr·(m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + eps). It returns the gradient norm before
// clipping.
func AdamStep(params, grads map[string][]float64, st *AdamState, p AdamParams) float64 {
	norm := GlobalNorm(grads)
	coef := 1.0
	if p.GradClipNorm > 0 {
		coef = math.Min(1, p.GradClipNorm/(norm+1e-6))
	}
	st.Step++
	bc1 := 1 - math.Pow(p.Beta1, float64(st.Step))
	bc2 := 1 - math.Pow(p.Beta2, float64(st.Step))
	for k, w := range params {
		g := grads[k]
		if g == nil {
			continue
		}
		m, v := st.M[k], st.V[k]
		if m == nil {
			m, v = make([]float64, len(w)), make([]float64, len(w))
			st.M[k], st.V[k] = m, v
		}
		for i := range w {
			gi := g[i] * coef
			w[i] *= 1 - p.LR*p.WeightDecay
			m[i] = p.Beta1*m[i] + (1-p.Beta1)*gi
			v[i] = p.Beta2*v[i] + (1-p.Beta2)*gi*gi
			w[i] -= p.LR * (m[i] / bc1) / (math.Sqrt(v[i]/bc2) + p.Eps)
		}
	}
	return norm
}
