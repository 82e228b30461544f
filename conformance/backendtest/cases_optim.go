package backendtest

import (
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/conformance/oracle"
)

func optimCases() []testCase {
	ce := oracle.Loss{Name: "cross_entropy"}
	return []testCase{
		{"optim/adam/learning_rate", func(h *harness) {
			// one step with Tinker's defaults: bias correction makes it lr·g/(|g|+eps)
			h.adamCase(ce, []oracle.AdamParams{defaultAdam(3e-3)})
		}},
		{"optim/adam/betas", func(h *harness) {
			// β1 and β2 only show from the second step on
			p := oracle.AdamParams{LR: 1e-2, Beta1: 0.5, Beta2: 0.8, Eps: 1e-12}
			h.adamCase(ce, []oracle.AdamParams{p, p})
		}},
		{"optim/adam/default_betas_two_steps", func(h *harness) {
			h.adamCase(ce, []oracle.AdamParams{defaultAdam(1e-2), defaultAdam(5e-3)})
		}},
		{"optim/adam/eps", func(h *harness) {
			// eps comparable to the gradient: the update is lr·g/(|g|+eps), eps outside the root
			p := defaultAdam(1e-2)
			p.Eps = 0.05
			h.adamCase(ce, []oracle.AdamParams{p, p})
		}},
		{"optim/adam/weight_decay", func(h *harness) {
			// decoupled: p ← p·(1 − lr·wd) before the Adam update (not added to the gradient)
			p := defaultAdam(1e-2)
			p.WeightDecay = 0.5
			h.adamCase(ce, []oracle.AdamParams{p, p})
		}},
		{"optim/grad_clip/on", func(h *harness) {
			// a large eps makes the update proportional to the (clipped) gradient
			p := defaultAdam(1e-2)
			p.Eps = 1
			p.GradClipNorm = -0.3 // relative: 0.3 × the gradient's global norm
			h.adamCase(ce, []oracle.AdamParams{p})
		}},
		{"optim/grad_clip/off", func(h *harness) {
			p := defaultAdam(1e-2)
			p.Eps = 1
			h.adamCase(ce, []oracle.AdamParams{p})
		}},
		{"optim/grad_clip/above_norm", func(h *harness) {
			p := defaultAdam(1e-2)
			p.Eps = 1
			p.GradClipNorm = -3 // 3 × the norm: no effect
			h.adamCase(ce, []oracle.AdamParams{p})
		}},
		{"optim/accumulation", func(h *harness) {
			// two forward_backward calls then one optim_step equal one call with both datums
			lc := loraConfig()
			dir, _ := h.warm(lc)
			d1, d2 := h.ceExample(7, nil), h.ceExample(5, []float64{1, 0.5, -1, 2, 1})
			a := h.loadFresh(dir, lc)
			h.fb(a, ce, []example{d1}, false)
			h.fb(a, ce, []example{d2}, false)
			h.step(a, probeAdam)
			b := h.loadFresh(dir, lc)
			h.fb(b, ce, []example{d1, d2}, false)
			h.step(b, probeAdam)
			h.sameWeights("accumulated vs batched", h.save(a, false), h.save(b, false), 1e-6)
		}},
		{"optim/forward_only_does_not_accumulate", func(h *harness) {
			lc := loraConfig()
			dir, ad := h.warm(lc)
			d1, d2 := h.ceExample(7, nil), h.ceExample(5, nil)
			a := h.loadFresh(dir, lc)
			fo := h.fb(a, ce, []example{d2}, true)
			h.checkOutputs(fo, []example{d2}, h.o.Evaluate(ad, ce, oracleData([]example{d2})))
			h.fb(a, ce, []example{d1}, false)
			h.step(a, probeAdam)
			b := h.loadFresh(dir, lc)
			h.fb(b, ce, []example{d1}, false)
			h.step(b, probeAdam)
			h.sameWeights("forward_only then forward_backward vs forward_backward", h.save(a, false), h.save(b, false), 1e-6)
		}},
		{"optim/metrics", func(h *harness) {
			id := h.create(loraConfig())
			h.fb(id, ce, []example{h.ceExample(5, nil)}, false)
			res := h.step(id, defaultAdam(1e-3))
			h.checkMetrics(res.GetMetrics())
		}},
	}
}

// adamCase trains a warm adapter on one cross-entropy batch for len(steps) steps and checks
// every weight after each step against oracle AdamW applied to the backend's gradients
// (read with probe steps and checked against finite differences on one coordinate). A
// negative GradClipNorm means that multiple of the first gradient's global norm.
func (h *harness) adamCase(l oracle.Loss, steps []oracle.AdamParams) {
	lc := loraConfig()
	dir, ad := h.warm(lc)
	data := []example{h.ceExample(8, nil), h.ceExample(6, []float64{1, 2, -0.5, 1, 0.25, 1})}
	id := h.loadFresh(dir, lc)
	want := ad.Vector()
	st := oracle.NewAdamState()
	cur := dir
	var grads []map[string][]float64
	for i, p := range steps {
		g, _ := h.gradient(cur, lc, l, data)
		if i == 0 {
			// the backend's gradient is the one the oracle's finite differences give
			od := oracleData(data)
			ev := h.o.Evaluate(ad, l, od)
			k := oracle.PEFTKey("model.layers.1.mlp.up_proj", "B")
			idx := argmaxAbs(g[k])
			fd := h.o.Coordinate(ad, od, ev, k, idx, 1e-4)
			require.InEpsilon(h.t, fd, g[k][idx], GradientTolerance, "gradient of %s[%d]", k, idx)
		}
		grads = append(grads, g)
		if p.GradClipNorm < 0 {
			p.GradClipNorm *= -oracle.GlobalNorm(g)
			h.t.Logf("step %d: grad_clip_norm %g (gradient norm %g)", i+1, p.GradClipNorm, oracle.GlobalNorm(g))
		}
		oracle.AdamStep(want, g, st, p)
		h.fb(id, l, data, false)
		h.step(id, p)
		cur = h.save(id, false)
		h.checkUpdate("after step "+string(rune('1'+i)), h.oracleAdapter(cur).Vector(), want, p.LR, clearGrad(grads...))
	}
}

func argmaxAbs(v []float64) int {
	best := 0
	for i, x := range v {
		if x*x > v[best]*v[best] {
			best = i
		}
	}
	return best
}

// sameWeights requires two saved adapters to hold the same weights within tol.
func (h *harness) sameWeights(what, a, b string, tol float64) {
	h.t.Helper()
	d := h.maxAbsDiff(h.oracleAdapter(a).Vector(), h.oracleAdapter(b).Vector())
	h.note("same-weights abs ("+what+")", d)
	require.LessOrEqual(h.t, d, tol, "%s: weights differ by up to %g", what, d)
}
