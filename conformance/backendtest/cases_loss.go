package backendtest

import (
	"github.com/loops-dev/loops/conformance/oracle"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// allCases lists every case of the suite, in order.
func allCases() []testCase {
	var out []testCase
	out = append(out, capabilityCases()...)
	out = append(out, forwardCases()...)
	out = append(out, lossCases()...)
	out = append(out, optimCases()...)
	out = append(out, adapterCases()...)
	out = append(out, slotCases()...)
	out = append(out, sampleCases()...)
	out = append(out, errorCases()...)
	return out
}

var (
	ppoRatios = []float64{0.5, 0.7, 0.95, 1.05, 1.3, 1.6}
	ppoAdvs   = []float64{1, -1, 0.5, -2}
)

func lossCases() []testCase {
	rl := func(name string, cfg map[string]float64, ratios, advs []float64) testCase {
		return testCase{name, func(h *harness) {
			h.lossCase(oracle.Loss{Name: name[len("loss/"):indexSlash(name)], Config: cfg}, func(ad *oracle.Adapter) []example {
				return []example{h.rlExample(7, ad, ratios, advs), h.rlExample(5, ad, ratios, advs)}
			})
		}}
	}
	return []testCase{
		{"loss/cross_entropy/unit_weights", func(h *harness) {
			h.lossCase(oracle.Loss{Name: "cross_entropy"}, func(*oracle.Adapter) []example {
				return []example{h.ceExample(8, nil), h.ceExample(5, nil)}
			})
		}},
		{"loss/cross_entropy/real_weights", func(h *harness) {
			// any real weights, negative and zero included (forward_backward_custom relies on it)
			h.lossCase(oracle.Loss{Name: "cross_entropy"}, func(*oracle.Adapter) []example {
				return []example{h.ceExample(8, []float64{1, -0.5, 0, 2.25, 0.3, -1.7, 1, 0.8}), h.ceExample(4, []float64{0, 0, 0.5, 3})}
			})
		}},
		{"loss/cross_entropy/targets_2d", func(h *harness) {
			// (N, K) targets and weights: K weighted targets per position; logprobs (N, K)
			h.lossCase(oracle.Loss{Name: "cross_entropy"}, func(*oracle.Adapter) []example {
				return []example{h.ceExample2D(6, 3), h.ceExample2D(4, 2)}
			})
		}},
		rl("loss/importance_sampling/default", nil, []float64{0.5, 0.9, 1, 1.3, 2}, []float64{1, -0.5, 2, -1.5}),
		rl("loss/ppo/defaults", nil, ppoRatios, ppoAdvs),
		rl("loss/ppo/clip_config", map[string]float64{"clip_low_threshold": 0.6, "clip_high_threshold": 1.4}, ppoRatios, ppoAdvs),
		rl("loss/cispo/defaults", nil, ppoRatios, ppoAdvs),
		rl("loss/cispo/clip_config", map[string]float64{"clip_low_threshold": 0.6, "clip_high_threshold": 1.4}, ppoRatios, ppoAdvs),
		rl("loss/dro/default_beta", nil, []float64{0.3, 0.9, 1, 1.5, 4}, ppoAdvs),
		rl("loss/dro/beta_config", map[string]float64{"beta": 0.5}, []float64{0.3, 0.9, 1, 1.5, 4}, ppoAdvs),
		// gspo: every position carries its datum's sequence ratio (the geometric mean of the
		// marked positions' ratios), clipped as a whole: ppoRatios give s ≈ 1.007 and 1.09,
		// over the default band, so positive advantages are flat there
		gspo("loss/gspo/defaults", nil, ppoRatios, ppoAdvs),
		gspo("loss/gspo/inside_band", map[string]float64{"clip_low_threshold": 0.5, "clip_high_threshold": 2}, ppoRatios, ppoAdvs),
		// s ≈ 0.6, under the band: negative advantages are flat
		gspo("loss/gspo/below_band", map[string]float64{"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, []float64{0.5, 0.7, 0.8, 0.6}, ppoAdvs),
	}
}

// gspo is a gspo case: two datums whose first two positions stand for the prompt (not in
// the sequence ratio, advantage kept), the rest marked by sequence_ratio_mask.
func gspo(name string, cfg map[string]float64, ratios, advs []float64) testCase {
	return testCase{name, func(h *harness) {
		h.lossCase(oracle.Loss{Name: "gspo", Config: cfg}, func(ad *oracle.Adapter) []example {
			return []example{h.gspoExample(7, ad, ratios, advs), h.gspoExample(5, ad, ratios, advs)}
		})
	}}
}

func (h *harness) gspoExample(n int, ad *oracle.Adapter, ratios, advs []float64) example {
	e := h.rlExample(n, ad, ratios, advs)
	mask := make([]float64, n)
	for i := 2; i < n; i++ {
		mask[i] = 1
	}
	e.proto.LossFnInputs["sequence_ratio_mask"] = f32Tensor(mask, int64(n))
	e.or.SequenceRatioMask = mask
	return e
}

func indexSlash(name string) int {
	for i := len("loss/"); i < len(name); i++ {
		if name[i] == '/' {
			return i
		}
	}
	return len(name)
}

// lossCase checks one loss on a trained adapter: the outputs and loss:sum of
// forward_backward against the oracle, then the gradient it accumulated against finite
// differences.
func (h *harness) lossCase(l oracle.Loss, build func(*oracle.Adapter) []example) {
	lc := loraConfig()
	dir, ad := h.warm(lc)
	data := build(ad)
	ev := h.o.Evaluate(ad, l, oracleData(data))
	g, res := h.gradient(dir, lc, l, data)
	h.checkOutputs(res, data, ev)
	h.checkGradient(ad, data, l, g)
}

// ceExample2D is a cross-entropy datum with (N, K) targets (the true next token first,
// then random tokens) and real (N, K) weights.
func (h *harness) ceExample2D(n, k int) example {
	seq := h.tokens(n + 1)
	targets := make([]int, 0, n*k)
	weights := make([]float64, 0, n*k)
	for i := 0; i < n; i++ {
		targets = append(targets, seq[i+1])
		weights = append(weights, 1)
		for _, t := range h.tokens(k - 1) {
			targets = append(targets, t)
			weights = append(weights, h.rng.Float64()*2-0.5)
		}
	}
	weights = f32(weights)
	n64, k64 := int64(n), int64(k)
	return example{
		proto: &loopsv1.Datum{Tokens: toInt32(seq[:n]), LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": i64Tensor(targets, n64, k64), "weights": f32Tensor(weights, n64, k64)}},
		or: &oracle.Datum{Tokens: seq[:n], Targets: targets, K: k, Weights: weights},
	}
}
