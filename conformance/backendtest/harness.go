package backendtest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/conformance/oracle"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// harness is what a case works with: the backend, the oracle and helpers.
type harness struct {
	t     *ct
	ctx   context.Context
	b     backends.Backend
	tr    backends.Trainer
	sp    backends.Sampler
	o     *oracle.Model
	dec   *oracle.Decoder
	opts  Options
	st    *stats
	name  string
	rng   *rand.Rand
	ids   []string
	tmp   string
	nDirs int
}

func newHarness(c *ct, b backends.Backend, o *oracle.Model, dec *oracle.Decoder, opts Options, st *stats, name string) *harness {
	seed := uint64(0)
	for _, r := range name {
		seed = seed*131 + uint64(r)
	}
	return &harness{t: c, ctx: c.Context(), b: b, tr: b.Trainer(), sp: b.Sampler(), o: o, dec: dec,
		opts: opts, st: st, name: name, rng: rand.New(rand.NewPCG(seed, 0x100b5)), tmp: c.TempDir()}
}

// cleanup deletes the case's adapters.
func (h *harness) cleanup() {
	for _, id := range h.ids {
		_, _ = h.tr.DeleteAdapter(context.Background(), &backendv1.DeleteAdapterRequest{AdapterId: id})
	}
}

// note records a measured error (for the run's summary) and logs it.
func (h *harness) note(what string, v float64) {
	h.t.Helper()
	h.st.note(what, h.name, v)
	h.t.Logf("max %s = %.3g", what, v)
}

// loraConfig is the default adapter of the cases: every target, rank 4.
func loraConfig() *loopsv1.LoraConfig {
	return &loopsv1.LoraConfig{Rank: 4, Seed: 7, TrainAttn: true, TrainMlp: true, TrainUnembed: true}
}

// dir returns a fresh folder path (not created) under the case's temp dir.
func (h *harness) dir(label string) string {
	h.nDirs++
	return filepath.Join(h.tmp, fmt.Sprintf("%02d-%s", h.nDirs, label))
}

// create makes an adapter and returns its id.
func (h *harness) create(lc *loopsv1.LoraConfig) string {
	h.t.Helper()
	id := fmt.Sprintf("bt-%s-%d", strings.ReplaceAll(h.name, "/", "-"), len(h.ids))
	_, err := h.tr.CreateAdapter(h.ctx, &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: h.opts.ModelName, Lora: lc})
	require.NoError(h.t, err, "CreateAdapter")
	h.ids = append(h.ids, id)
	return id
}

// loadFresh creates an adapter and loads weights from dir (without optimizer state).
func (h *harness) loadFresh(dir string, lc *loopsv1.LoraConfig) string {
	h.t.Helper()
	id := h.create(lc)
	_, err := h.tr.LoadAdapter(h.ctx, &backendv1.LoadAdapterRequest{AdapterId: id, Dir: dir})
	require.NoError(h.t, err, "LoadAdapter")
	return id
}

// save writes an adapter to a fresh folder and returns the folder.
func (h *harness) save(id string, withOptimizer bool) string {
	h.t.Helper()
	d := h.dir("adapter")
	_, err := h.tr.SaveAdapter(h.ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: d, IncludeOptimizer: withOptimizer})
	require.NoError(h.t, err, "SaveAdapter")
	return d
}

// oracleAdapter reads a saved adapter folder into the oracle.
func (h *harness) oracleAdapter(dir string) *oracle.Adapter {
	h.t.Helper()
	ad, err := oracle.LoadAdapter(dir)
	require.NoError(h.t, err, "the oracle cannot read the adapter folder the backend saved")
	return ad
}

// fb runs one ForwardBackward item and requires it to succeed.
func (h *harness) fb(id string, l oracle.Loss, data []example, forwardOnly bool) *loopsv1.ForwardBackwardResult {
	h.t.Helper()
	resp, err := h.tr.ForwardBackward(h.ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
		item(id, l, data, forwardOnly)}})
	require.NoError(h.t, err, "ForwardBackward")
	require.Len(h.t, resp.GetResults(), 1)
	r := resp.GetResults()[0]
	require.Nil(h.t, r.GetError(), "ForwardBackward item failed: %v", r.GetError())
	require.NotNil(h.t, r.GetResult())
	return r.GetResult()
}

func item(id string, l oracle.Loss, data []example, forwardOnly bool) *backendv1.ForwardBackwardItem {
	it := &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: l.Name, LossFnConfig: l.Config, ForwardOnly: forwardOnly}
	for _, d := range data {
		it.Data = append(it.Data, d.proto)
	}
	return it
}

// step runs OptimStep and requires it to succeed.
func (h *harness) step(id string, p oracle.AdamParams) *loopsv1.OptimStepResult {
	h.t.Helper()
	resp, err := h.tr.OptimStep(h.ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: adam(p)})
	require.NoError(h.t, err, "OptimStep")
	return resp.GetResult()
}

func adam(p oracle.AdamParams) *loopsv1.AdamParams {
	return &loopsv1.AdamParams{LearningRate: p.LR, Beta1: p.Beta1, Beta2: p.Beta2, Eps: p.Eps,
		WeightDecay: p.WeightDecay, GradClipNorm: p.GradClipNorm}
}

// defaultAdam is Tinker's AdamParams with a learning rate.
func defaultAdam(lr float64) oracle.AdamParams {
	return oracle.AdamParams{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
}

// probeAdam is the optimizer step the suite uses to read a backend's gradient: with eps 1
// and learning rate 1, the first step moves each weight by −g/(|g|+1), which is invertible.
var probeAdam = oracle.AdamParams{LR: 1, Beta1: 0.9, Beta2: 0.95, Eps: 1}

// recoverGrad inverts a first probe step: g = −sign(Δ)·eps·|Δ|/(lr − |Δ|).
func recoverGrad(before, after map[string][]float64) map[string][]float64 {
	g := map[string][]float64{}
	for k, b := range before {
		a := after[k]
		out := make([]float64, len(b))
		for i := range b {
			d := a[i] - b[i]
			out[i] = -math.Copysign(probeAdam.Eps*math.Abs(d)/(probeAdam.LR-math.Abs(d)), d)
		}
		g[k] = out
	}
	return g
}

// warm creates an adapter, trains it one cross-entropy step (so B is not zero and LoRA
// matters), saves it and returns the folder and the oracle's copy.
func (h *harness) warm(lc *loopsv1.LoraConfig) (string, *oracle.Adapter) {
	h.t.Helper()
	id := h.create(lc)
	data := []example{h.ceExample(12, nil), h.ceExample(9, nil)}
	h.fb(id, oracle.Loss{Name: "cross_entropy"}, data, false)
	h.step(id, defaultAdam(0.02))
	d := h.save(id, false)
	return d, h.oracleAdapter(d)
}

// gradient reads the backend's gradient of a batch at the weights in dir: it loads them
// into a fresh adapter, runs forward_backward and one probe step.
func (h *harness) gradient(dir string, lc *loopsv1.LoraConfig, l oracle.Loss, data []example) (map[string][]float64, *loopsv1.ForwardBackwardResult) {
	h.t.Helper()
	id := h.loadFresh(dir, lc)
	res := h.fb(id, l, data, false)
	h.step(id, probeAdam)
	after := h.oracleAdapter(h.save(id, false)).Vector()
	return recoverGrad(h.oracleAdapter(dir).Vector(), after), res
}

// tokens returns n random non-special token ids.
func (h *harness) tokens(n int) []int {
	limit := h.o.Cfg.VocabSize
	out := make([]int, 0, n)
	for len(out) < n {
		t := h.rng.IntN(limit)
		if h.dec.IsSpecial(t) || h.o.IsEOS(t) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// example is a datum in both forms.
type example struct {
	proto *loopsv1.Datum
	or    *oracle.Datum
}

func f32Tensor(v []float64, shape ...int64) *loopsv1.Tensor {
	t := &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: shape}
	for _, x := range v {
		t.Float32Data = append(t.Float32Data, float32(x))
	}
	return t
}

func i64Tensor(v []int, shape ...int64) *loopsv1.Tensor {
	t := &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: shape}
	for _, x := range v {
		t.Int64Data = append(t.Int64Data, int64(x))
	}
	return t
}

// f32 rounds to float32, as values are on the wire.
func f32(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(float32(x))
	}
	return out
}

func toInt32(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// ceExample is a cross-entropy datum over n+1 random tokens: input n tokens, targets the
// next ones, weights w (nil: all ones).
func (h *harness) ceExample(n int, w []float64) example {
	seq := h.tokens(n + 1)
	if w == nil {
		w = make([]float64, n)
		for i := range w {
			w[i] = 1
		}
	}
	w = f32(w)
	n64 := int64(n)
	return example{
		proto: &loopsv1.Datum{Tokens: toInt32(seq[:n]), LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": i64Tensor(seq[1:], n64), "weights": f32Tensor(w, n64)}},
		or: &oracle.Datum{Tokens: seq[:n], Targets: seq[1:], K: 1, Weights: w},
	}
}

// rlExample is an RL datum over n+1 random tokens whose sampler log-probs are chosen so
// that the ratio r = exp(lp − q) takes the given values under ad (cycled), with the
// given advantages (cycled).
func (h *harness) rlExample(n int, ad *oracle.Adapter, ratios, advs []float64) example {
	seq := h.tokens(n + 1)
	lps := h.o.LogProbs(seq[:n], ad, seq[1:], 1)
	q := make([]float64, n)
	a := make([]float64, n)
	for i := range q {
		q[i] = lps[i] - math.Log(ratios[i%len(ratios)])
		a[i] = advs[i%len(advs)]
	}
	q, a = f32(q), f32(a)
	n64 := int64(n)
	return example{
		proto: &loopsv1.Datum{Tokens: toInt32(seq[:n]), LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": i64Tensor(seq[1:], n64), "logprobs": f32Tensor(q, n64), "advantages": f32Tensor(a, n64)}},
		or: &oracle.Datum{Tokens: seq[:n], Targets: seq[1:], K: 1, SamplerLogprobs: q, Advantages: a},
	}
}

func oracleData(data []example) []*oracle.Datum {
	out := make([]*oracle.Datum, len(data))
	for i, d := range data {
		out[i] = d.or
	}
	return out
}

// values returns a float32 output tensor's values and checks its shape.
func (h *harness) values(t *loopsv1.Tensor, what string, shape ...int64) []float64 {
	h.t.Helper()
	require.NotNil(h.t, t, "output %q is missing", what)
	require.Equal(h.t, loopsv1.Dtype_DTYPE_FLOAT32, t.GetDtype(), "output %q dtype", what)
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	require.Len(h.t, t.GetFloat32Data(), int(n), "output %q has the wrong number of values", what)
	if len(t.GetShape()) > 0 || len(shape) > 1 {
		require.Equal(h.t, shape, t.GetShape(), "output %q shape", what)
	}
	out := make([]float64, n)
	for i, v := range t.GetFloat32Data() {
		out[i] = float64(v)
	}
	return out
}

// checkMetrics requires every key to be "name:reduction" and the given keys to be present.
func (h *harness) checkMetrics(m map[string]float64, must ...string) {
	h.t.Helper()
	for k, v := range m {
		name, red, ok := strings.Cut(k, ":")
		require.True(h.t, ok && name != "" && red != "" && !strings.Contains(red, ":"),
			"metric key %q is not of the form name:reduction", k)
		require.False(h.t, math.IsNaN(v), "metric %q is NaN", k)
	}
	for _, k := range must {
		require.Contains(h.t, m, k, "metrics lack %q", k)
	}
}

// checkOutputs compares a ForwardBackward result with the oracle's evaluation.
func (h *harness) checkOutputs(res *loopsv1.ForwardBackwardResult, data []example, ev *oracle.Eval) {
	h.t.Helper()
	h.checkMetrics(res.GetMetrics(), "loss:sum")
	require.Len(h.t, res.GetOutputs(), len(data), "one output per datum")
	tol := h.opts.LogprobTolerance
	var maxLP, maxEl float64
	for i, d := range data {
		n := int64(len(d.or.Tokens))
		outs := res.GetOutputs()[i].GetOutputs()
		var lp []float64
		if d.or.K > 1 || len(d.proto.GetLossFnInputs()["target_tokens"].GetShape()) == 2 {
			lp = h.values(outs["logprobs"], "logprobs", n, int64(d.or.K))
		} else {
			lp = h.values(outs["logprobs"], "logprobs", n)
		}
		for j, v := range lp {
			e := math.Abs(v - ev.LogProbs[i][j])
			maxLP = math.Max(maxLP, e)
			require.LessOrEqual(h.t, e, tol, "datum %d logprobs[%d]: backend %g, oracle %g", i, j, v, ev.LogProbs[i][j])
		}
		el := h.values(outs["elementwise_loss"], "elementwise_loss", n)
		for j, v := range el {
			want := ev.Elementwise[i][j]
			e := math.Abs(v-want) / math.Max(1, math.Abs(want))
			maxEl = math.Max(maxEl, e)
			require.LessOrEqual(h.t, e, tol, "datum %d elementwise_loss[%d]: backend %g, oracle %g", i, j, v, want)
		}
	}
	got := res.GetMetrics()["loss:sum"]
	e := math.Abs(got-ev.Total) / math.Max(1, math.Abs(ev.Total))
	require.LessOrEqual(h.t, e, tol, "loss:sum: backend %g, oracle %g", got, ev.Total)
	h.note("logprobs abs", maxLP)
	h.note("elementwise_loss rel", maxEl)
	h.note("loss:sum rel", e)
}

// checkGradient compares a backend gradient with the oracle's finite differences: along
// the gradient itself, along a random direction, and at the largest coordinate of a few
// tensors.
func (h *harness) checkGradient(ad *oracle.Adapter, data []example, l oracle.Loss, g map[string][]float64) {
	h.t.Helper()
	od := oracleData(data)
	ev := h.o.Evaluate(ad, l, od)
	norm := oracle.GlobalNorm(g)
	require.Greater(h.t, norm, 1e-6, "the backend's gradient is zero")
	const fdStep = 1e-4
	unit := map[string][]float64{}
	random := map[string][]float64{}
	keys := make([]string, 0, len(g))
	for k := range g {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var rn float64
	for _, k := range keys {
		u := make([]float64, len(g[k]))
		r := make([]float64, len(g[k]))
		for i, v := range g[k] {
			u[i] = v / norm
			r[i] = h.rng.NormFloat64()
			rn += r[i] * r[i]
		}
		unit[k], random[k] = u, r
	}
	rn = math.Sqrt(rn)
	dot := 0.0
	for _, k := range keys {
		for i := range random[k] {
			random[k][i] /= rn
			dot += random[k][i] * g[k][i]
		}
	}
	worst := 0.0
	along := h.o.Slope(ad, od, ev, unit, fdStep)
	e := math.Abs(along-norm) / norm
	worst = math.Max(worst, e)
	require.LessOrEqual(h.t, e, GradientTolerance, "gradient along itself: backend |g| = %g, oracle slope %g", norm, along)
	across := h.o.Slope(ad, od, ev, random, fdStep)
	e = math.Abs(across-dot) / norm
	worst = math.Max(worst, e)
	require.LessOrEqual(h.t, e, GradientTolerance, "gradient along a random direction: backend %g, oracle %g (|g| = %g)", dot, across, norm)
	// the largest coordinate of the largest-gradient tensor, of one lora_A and of one lora_B
	picks := map[string]bool{}
	best := func(filter string) {
		bk, bi, bv := "", -1, 0.0
		for _, k := range keys {
			if !strings.Contains(k, filter) {
				continue
			}
			for i, v := range g[k] {
				if math.Abs(v) > bv {
					bk, bi, bv = k, i, math.Abs(v)
				}
			}
		}
		if bi < 0 || picks[fmt.Sprint(bk, bi)] {
			return
		}
		picks[fmt.Sprint(bk, bi)] = true
		fd := h.o.Coordinate(ad, od, ev, bk, bi, fdStep)
		e := math.Abs(fd-g[bk][bi]) / math.Max(math.Abs(fd), 1e-3*norm)
		worst = math.Max(worst, e)
		require.LessOrEqual(h.t, e, GradientTolerance, "gradient of %s[%d]: backend %g, oracle %g", bk, bi, g[bk][bi], fd)
	}
	best("")
	best("self_attn.q_proj.lora_A")
	best("mlp.down_proj.lora_B")
	best("lm_head.lora_A")
	h.note("gradient rel", worst)
}

// checkUpdate compares the weights a backend reached with the oracle's.
func (h *harness) checkUpdate(what string, got, want map[string][]float64, lr float64, mask map[string][]bool) {
	h.t.Helper()
	tol := 1e-7 + UpdateTolerance*lr
	worst := 0.0
	checked, skipped := 0, 0
	for k, w := range want {
		gv, ok := got[k]
		require.True(h.t, ok, "%s: backend adapter lacks %s", what, k)
		require.Len(h.t, gv, len(w))
		for i := range w {
			if mask != nil && !mask[k][i] {
				skipped++
				continue
			}
			checked++
			e := math.Abs(gv[i] - w[i])
			worst = math.Max(worst, e)
			require.LessOrEqual(h.t, e, tol, "%s: %s[%d] = %g, oracle %g", what, k, i, gv[i], w[i])
		}
	}
	require.Less(h.t, skipped, checked/10+1, "%s: too many coordinates with a gradient too small to check", what)
	h.note("update abs / lr", worst/lr)
}

// clearGrad masks the coordinates whose recovered gradient is large enough to be known
// precisely from float32 weights.
func clearGrad(gs ...map[string][]float64) map[string][]bool {
	mask := map[string][]bool{}
	for k, v := range gs[0] {
		m := make([]bool, len(v))
		for i := range v {
			m[i] = true
			for _, g := range gs {
				if math.Abs(g[k][i]) < 1e-5 {
					m[i] = false
				}
			}
		}
		mask[k] = m
	}
	return mask
}

// maxAbsDiff is the largest difference between two parameter sets with the same keys.
func (h *harness) maxAbsDiff(a, b map[string][]float64) float64 {
	h.t.Helper()
	require.Equal(h.t, len(a), len(b), "the adapters have different tensors")
	d := 0.0
	for k, av := range a {
		bv, ok := b[k]
		require.True(h.t, ok, "tensor %s missing", k)
		require.Len(h.t, bv, len(av))
		for i := range av {
			d = math.Max(d, math.Abs(av[i]-bv[i]))
		}
	}
	return d
}

// code returns the connect code of an error (Unknown for other errors).
func code(err error) connect.Code { return connect.CodeOf(err) }

// sample runs one SampleRequest and requires it to succeed.
func (h *harness) sample(req *backendv1.SampleRequest) *loopsv1.SampleResult {
	h.t.Helper()
	if req.BaseModel == "" {
		req.BaseModel = h.opts.ModelName
	}
	resp, err := h.sp.Sample(h.ctx, req)
	require.NoError(h.t, err, "Sample")
	require.NotNil(h.t, resp.GetResult())
	return resp.GetResult()
}

func ints(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}
