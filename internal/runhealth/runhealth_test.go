package runhealth

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func fb(step int64, loss float64) *loopsv1.StepMetrics {
	return &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, Step: step, LossSum: loss * 10, LossMean: loss, LossTokens: 10}
}

func rl(step int64, k1, k3, zero float64) *loopsv1.StepMetrics {
	m := fb(step, 0.5)
	m.LossFn = "importance_sampling"
	m.Rl = &loopsv1.RLStepMetrics{Tokens: 10, KlSampleTrainK1: k1, KlSampleTrainK3: k3, ZeroAdvantageFraction: zero}
	return m
}

func optim(step int64, grad float64) *loopsv1.StepMetrics {
	return &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, Step: step, LearningRate: proto.Float64(1e-4), GradNorm: proto.Float64(grad)}
}

func rules(t *testing.T, alerts []Alert) []Rule {
	t.Helper()
	var out []Rule
	for _, a := range alerts {
		out = append(out, a.Rule)
		require.NotEmpty(t, a.Cause)
		require.NotEmpty(t, a.Message)
	}
	return out
}

func TestHealthyRunsRaiseNothing(t *testing.T) {
	require.Empty(t, Check(nil))
	// SFT: losses falling, finite gradient norms.
	require.Empty(t, Check([]*loopsv1.StepMetrics{fb(1, 2.3), optim(1, 1.5), fb(2, 2.1), optim(2, 1.2)}))
	// RL on-policy: KL about 0 (k1 may be slightly negative), some groups with signal.
	require.Empty(t, Check([]*loopsv1.StepMetrics{rl(1, -0.002, 0.0001, 0.5), optim(1, 1), rl(2, 0.004, 0.0003, 1), optim(2, 1), rl(3, 0.001, 0.0001, 0.25)}))
	// Exactly at the KL threshold is still healthy.
	require.Empty(t, Check([]*loopsv1.StepMetrics{rl(1, KLSampleTrainMax, KLSampleTrainMax, 0)}))
}

func TestKLSampleTrain(t *testing.T) {
	// k3 above the threshold.
	a := Check([]*loopsv1.StepMetrics{rl(1, 0.001, 0.0001, 0), rl(2, 0.002, 0.05, 0)})
	require.Equal(t, []Rule{RuleKLSampleTrain}, rules(t, a))
	require.Equal(t, int64(2), a[0].Step)
	require.Contains(t, a[0].Message, "0.05")
	// A large negative k1 counts by its magnitude.
	require.Equal(t, []Rule{RuleKLSampleTrain}, rules(t, Check([]*loopsv1.StepMetrics{rl(4, -0.2, 0.001, 0)})))
	// Only the latest RL record counts: a run that recovered is clear.
	require.Empty(t, Check([]*loopsv1.StepMetrics{rl(1, 0.5, 0.3, 0), optim(1, 1), rl(2, 0.001, 0.0001, 0)}))
	// A NaN KL is flagged too.
	require.Contains(t, rules(t, Check([]*loopsv1.StepMetrics{rl(1, math.NaN(), 0, 0)})), RuleKLSampleTrain)
	require.True(t, math.IsNaN(KLOf(&loopsv1.RLStepMetrics{KlSampleTrainK3: math.NaN()})))
	require.InDelta(t, 0.3, KLOf(&loopsv1.RLStepMetrics{KlSampleTrainK1: -0.3, KlSampleTrainK3: 0.1}), 1e-15)
}

func TestZeroAdvantage(t *testing.T) {
	// Three RL batches in a row with every advantage zero.
	a := Check([]*loopsv1.StepMetrics{rl(1, 0, 0, 0.5), rl(2, 0, 0, 1), optim(2, 1), rl(3, 0, 0, 1), rl(4, 0, 0, 0.995)})
	require.Equal(t, []Rule{RuleZeroAdvantage}, rules(t, a))
	require.Equal(t, int64(4), a[0].Step)
	// One batch below the bound inside the window clears it.
	require.Empty(t, Check([]*loopsv1.StepMetrics{rl(2, 0, 0, 1), rl(3, 0, 0, 0.9), rl(4, 0, 0, 1)}))
	// A run with fewer RL records than the window: all of them count.
	require.Equal(t, []Rule{RuleZeroAdvantage}, rules(t, Check([]*loopsv1.StepMetrics{rl(1, 0, 0, 1)})))
	// Non-RL records do not break the window, and do not raise the rule by themselves.
	require.Empty(t, Check([]*loopsv1.StepMetrics{fb(1, 1), fb(2, 1)}))
}

func TestNonFinite(t *testing.T) {
	for name, series := range map[string][]*loopsv1.StepMetrics{
		"nan loss":      {fb(1, 2), optim(1, 1), fb(2, math.NaN())},
		"inf loss":      {fb(1, math.Inf(1))},
		"-inf mean":     {{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, Step: 3, LossSum: 1, LossMean: math.Inf(-1)}},
		"nan grad norm": {fb(1, 2), optim(1, math.NaN())},
	} {
		a := Check(series)
		require.Equal(t, []Rule{RuleNonFinite}, rules(t, a), name)
		require.Equal(t, series[len(series)-1].GetStep(), a[0].Step, name)
	}
	// The first bad record is reported, with the KL rule after it.
	a := Check([]*loopsv1.StepMetrics{fb(1, 1), fb(2, math.NaN()), fb(3, math.NaN()), rl(3, 1, 1, 0)})
	require.Equal(t, []Rule{RuleNonFinite, RuleKLSampleTrain}, rules(t, a))
	require.Equal(t, int64(2), a[0].Step)
	require.Equal(t, "loss is NaN at step 2", a[0].Message)
}
