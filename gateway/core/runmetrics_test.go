package core

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

func f32(t *loopsv1.Tensor) []float32 { return t.GetFloat32Data() }

func floatTensor(v ...float32) *loopsv1.Tensor {
	return &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: v}
}

// rlDatum is an RL example: tokens, sampler logprobs q and advantages a (prompt positions
// carry zeros in both).
func rlDatum(q, a []float32) *loopsv1.Datum {
	tokens := make([]int32, len(q))
	targets := make([]int64, len(q))
	for i := range tokens {
		tokens[i], targets[i] = int32(i+1), int64(i+2)
	}
	return &loopsv1.Datum{Tokens: tokens, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: targets},
		"logprobs":      floatTensor(q...),
		"advantages":    floatTensor(a...),
	}}
}

// TestFBStepMetricsNumbers checks a ppo forward_backward's record against a direct float64
// computation of every signal over the sampled tokens.
func TestFBStepMetricsNumbers(t *testing.T) {
	data := []*loopsv1.Datum{
		// two prompt positions (zeros), three sampled tokens
		rlDatum([]float32{0, 0, -1.2, -0.3, -2.5}, []float32{0, 0, 0.5, 0.5, 0.5}),
		// three sampled tokens
		rlDatum([]float32{0, -0.7, -0.1, -1.9}, []float32{0, -0.25, -0.25, -0.25}),
		// a group with equal rewards: all advantages zero (two sampled tokens)
		rlDatum([]float32{0, -0.4, -0.8}, []float32{0, 0, 0}),
	}
	lps := [][]float32{{-3, -2, -1.0, -0.45, -2.0}, {-1, -0.9, -0.1, -1.5}, {-5, -0.5, -0.7}}
	item := &backendv1.ForwardBackwardItem{AdapterId: "r", Data: data, LossFn: "ppo",
		LossFnConfig: map[string]float64{"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}}
	res := &loopsv1.ForwardBackwardResult{Metrics: map[string]float64{"loss:sum": -1.75}}
	for _, lp := range lps {
		res.Outputs = append(res.Outputs, &loopsv1.DatumOutput{Outputs: map[string]*loopsv1.Tensor{"logprobs": floatTensor(lp...)}})
	}

	// The independent computation.
	var ratios, kls1, kls3, advs []float64
	zeroExamples := 0
	for j, d := range data {
		q, a := f32(d.GetLossFnInputs()["logprobs"]), f32(d.GetLossFnInputs()["advantages"])
		allZero := true
		for i := range q {
			if a[i] != 0 {
				allZero = false
			}
			if q[i] == 0 && a[i] == 0 {
				continue
			}
			logR := float64(lps[j][i]) - float64(q[i])
			r := math.Exp(logR)
			ratios = append(ratios, r)
			kls1 = append(kls1, -logR)
			kls3 = append(kls3, r-1-logR)
			advs = append(advs, float64(a[i]))
		}
		if allZero {
			zeroExamples++
		}
	}
	mean := func(x []float64) float64 {
		s := 0.0
		for _, v := range x {
			s += v
		}
		return s / float64(len(x))
	}
	std := func(x []float64) float64 {
		m, s := mean(x), 0.0
		for _, v := range x {
			s += (v - m) * (v - m)
		}
		return math.Sqrt(s / float64(len(x)))
	}
	clipped := 0
	for _, r := range ratios {
		if r < 0.9 || r > 1.1 {
			clipped++
		}
	}
	require.Len(t, ratios, 8)

	got := fbStepMetrics(item, res, 12, 250*time.Millisecond)
	const eps = 1e-6
	require.Equal(t, loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, got.GetKind())
	require.Equal(t, "ppo", got.GetLossFn())
	require.EqualValues(t, 12, got.GetTokens())
	require.EqualValues(t, 3, got.GetExamples())
	require.EqualValues(t, 8, got.GetLossTokens())
	require.InDelta(t, -1.75, got.GetLossSum(), eps)
	require.InDelta(t, -1.75/8, got.GetLossMean(), eps)
	require.InDelta(t, 0.25, got.GetBackendSeconds(), eps)
	rl := got.GetRl()
	require.EqualValues(t, 8, rl.GetTokens())
	require.InDelta(t, mean(kls1), rl.GetKlSampleTrainK1(), eps)
	require.InDelta(t, mean(kls3), rl.GetKlSampleTrainK3(), eps)
	require.InDelta(t, mean(ratios), rl.GetRatioMean(), eps)
	require.InDelta(t, std(ratios), rl.GetRatioStd(), eps)
	minR, maxR := math.Inf(1), math.Inf(-1)
	for _, r := range ratios {
		minR, maxR = min(minR, r), max(maxR, r)
	}
	require.InDelta(t, minR, rl.GetRatioMin(), eps)
	require.InDelta(t, maxR, rl.GetRatioMax(), eps)
	require.InDelta(t, mean(advs), rl.GetAdvantageMean(), eps)
	require.InDelta(t, std(advs), rl.GetAdvantageStd(), eps)
	require.InDelta(t, 1.0/3, rl.GetZeroAdvantageFraction(), eps)
	require.Equal(t, 1, zeroExamples)
	require.NotNil(t, rl.ClipFraction)
	require.InDelta(t, float64(clipped)/8, rl.GetClipFraction(), eps)

	// cispo takes the default thresholds (0.8, 1.2); importance_sampling has no clip.
	item.LossFn, item.LossFnConfig = "cispo", nil
	clipped = 0
	for _, r := range ratios {
		if r < 0.8 || r > 1.2 {
			clipped++
		}
	}
	require.InDelta(t, float64(clipped)/8, fbStepMetrics(item, res, 12, 0).GetRl().GetClipFraction(), eps)
	item.LossFn = "importance_sampling"
	require.Nil(t, fbStepMetrics(item, res, 12, 0).GetRl().ClipFraction)

	// cross_entropy: no RL signals; the loss tokens are the non-zero weights.
	ce := &backendv1.ForwardBackwardItem{LossFn: "cross_entropy", Data: []*loopsv1.Datum{{
		Tokens: []int32{1, 2, 3, 4},
		LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: []int64{2, 3, 4, 5}},
			"weights":       floatTensor(0, 0, 1, 0.5),
		},
	}}}
	got = fbStepMetrics(ce, &loopsv1.ForwardBackwardResult{Metrics: map[string]float64{"loss:sum": 3}}, 4, 0)
	require.Nil(t, got.GetRl())
	require.EqualValues(t, 2, got.GetLossTokens())
	require.InDelta(t, 1.5, got.GetLossMean(), eps)
}

// TestMergeStepMetrics: merged records add sums and weight means and spreads by what they
// cover, as one record over the union would have them.
func TestMergeStepMetrics(t *testing.T) {
	a := []float64{1.1, 0.9, 1.3}
	b := []float64{0.7, 1.0}
	stats := func(x []float64) (m, s float64) {
		for _, v := range x {
			m += v
		}
		m /= float64(len(x))
		for _, v := range x {
			s += (v - m) * (v - m)
		}
		return m, math.Sqrt(s / float64(len(x)))
	}
	ma, sa := stats(a)
	mb, sb := stats(b)
	mu, su := stats(append(append([]float64{}, a...), b...))
	x := &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, SeqId: 1, Step: 1, Count: 1,
		LossFn: "ppo", LossSum: 3, LossTokens: 3, Tokens: 5, Examples: 1, BackendSeconds: 1,
		Rl: &loopsv1.RLStepMetrics{Tokens: 3, RatioMean: ma, RatioStd: sa, RatioMin: 0.9, RatioMax: 1.3, ZeroAdvantageFraction: 0, ClipFraction: proto.Float64(1.0 / 3)}}
	y := &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, SeqId: 3, Step: 2, Count: 1,
		LossFn: "ppo", LossSum: 1, LossTokens: 2, Tokens: 4, Examples: 3, BackendSeconds: 2,
		Rl: &loopsv1.RLStepMetrics{Tokens: 2, RatioMean: mb, RatioStd: sb, RatioMin: 0.7, RatioMax: 1.0, ZeroAdvantageFraction: 1, ClipFraction: proto.Float64(0.5)}}
	m := store.MergeStepMetrics(x, y)
	const eps = 1e-9
	require.EqualValues(t, 2, m.GetCount())
	require.EqualValues(t, 1, m.GetSeqId())
	require.EqualValues(t, 3, m.GetLastSeqId())
	require.EqualValues(t, 2, m.GetLastStep())
	require.InDelta(t, 4, m.GetLossSum(), eps)
	require.InDelta(t, 0.8, m.GetLossMean(), eps)
	require.InDelta(t, 3, m.GetBackendSeconds(), eps)
	require.InDelta(t, mu, m.GetRl().GetRatioMean(), eps)
	require.InDelta(t, su, m.GetRl().GetRatioStd(), eps)
	require.InDelta(t, 0.7, m.GetRl().GetRatioMin(), eps)
	require.InDelta(t, 1.3, m.GetRl().GetRatioMax(), eps)
	require.InDelta(t, 0.75, m.GetRl().GetZeroAdvantageFraction(), eps)
	require.InDelta(t, 2.0/5, m.GetRl().GetClipFraction(), eps)
	require.Empty(t, m.GetCostUsd(), "no cost on either: none merged")

	// Costs add exactly; an unpriced record adds nothing.
	for _, c := range []struct{ a, b, want string }{
		{"0.0000016", "0.0000032", "0.0000048"},
		{"0.1", "", "0.1"},
		{"", "0.000000000001", "0.000000000001"},
		{"0.3", "0.6", "0.9"}, // 0.30000000000000004 in float64
	} {
		x.CostUsd, y.CostUsd = c.a, c.b
		require.Equal(t, c.want, store.MergeStepMetrics(x, y).GetCostUsd(), c)
	}
	x.CostUsd, y.CostUsd = "", ""

	// Downsampling to one point per kind merges everything of that kind.
	o := &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, SeqId: 2, Step: 1, Count: 1, LearningRate: proto.Float64(1), UpdateNorm: proto.Float64(0.5)}
	o2 := &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, SeqId: 4, Step: 2, Count: 1, LearningRate: proto.Float64(3), UpdateNorm: proto.Float64(1.5)}
	ds := store.DownsampleStepMetrics([]*loopsv1.StepMetrics{x, o, y, o2}, 1)
	require.Len(t, ds, 2)
	require.Empty(t, cmp.Diff(m, ds[0], protocmp.Transform()))
	require.InDelta(t, 2, ds[1].GetLearningRate(), eps)
	require.InDelta(t, 1, ds[1].GetUpdateNorm(), eps) // merged like the learning rate: the mean
}

// rlRequest is an importance_sampling forward_backward of one example (the fake backend
// answers logprobs 0, so r = exp(-q)).
func rlRequest(run string, seq int64) *loopsv1.ForwardBackwardRequest {
	return &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: seq, LossFn: "importance_sampling",
		Data: []*loopsv1.Datum{rlDatum([]float32{0, -0.5, -0.25}, []float32{0, 1, 1})}}
}

func (h *harness) optim(run string, seq int64, lr float64) {
	h.t.Helper()
	op, err := h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: seq, Adam: &loopsv1.AdamParams{LearningRate: lr}})
	require.NoError(h.t, err)
	require.Equal(h.t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
}

func (h *harness) metrics(req *loopsv1.GetTrainingRunMetricsRequest) []*loopsv1.StepMetrics {
	h.t.Helper()
	resp, err := h.svc.Training.GetTrainingRunMetrics(h.ctx, req)
	require.NoError(h.t, err)
	return resp.GetSteps()
}

// TestRunMetricsRecorded: each forward_backward and optim_step of a run leaves a record
// (steps numbered by optimizer step), served with step ranges and downsampling, to the
// run's workspace only, and kept across a restart.
func TestRunMetricsRecorded(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, Options{})
	run := h.newRun()
	op, err := h.fb(run, 1, datum(1, 2, 3))
	require.NoError(t, err)
	h.wait(op)
	h.optim(run, 2, 1e-3)
	op, err = h.svc.Training.ForwardBackward(h.ctx, rlRequest(run, 3))
	require.NoError(t, err)
	h.wait(op)
	h.optim(run, 4, 5e-4)

	steps := h.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run})
	require.Len(t, steps, 4)
	fbKind, optKind := loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP
	for i, want := range []struct {
		kind       loopsv1.OperationKind
		seq, step  int64
		lossFn     string
		lossTokens int64
	}{{fbKind, 1, 1, "cross_entropy", 3}, {optKind, 2, 1, "", 0}, {fbKind, 3, 2, "importance_sampling", 2}, {optKind, 4, 2, "", 0}} {
		s := steps[i]
		require.Equal(t, want.kind, s.GetKind(), i)
		require.Equal(t, run, s.GetTrainingRunId())
		require.Equal(t, want.seq, s.GetSeqId(), i)
		require.Equal(t, want.step, s.GetStep(), i)
		require.Equal(t, want.lossFn, s.GetLossFn(), i)
		require.Equal(t, want.lossTokens, s.GetLossTokens(), i)
		require.EqualValues(t, 1, s.GetCount())
		require.NotNil(t, s.GetTime())
	}
	require.InDelta(t, 1e-3, steps[1].GetLearningRate(), 1e-12)
	require.InDelta(t, 5e-4, steps[3].GetLearningRate(), 1e-12)
	require.Nil(t, steps[0].GetRl())
	rl := steps[2].GetRl()
	require.InDelta(t, (-0.5-0.25)/2, rl.GetKlSampleTrainK1(), 1e-6) // k1 = mean(q - lp), lp = 0
	require.InDelta(t, (math.Exp(0.5)+math.Exp(0.25))/2, rl.GetRatioMean(), 1e-6)
	require.InDelta(t, 1, rl.GetAdvantageMean(), 1e-9)
	require.Zero(t, rl.GetZeroAdvantageFraction())

	// Step range and downsampling.
	require.Len(t, h.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run, FromStep: 2}), 2)
	require.Len(t, h.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run, ToStep: 1}), 2)
	merged := h.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run, MaxPoints: 1})
	require.Len(t, merged, 2)
	require.EqualValues(t, 2, merged[0].GetCount())
	require.EqualValues(t, 3, merged[0].GetLastSeqId())
	for _, bad := range []*loopsv1.GetTrainingRunMetricsRequest{
		{TrainingRunId: run, FromStep: -1}, {TrainingRunId: run, FromStep: 3, ToStep: 2}, {TrainingRunId: run, MaxPoints: -1},
	} {
		_, err := h.svc.Training.GetTrainingRunMetrics(h.ctx, bad)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), bad)
	}

	// Another workspace, and a run that does not exist: 404.
	_, err = h.svc.Training.GetTrainingRunMetrics(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Training.GetTrainingRunMetrics(h.ctx, &loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: "nope"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// A restart keeps the records and the step count.
	require.NoError(t, h.core.Close())
	h2 := newHarness(t, dir, Options{})
	again := h2.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run})
	require.Empty(t, cmp.Diff(steps, again, protocmp.Transform()))
	info, err := h2.svc.Training.GetTrainingRun(h2.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.EqualValues(t, 2, info.GetOptimSteps())
	op, err = h2.fb(run, 5, datum(1, 2))
	require.NoError(t, err)
	h2.wait(op)
	after := h2.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run, FromStep: 3})
	require.Len(t, after, 1)
	require.EqualValues(t, 3, after[0].GetStep())
}

// failingStore fails every ApplyBatch once held is set (after waiting at gate): records
// then reach only the journal.
type failingStore struct {
	store.Store
	held atomic.Bool
	gate chan struct{}
}

func (s *failingStore) ApplyBatch(ctx context.Context, b store.Batch) error {
	if s.held.Load() {
		<-s.gate
		return errors.New("store down")
	}
	return s.Store.ApplyBatch(ctx, b)
}

// TestRunMetricsSurviveACrash: a step's metrics are journaled with its outcome, so a crash
// before the store has them loses nothing: the next start replays them.
func TestRunMetricsSurviveACrash(t *testing.T) {
	dir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	st := &failingStore{Store: sq, gate: make(chan struct{})}
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	c.ops.persist.Settle(context.Background())
	st.held.Store(true)
	op, err := h.svc.Training.ForwardBackward(h.ctx, rlRequest(run, 1))
	require.NoError(t, err)
	h.wait(op)
	h.optim(run, 2, 1e-4)
	got, err := sq.ListStepMetrics(t.Context(), "ws-a", run, 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "not in the store")
	c.ops.persist.Crash()
	close(st.gate)
	_ = c.Close()
	require.NoError(t, sq.Close())

	h2 := newHarness(t, dir, Options{})
	steps := h2.metrics(&loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run})
	require.Len(t, steps, 2)
	require.Equal(t, "importance_sampling", steps[0].GetLossFn())
	require.InDelta(t, 1e-4, steps[1].GetLearningRate(), 1e-12)
}

// TestOptimStepMetrics: an optim_step's record carries the learning rate, and the gradient
// and update norms only when the backend reports them.
func TestOptimStepMetrics(t *testing.T) {
	m := optimStepMetrics(&loopsv1.AdamParams{LearningRate: 2e-4}, &loopsv1.OptimStepResult{Metrics: map[string]float64{
		"grad_norm:mean": 1.5, "update_norm:mean": 0.25, "learning_rate:mean": 2e-4}}, 3*time.Second)
	require.Equal(t, loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, m.GetKind())
	require.InDelta(t, 2e-4, m.GetLearningRate(), 1e-15)
	require.InDelta(t, 1.5, m.GetGradNorm(), 0)
	require.InDelta(t, 0.25, m.GetUpdateNorm(), 0)
	require.InDelta(t, 3, m.GetBackendSeconds(), 1e-12)
	m = optimStepMetrics(&loopsv1.AdamParams{LearningRate: 1e-3}, &loopsv1.OptimStepResult{}, 0)
	require.Nil(t, m.GradNorm)
	require.Nil(t, m.UpdateNorm)
}
