package reference

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
)

var (
	engOnce sync.Once
	eng     *Engine
	engErr  error
	engDir  string
)

func engine(t *testing.T) *Engine {
	t.Helper()
	engOnce.Do(func() {
		engDir, engErr = os.MkdirTemp("", "loops-ref-test")
		if engErr == nil {
			eng, engErr = New(Options{DataDir: engDir, MaxLoraRank: 32})
		}
	})
	require.NoError(t, engErr)
	return eng
}

func TestMain(m *testing.M) {
	code := m.Run()
	if engDir != "" {
		os.RemoveAll(engDir)
	}
	os.Exit(code)
}

var ctx = context.Background()

func f32(v ...float64) *loopsv1.Tensor {
	t := &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32}
	for _, x := range v {
		t.Float32Data = append(t.Float32Data, float32(x))
	}
	return t
}

func i64(v ...int) *loopsv1.Tensor {
	t := &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64}
	for _, x := range v {
		t.Int64Data = append(t.Int64Data, int64(x))
	}
	return t
}

func toks32(v []int) []int32 {
	o := make([]int32, len(v))
	for i, x := range v {
		o[i] = int32(x)
	}
	return o
}

func ceDatum(seq []int, w ...float64) *loopsv1.Datum {
	n := len(seq) - 1
	if len(w) == 0 {
		for i := 0; i < n; i++ {
			w = append(w, 1)
		}
	}
	return &loopsv1.Datum{Tokens: toks32(seq[:n]), LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": i64(seq[1:]...), "weights": f32(w...)}}
}

// gspoDatum is an RL datum on seq whose sequence_ratio_mask is mask at every position;
// without a mask value it has none, and drop 0 leaves out the mask input.
func gspoDatum(seq []int, mask float64, drop ...int) *loopsv1.Datum {
	n := len(seq) - 1
	q, a, m := make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range n {
		q[i], a[i], m[i] = -5, float64(i%3)-1, mask
	}
	d := &loopsv1.Datum{Tokens: toks32(seq[:n]), LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": i64(seq[1:]...), "logprobs": f32(q...), "advantages": f32(a...), "sequence_ratio_mask": f32(m...)}}
	if len(drop) > 0 {
		delete(d.LossFnInputs, "sequence_ratio_mask")
	}
	return d
}

func createAdapter(t *testing.T, e *Engine, id string, rank int, seed uint64) {
	t.Helper()
	_ = mustOK(e.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: id}))
	_, err := e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: int32(rank), Seed: seed, TrainAttn: true, TrainMlp: true, TrainUnembed: true}})
	require.NoError(t, err)
}

func mustOK[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func fb(t *testing.T, e *Engine, item *backendv1.ForwardBackwardItem) *loopsv1.ForwardBackwardResult {
	t.Helper()
	resp, err := e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{item}})
	require.NoError(t, err)
	r := resp.Results[0]
	if ie := r.GetError(); ie != nil {
		t.Fatalf("item error %d: %s", ie.Code, ie.Message)
	}
	return r.GetResult()
}

func itemErr(t *testing.T, e *Engine, item *backendv1.ForwardBackwardItem) *backendv1.ItemError {
	t.Helper()
	resp, err := e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{item}})
	require.NoError(t, err)
	ie := resp.Results[0].GetError()
	require.NotNil(t, ie, "expected an item error")
	return ie
}

var seqA = []int{1, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 200, 300}

func TestCapabilities(t *testing.T) {
	e := engine(t)
	c, err := e.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	require.Len(t, c.Models, 1)
	m := c.Models[0]
	require.Equal(t, tiny.Name, m.Name)
	require.True(t, filepath.IsAbs(m.TokenizerId))
	require.NotContains(t, m.TokenizerId, ":")
	require.FileExists(t, filepath.Join(m.TokenizerId, "tokenizer.json"))
	require.FileExists(t, filepath.Join(m.TokenizerId, "tokenizer_config.json"))
	require.Equal(t, int32(512), m.VocabSize)
	require.True(t, m.TiedEmbeddings) // loops/tiny's head is its embedding matrix
	require.Empty(t, m.LanguageModelPrefix)
	require.ElementsMatch(t, LossFunctions, c.LossFunctions)
}

// Every loss against an independent float64 computation from the returned log-probs.
func TestLossesMatchIndependentComputation(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "loss", 4, 1)
	n := len(seqA) - 1
	in := toks32(seqA[:n])
	tg := seqA[1:]
	q := make([]float64, n)
	adv := make([]float64, n)
	for i := range q {
		q[i] = -6.2 + 0.3*math.Sin(float64(i))
		adv[i] = math.Cos(float64(3 * i))
	}
	// learner log-probs (and cross-entropy with weights, negative ones included)
	w := make([]float64, n)
	for i := range w {
		w[i] = float64(i%3) - 0.5
	}
	ce := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "loss", LossFn: "cross_entropy", ForwardOnly: true,
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{"target_tokens": i64(tg...), "weights": f32(w...)}}}})
	lpT := ce.Outputs[0].Outputs["logprobs"]
	require.Equal(t, []int64{int64(n)}, lpT.Shape)
	lp := make([]float64, n)
	var want float64
	for i, v := range lpT.Float32Data {
		lp[i] = float64(v)
		require.Less(t, lp[i], 0.0)
		want += -w[i] * lp[i]
		require.InDelta(t, -w[i]*lp[i], float64(ce.Outputs[0].Outputs["elementwise_loss"].Float32Data[i]), 1e-4)
	}
	require.InDelta(t, want, ce.Metrics["loss:sum"], 1e-3)

	clipv := func(x, lo, hi float64) float64 { return math.Min(math.Max(x, lo), hi) }
	cases := []struct {
		name string
		cfg  map[string]float64
		f    func(lp, q, a float64) float64
	}{
		{"importance_sampling", nil, func(lp, q, a float64) float64 { return -math.Exp(lp-q) * a }},
		{"ppo", nil, func(lp, q, a float64) float64 {
			r := math.Exp(lp - q)
			return -math.Min(r*a, clipv(r, 0.8, 1.2)*a)
		}},
		{"ppo", map[string]float64{"clip_low_threshold": 0.5, "clip_high_threshold": 3}, func(lp, q, a float64) float64 {
			r := math.Exp(lp - q)
			return -math.Min(r*a, clipv(r, 0.5, 3)*a)
		}},
		{"cispo", nil, func(lp, q, a float64) float64 { return -clipv(math.Exp(lp-q), 0.8, 1.2) * a * lp }},
		{"dro", map[string]float64{"beta": 0.3}, func(lp, q, a float64) float64 { return -(lp*a - 0.5*0.3*(lp-q)*(lp-q)) }},
		{"dro", nil, func(lp, q, a float64) float64 { return -(lp*a - 0.5*semantics.DefaultDROBeta*(lp-q)*(lp-q)) }},
	}
	// q close to lp so ratios straddle the clip range
	for i := range q {
		q[i] = lp[i] + 0.4*math.Sin(float64(5*i))
	}
	for _, c := range cases {
		res := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "loss", LossFn: c.name, LossFnConfig: c.cfg, ForwardOnly: true,
			Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{"target_tokens": i64(tg...), "logprobs": f32(q...), "advantages": f32(adv...)}}}})
		var sum float64
		el := res.Outputs[0].Outputs["elementwise_loss"].Float32Data
		for i := range lp {
			// q went through float32 on the wire
			want := c.f(lp[i], float64(float32(q[i])), float64(float32(adv[i])))
			require.InDelta(t, want, float64(el[i]), 1e-4, "%s position %d", c.name, i)
			sum += want
		}
		require.InDelta(t, sum, res.Metrics["loss:sum"], 1e-3, c.name)
	}
}

// Gradients of every loss against float64 finite differences on a small model.
func TestLossGradientsFiniteDifference(t *testing.T) {
	cfg := nn.Config{Vocab: 50, Hidden: 16, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 8, Inter: 32, MaxPos: 64, Tied: true}
	m, err := nn.NewRandom[float64](cfg, nn.RandomOptions{QKNorm: true, Std: 0.3, Seed: 11})
	require.NoError(t, err)
	ad, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 2, Seed: 5, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	for i, p := range ad.Params {
		for j := range p.W {
			p.W[j] = 0.2 * math.Sin(float64(7*i+j))
		}
	}
	toks := []int{3, 17, 22, 9, 41, 5, 30}
	tg := []int{17, 22, 9, 41, 5, 30, 2}
	n := len(toks)
	dl := &datumLoss{n: n, k: 1, targets: tg, weights: make([]float64, n), q: make([]float64, n), adv: make([]float64, n)}
	for i := 0; i < n; i++ {
		dl.weights[i] = 1 - 0.3*float64(i)
		dl.adv[i] = math.Sin(float64(i) + 1)
		dl.q[i] = -math.Log(50) + 0.3*math.Cos(float64(2*i))
	}
	for _, c := range []struct {
		name string
		cfg  map[string]float64
	}{{"cross_entropy", nil}, {"importance_sampling", nil}, {"ppo", map[string]float64{"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}}, {"cispo", nil}, {"dro", map[string]float64{"beta": 0.5}}} {
		lf := lossFn(c.name, c.cfg)
		tl := func(_, pos, k int, lp float64) (float64, float64) { return lf(dl, pos, k, lp) }
		seqs := []nn.Seq[float64]{{Tokens: toks, Targets: tg, K: 1, Adapter: ad}}
		ad.ZeroGrad()
		m.ForwardBackward(seqs, tl, true)
		total := func() float64 {
			var s float64
			for _, l := range m.ForwardBackward(seqs, tl, false)[0].Loss {
				s += l
			}
			return s
		}
		worst := 0.0
		for pi, p := range ad.Params {
			for _, j := range []int{0, len(p.W) / 2, len(p.W) - 1} {
				w0 := p.W[j]
				const h = 1e-6
				p.W[j] = w0 + h
				lp := total()
				p.W[j] = w0 - h
				lm := total()
				p.W[j] = w0
				fd := (lp - lm) / (2 * h)
				rel := math.Abs(fd-p.G[j]) / math.Max(math.Abs(fd)+math.Abs(p.G[j]), 1e-6)
				if math.Abs(fd-p.G[j]) < 1e-8 {
					rel = 0
				}
				worst = max(worst, rel)
				require.Less(t, rel, 1e-4, "%s param %d (%s) index %d: analytic %g fd %g", c.name, pi, p.Name, j, p.G[j], fd)
			}
		}
		t.Logf("%s: worst relative gradient error %.2e", c.name, worst)
	}
}

func adapterState_(t *testing.T, e *Engine, id string) *nn.Adapter[float32] {
	a, err := e.adapter(id)
	require.NoError(t, err)
	return a.ad
}

// AdamW against a hand computation, with weight decay and clipping, over two steps.
func TestOptimStepMatchesHandComputation(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "adam", 4, 3)
	ad := adapterState_(t, e, "adam")
	type st struct{ w, m, v float64 }
	state := map[*nn.Param[float32]][]st{}
	for _, p := range ad.Params {
		s := make([]st, len(p.W))
		for i, w := range p.W {
			s[i].w = float64(w)
		}
		state[p] = s
	}
	params := []*loopsv1.AdamParams{
		{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClipNorm: 0},
		{LearningRate: 5e-3, Beta1: 0.8, Beta2: 0.99, Eps: 1e-12, WeightDecay: 0.0, GradClipNorm: 0.01},
	}
	for step, ap := range params {
		fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "adam", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
		var ss float64
		grads := map[*nn.Param[float32]][]float64{}
		for _, p := range ad.Params {
			g := make([]float64, len(p.G))
			for i, x := range p.G {
				g[i] = float64(x)
				ss += g[i] * g[i]
			}
			grads[p] = g
		}
		norm := math.Sqrt(ss)
		require.Greater(t, norm, 0.0)
		coef := 1.0
		if ap.GradClipNorm > 0 && norm > ap.GradClipNorm {
			coef = ap.GradClipNorm / (norm + 1e-6)
		}
		tt := float64(step + 1)
		for _, p := range ad.Params {
			s := state[p]
			for i := range s {
				g := grads[p][i] * coef
				s[i].m = ap.Beta1*s[i].m + (1-ap.Beta1)*g
				s[i].v = ap.Beta2*s[i].v + (1-ap.Beta2)*g*g
				s[i].w *= 1 - ap.LearningRate*ap.WeightDecay
				mh := s[i].m / (1 - math.Pow(ap.Beta1, tt))
				vh := s[i].v / (1 - math.Pow(ap.Beta2, tt))
				s[i].w -= ap.LearningRate * mh / (math.Sqrt(vh) + ap.Eps)
			}
		}
		before := map[*nn.Param[float32]][]float32{}
		for _, p := range ad.Params {
			before[p] = append([]float32(nil), p.W...)
		}
		res, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "adam", Adam: ap})
		require.NoError(t, err)
		require.InDelta(t, norm, res.Result.Metrics["grad_norm:mean"], 1e-6*norm+1e-9)
		worst, upd := 0.0, 0.0
		for _, p := range ad.Params {
			for i, w := range p.W {
				d := float64(w) - float64(before[p][i])
				upd += d * d
				worst = max(worst, math.Abs(float64(w)-state[p][i].w))
				require.Zero(t, p.G[i], "gradients must be zeroed")
			}
		}
		// The update norm is ‖W_after − W_before‖ of the weights as stored.
		require.Greater(t, upd, 0.0)
		require.InDelta(t, math.Sqrt(upd), res.Result.Metrics["update_norm:mean"], 1e-9*math.Sqrt(upd))
		t.Logf("step %d: grad norm %.4g, update norm %.4g, max |w - hand| = %.2e", step+1, norm, math.Sqrt(upd), worst)
		require.Less(t, worst, 1e-6)
	}
}

func TestTrainingReducesLossAndIsolatesAdapters(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "iso-a", 8, 1)
	createAdapter(t, e, "iso-b", 8, 2)
	b0 := adapterState_(t, e, "iso-b").Clone()
	item := &backendv1.ForwardBackwardItem{AdapterId: "iso-a", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}}
	var first, last float64
	for i := 0; i < 8; i++ {
		r := fb(t, e, item)
		if i == 0 {
			first = r.Metrics["loss:sum"]
		}
		last = r.Metrics["loss:sum"]
		_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "iso-a", Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}})
		require.NoError(t, err)
	}
	t.Logf("loss %.3f -> %.3f after 8 steps", first, last)
	require.Less(t, last, first*0.9)
	b1 := adapterState_(t, e, "iso-b")
	for i := range b0.Params {
		require.Equal(t, b0.Params[i].W, b1.Params[i].W)
		require.Equal(t, b0.Params[i].G, b1.Params[i].G)
	}
	// a batch of two adapters gives each the gradient it gets alone
	createAdapter(t, e, "pair-a", 4, 7)
	createAdapter(t, e, "pair-b", 4, 7)
	createAdapter(t, e, "solo", 4, 7)
	for _, id := range []string{"pair-a", "pair-b", "solo"} {
		for _, p := range adapterState_(t, e, id).Params {
			for i := range p.W {
				p.W[i] = float32(0.01 * math.Sin(float64(i)))
			}
		}
	}
	resp, err := e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
		{AdapterId: "pair-a", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}},
		{AdapterId: "pair-b", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA[:7]), ceDatum(seqA[3:])}},
		{AdapterId: "missing", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}},
	}})
	require.NoError(t, err)
	require.Equal(t, int32(connect.CodeNotFound), resp.Results[2].GetError().GetCode())
	solo := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "solo", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
	require.InDelta(t, solo.Metrics["loss:sum"], resp.Results[0].GetResult().Metrics["loss:sum"], 1e-4)
	pa, ps := adapterState_(t, e, "pair-a"), adapterState_(t, e, "solo")
	for i := range pa.Params {
		require.InDeltaSlice(t, toF64(ps.Params[i].G), toF64(pa.Params[i].G), 1e-5)
	}
}

func toF64(x []float32) []float64 {
	o := make([]float64, len(x))
	for i, v := range x {
		o[i] = float64(v)
	}
	return o
}

func TestCrossEntropy2DTargets(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "k2", 4, 1)
	n := 5
	in := toks32(seqA[:n])
	// K=2: targets seqA[i+1] and seqA[i+2] with weights 1 and -0.5
	tg, w := []int{}, []float64{}
	for i := 0; i < n; i++ {
		tg = append(tg, seqA[i+1], seqA[i+2])
		w = append(w, 1, -0.5)
	}
	tt, wt := i64(tg...), f32(w...)
	tt.Shape, wt.Shape = []int64{int64(n), 2}, []int64{int64(n), 2}
	res := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "k2", LossFn: "cross_entropy", ForwardOnly: true,
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{"target_tokens": tt, "weights": wt}}}})
	lp := res.Outputs[0].Outputs["logprobs"]
	require.Equal(t, []int64{int64(n), 2}, lp.Shape)
	one := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "k2", LossFn: "cross_entropy", ForwardOnly: true,
		Data: []*loopsv1.Datum{ceDatum(seqA[:n+1])}})
	var want float64
	for i := 0; i < n; i++ {
		require.InDelta(t, one.Outputs[0].Outputs["logprobs"].Float32Data[i], lp.Float32Data[2*i], 1e-5)
		want += -(1*float64(lp.Float32Data[2*i]) - 0.5*float64(lp.Float32Data[2*i+1]))
	}
	require.InDelta(t, want, res.Metrics["loss:sum"], 1e-3)
}

func TestSaveLoadContinueMatchesUninterrupted(t *testing.T) {
	e := engine(t)
	ap := &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12, WeightDecay: 0.01}
	step := func(id string) {
		fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
		_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: ap})
		require.NoError(t, err)
	}
	createAdapter(t, e, "ck", 8, 5)
	step("ck")
	step("ck")
	dir := filepath.Join(t.TempDir(), "ckpt")
	sz, err := e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "ck", Dir: dir, IncludeOptimizer: true})
	require.NoError(t, err)
	require.Greater(t, sz.SizeBytes, int64(0))
	pc, err := nn.ReadPEFTConfig(dir)
	require.NoError(t, err)
	require.Equal(t, "LORA", pc.PeftType)
	require.Equal(t, 8, pc.R)
	require.Equal(t, 32.0, pc.LoraAlpha)
	require.Equal(t, "CAUSAL_LM", pc.TaskType)
	require.Equal(t, []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}, pc.TargetModules)
	f, err := safetensors.Open(filepath.Join(dir, peft.AdapterWeightsFile))
	require.NoError(t, err)
	info := f.Tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
	require.Equal(t, []int64{8, 256}, info.Shape)
	require.Equal(t, []int64{512, 8}, f.Tensors["base_model.model.lm_head.lora_B.weight"].Shape)
	require.Equal(t, []int64{256, 8}, f.Tensors["base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"].Shape)
	f.Close()

	// continue the original and a reloaded copy for two more steps
	_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "ck-restored", Dir: dir, LoadOptimizer: true})
	require.NoError(t, err)
	step("ck")
	step("ck")
	step("ck-restored")
	step("ck-restored")
	a, b := adapterState_(t, e, "ck"), adapterState_(t, e, "ck-restored")
	require.Equal(t, a.Step, b.Step)
	for i := range a.Params {
		require.Equal(t, a.Params[i].Name, b.Params[i].Name)
		require.Equal(t, a.Params[i].W, b.Params[i].W, "weights differ after resuming")
	}
	// loading without the optimizer resets it
	_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "ck-restored", Dir: dir})
	require.NoError(t, err)
	require.Equal(t, 0, adapterState_(t, e, "ck-restored").Step)
	// sampling with the saved folder equals sampling with the adapter's weights
	seed := uint64(3)
	r1, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: dir, Prompt: toks32(seqA[:4]), NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 8, Temperature: 1, TopP: 1, Seed: &seed}})
	require.NoError(t, err)
	r0, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(seqA[:4]), NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 8, Temperature: 1, TopP: 1, Seed: &seed}})
	require.NoError(t, err)
	require.NotEqual(t, r0.Result.Sequences[0].Logprobs, r1.Result.Sequences[0].Logprobs, "the adapter must change the distribution")
}

func TestBadInput(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "bad", 4, 1)
	code := func(err error) connect.Code { return connect.CodeOf(err) }
	_, err := e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "r0", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 0, TrainAttn: true}})
	// rank 0 is full fine-tuning, which the torch worker serves
	require.Equal(t, connect.CodeFailedPrecondition, code(err))
	require.Contains(t, err.Error(), "full fine-tuning (LoRA rank 0) is not served by the reference engine, which trains LoRA adapters only: the torch worker serves it (loops serve --backend torch)")
	_, err = e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "neg", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: -1, TrainAttn: true}})
	require.Equal(t, connect.CodeInvalidArgument, code(err))
	_, err = e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "r99", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 99, TrainAttn: true}})
	require.Equal(t, connect.CodeInvalidArgument, code(err))
	require.Contains(t, err.Error(), "1 to 32")
	_, err = e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "m", BaseModel: "nope", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.Equal(t, connect.CodeInvalidArgument, code(err))
	_, err = e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{})
	require.Equal(t, connect.CodeInvalidArgument, code(err))
	inv := int32(connect.CodeInvalidArgument)
	cases := map[string]*backendv1.ForwardBackwardItem{
		"empty batch":   {AdapterId: "bad", LossFn: "cross_entropy"},
		"unknown loss":  {AdapterId: "bad", LossFn: "nope", Data: []*loopsv1.Datum{ceDatum(seqA)}},
		"unknown key":   {AdapterId: "bad", LossFn: "ppo", LossFnConfig: map[string]float64{"clip": 1}, Data: []*loopsv1.Datum{ceDatum(seqA)}},
		"ce config key": {AdapterId: "bad", LossFn: "cross_entropy", LossFnConfig: map[string]float64{"beta": 1}, Data: []*loopsv1.Datum{ceDatum(seqA)}},
		"oov token":     {AdapterId: "bad", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum([]int{1, 2, 512})}},
		"oov input":     {AdapterId: "bad", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum([]int{-1, 2, 3})}},
		"wrong length":  {AdapterId: "bad", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum([]int{1, 2, 3}, 1)}},
		"missing input": {AdapterId: "bad", LossFn: "ppo", Data: []*loopsv1.Datum{ceDatum(seqA)}},
		"too long":      {AdapterId: "bad", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(make([]int, 2050))}},
		"clip range":    {AdapterId: "bad", LossFn: "ppo", LossFnConfig: map[string]float64{"clip_high_threshold": 0.5}, Data: []*loopsv1.Datum{gspoDatum(seqA, 1)}},
		"gspo no mask":  {AdapterId: "bad", LossFn: "gspo", Data: []*loopsv1.Datum{gspoDatum(seqA, 1, 0)}},
		"gspo mask 0":   {AdapterId: "bad", LossFn: "gspo", Data: []*loopsv1.Datum{gspoDatum(seqA, 0)}},
	}
	for name, it := range cases {
		ie := itemErr(t, e, it)
		require.Equal(t, inv, ie.Code, name)
		require.NotEmpty(t, ie.Message, name)
	}
	_, err = e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "nope", Adam: &loopsv1.AdamParams{LearningRate: 1}})
	require.Equal(t, connect.CodeNotFound, code(err))
	_, err = e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "bad", Adam: &loopsv1.AdamParams{LearningRate: -1, Beta1: 0.9, Beta2: 0.9}})
	require.Equal(t, connect.CodeInvalidArgument, code(err))
	for name, req := range map[string]*backendv1.SampleRequest{
		"empty prompt": {BaseModel: tiny.Name, Params: &loopsv1.SamplingParams{MaxTokens: 1}},
		"oov prompt":   {BaseModel: tiny.Name, Prompt: []int32{600}, Params: &loopsv1.SamplingParams{MaxTokens: 1}},
		"zero tokens":  {BaseModel: tiny.Name, Prompt: []int32{1}, Params: &loopsv1.SamplingParams{MaxTokens: 0}},
		"too long":     {BaseModel: tiny.Name, Prompt: []int32{1}, Params: &loopsv1.SamplingParams{MaxTokens: 5000}},
		"bad temp":     {BaseModel: tiny.Name, Prompt: []int32{1}, Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: -1}},
		"bad model":    {BaseModel: "x", Prompt: []int32{1}, Params: &loopsv1.SamplingParams{MaxTokens: 1}},
		"relative dir": {BaseModel: tiny.Name, AdapterDir: "rel", Prompt: []int32{1}, Params: &loopsv1.SamplingParams{MaxTokens: 1}},
	} {
		_, err := e.Sample(ctx, req)
		require.Equal(t, connect.CodeInvalidArgument, code(err), name)
	}
}

// Concurrent calls on different adapters (and sampling) are safe (run with -race).
func TestConcurrentAdapters(t *testing.T) {
	e := engine(t)
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		id := []string{"conc-a", "conc-b", "conc-c"}[g]
		createAdapter(t, e, id, 4, uint64(g))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				_, err := e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
					{AdapterId: id, LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}}}})
				if err != nil {
					panic(err)
				}
				if _, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: &loopsv1.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}}); err != nil {
					panic(err)
				}
				if _, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(seqA[:3]), NumSamples: 2, Params: &loopsv1.SamplingParams{MaxTokens: 3, Temperature: 1, TopP: 1}}); err != nil {
					panic(err)
				}
			}
		}()
	}
	wg.Wait()
}
