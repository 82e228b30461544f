package runhealth

import (
	"fmt"
	"math"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The thresholds of the rules.
const (
	// KLSampleTrainMax is the largest KL between the sampler's and the trainer's logprobs
	// of the sampled tokens (the k1 estimator's magnitude or k3) that a healthy RL step
	// shows. tinker-cookbook's RL guide asks for |kl_sample_train_v1| < 0.01 on every step
	// (its v1 is our k1): on-policy data sampled and scored by the same weights at
	// temperature 1 gives about 0.
	KLSampleTrainMax = 0.01
	// ZeroAdvantageMin is the share of examples with all-zero advantages at which an RL
	// batch counts as carrying no learning signal ("about 1": every group had equal
	// rewards).
	ZeroAdvantageMin = 0.99
	// ZeroAdvantageWindow is how many of the latest RL forward_backward records must all
	// be at or above ZeroAdvantageMin (or all of them, when a run has fewer): one batch of
	// equal rewards happens; several in a row mean the run has stopped learning.
	ZeroAdvantageWindow = 3
)

// Rule names an alert's rule; stable, for scripts and tests.
type Rule string

// The rules.
const (
	RuleKLSampleTrain Rule = "kl_sample_train"
	RuleZeroAdvantage Rule = "zero_advantage"
	RuleNonFinite     Rule = "non_finite"
)

// Alert is one rule that a run's records break.
type Alert struct {
	Rule Rule
	// Step is the optimizer step of the record that raised it.
	Step int64
	// Message says what was seen, with the numbers.
	Message string
	// Cause is one line on what usually causes it.
	Cause string
}

// String is "message: cause".
func (a Alert) String() string { return a.Message + " — " + a.Cause }

// The causes, one line each.
const (
	causeKL            = "off-policy data (samples from an older sampler than the weights being trained, e.g. an async loop or a stale sampling client) or a sampler/trainer mismatch (different temperature, base model, tokenizer, or logprobs not from the distribution that was sampled)"
	causeZeroAdvantage = "every group got equal rewards (all right or all wrong): the task is too easy or too hard for the model, the reward function is constant, or groups are too small; nothing is learned from such batches"
	causeNonFinite     = "divergence: a learning rate too high, no gradient clipping, extreme advantages or weights, or an importance ratio exp(lp - q) overflowing on sampler logprobs that do not match the sampled tokens"
)

// Check returns the alerts that a run's records raise, in rule order (non-finite values,
// then KL, then zero advantages). records are a run's step metrics oldest first, as
// GetTrainingRunMetrics returns them; pass the latest steps at full resolution (the KL and
// zero-advantage rules look at the newest RL records, so an alert clears once the run
// recovers). A run without RL records raises only the non-finite rule.
func Check(records []*loopsv1.StepMetrics) []Alert {
	var out []Alert
	if a, ok := nonFinite(records); ok {
		out = append(out, a)
	}
	var rl []*loopsv1.StepMetrics
	for _, m := range records {
		if m.GetKind() == loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD && m.GetRl() != nil {
			rl = append(rl, m)
		}
	}
	if len(rl) == 0 {
		return out
	}
	last := rl[len(rl)-1]
	if kl := KLOf(last.GetRl()); kl > KLSampleTrainMax || math.IsNaN(kl) {
		out = append(out, Alert{Rule: RuleKLSampleTrain, Step: last.GetStep(),
			Message: fmt.Sprintf("kl_sample_train %.3g at step %d is above %g (k1 %.3g, k3 %.3g)", kl, last.GetStep(), KLSampleTrainMax,
				last.GetRl().GetKlSampleTrainK1(), last.GetRl().GetKlSampleTrainK3()),
			Cause: causeKL})
	}
	window := rl[max(len(rl)-ZeroAdvantageWindow, 0):]
	zero := true
	for _, m := range window {
		if !(m.GetRl().GetZeroAdvantageFraction() >= ZeroAdvantageMin) {
			zero = false
			break
		}
	}
	if zero {
		out = append(out, Alert{Rule: RuleZeroAdvantage, Step: last.GetStep(),
			Message: fmt.Sprintf("zero-advantage share %.0f%% at step %d (at least %.0f%% in each of the last %d RL batches)",
				100*last.GetRl().GetZeroAdvantageFraction(), last.GetStep(), 100*ZeroAdvantageMin, len(window)),
			Cause: causeZeroAdvantage})
	}
	return out
}

// KLOf is the KL figure the KL rule compares with KLSampleTrainMax: the larger of |k1|
// and k3 (NaN when either is).
func KLOf(rl *loopsv1.RLStepMetrics) float64 {
	k1, k3 := rl.GetKlSampleTrainK1(), rl.GetKlSampleTrainK3()
	if math.IsNaN(k1) || math.IsNaN(k3) {
		return math.NaN()
	}
	return max(math.Abs(k1), k3)
}

// nonFinite finds the first record whose loss (sum or per-token mean) or gradient norm is
// NaN or infinite.
func nonFinite(records []*loopsv1.StepMetrics) (Alert, bool) {
	for _, m := range records {
		what, v := "", 0.0
		switch {
		case !finite(m.GetLossSum()):
			what, v = "loss", m.GetLossSum()
		case !finite(m.GetLossMean()):
			what, v = "loss", m.GetLossMean()
		case m.GradNorm != nil && !finite(m.GetGradNorm()):
			what, v = "gradient norm", m.GetGradNorm()
		default:
			continue
		}
		return Alert{Rule: RuleNonFinite, Step: m.GetStep(),
			Message: fmt.Sprintf("%s is %v at step %d", what, v, m.GetStep()),
			Cause:   causeNonFinite}, true
	}
	return Alert{}, false
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
