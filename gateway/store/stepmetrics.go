package store

import (
	"math"
	"sync"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// The bound on a run's step metrics (docs/semantics.md, "Run metrics"). ApplyBatch keeps
// every record until a run has more than MaxStepMetricsPerRun; it then replaces the run's
// oldest StepMetricsCompactWindow records by CompactStepMetrics of them (consecutive
// records of the same kind merged in pairs) until it has no more: the newest steps are
// kept one by one, older ones merged, the oldest the most. A store counts a run's records
// only when StepMetricsCheck says so (on the run's first write by the process, then once
// every StepMetricsCheckEvery records), so a run holds at most MaxStepMetricsPerRun +
// StepMetricsCheckEvery records.
const (
	MaxStepMetricsPerRun     = 2048
	StepMetricsCompactWindow = 1024
	StepMetricsCheckEvery    = 64
)

// StepMetricsCheck tells a store when to count a run's step metrics (the count is what
// costs; a write is cheap). The zero value is ready to use and safe for concurrent use.
type StepMetricsCheck struct {
	mu    sync.Mutex
	since map[string]int // records written per run since its last count
}

// Due records that n more records of the run are being written and reports whether the
// store should count the run's records now: on the run's first write seen by this process,
// and then once every StepMetricsCheckEvery records. (Memory stays bounded: past 10,000 runs
// the record is reset, and each run is counted again at its next write.)
func (c *StepMetricsCheck) Due(runID string, n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since == nil || len(c.since) > 10000 {
		c.since = map[string]int{}
	}
	s, seen := c.since[runID]
	if !seen || s+n >= StepMetricsCheckEvery {
		c.since[runID] = 0
		return true
	}
	c.since[runID] = s + n
	return false
}

// CompactStepMetrics merges records (oldest first) in pairs: each record with the next
// record of the same kind (MergeStepMetrics). The result is oldest first; a record left
// without a partner is kept as it is.
func CompactStepMetrics(records []*loopsv1.StepMetrics) []*loopsv1.StepMetrics {
	out := make([]*loopsv1.StepMetrics, 0, len(records)/2+2)
	pending := map[loopsv1.OperationKind]int{} // kind -> index in out of an unpaired record
	for _, m := range records {
		if i, ok := pending[m.GetKind()]; ok {
			out[i] = MergeStepMetrics(out[i], m)
			delete(pending, m.GetKind())
			continue
		}
		pending[m.GetKind()] = len(out)
		out = append(out, m)
	}
	return out
}

// DownsampleStepMetrics merges records (oldest first) in pairs (CompactStepMetrics) until
// no kind has more than maxPoints records; maxPoints <= 0 means no limit.
func DownsampleStepMetrics(records []*loopsv1.StepMetrics, maxPoints int) []*loopsv1.StepMetrics {
	if maxPoints <= 0 {
		return records
	}
	for {
		counts := map[loopsv1.OperationKind]int{}
		over := false
		for _, m := range records {
			counts[m.GetKind()]++
			if counts[m.GetKind()] > maxPoints {
				over = true
			}
		}
		if !over {
			return records
		}
		records = CompactStepMetrics(records)
	}
}

// stepCount is how many operations a record covers (a record that does not say covers one).
func stepCount(m *loopsv1.StepMetrics) int64 { return max(m.GetCount(), 1) }

func lastSeq(m *loopsv1.StepMetrics) int64 { return max(m.GetLastSeqId(), m.GetSeqId()) }

func lastStep(m *loopsv1.StepMetrics) int64 { return max(m.GetLastStep(), m.GetStep()) }

// MergeStepMetrics returns the record of a followed by b (two consecutive records of one
// kind of a run): sums (loss, tokens, examples, backend time, count) are added, means and
// spreads are weighted by the tokens (RL signals), examples (zero-advantage share) or
// operations (learning rate, gradient norm) they cover, minimums and maximums combined;
// seq_id and step are a's, last_seq_id, last_step and time b's. a and b are not changed.
func MergeStepMetrics(a, b *loopsv1.StepMetrics) *loopsv1.StepMetrics {
	m := &loopsv1.StepMetrics{
		Kind: a.GetKind(), SeqId: a.GetSeqId(), LastSeqId: lastSeq(b), Step: a.GetStep(), LastStep: lastStep(b),
		Count: stepCount(a) + stepCount(b), Time: b.GetTime(),
		BackendSeconds: a.GetBackendSeconds() + b.GetBackendSeconds(),
		LossSum:        a.GetLossSum() + b.GetLossSum(),
		Tokens:         a.GetTokens() + b.GetTokens(),
		LossTokens:     a.GetLossTokens() + b.GetLossTokens(),
		Examples:       a.GetExamples() + b.GetExamples(),
	}
	if a.GetLossFn() == b.GetLossFn() {
		m.LossFn = a.GetLossFn()
	}
	if m.LossTokens > 0 {
		m.LossMean = m.LossSum / float64(m.LossTokens)
	}
	ca, cb := float64(stepCount(a)), float64(stepCount(b))
	m.LearningRate = mergeOptional(a.LearningRate, b.LearningRate, ca, cb)
	m.GradNorm = mergeOptional(a.GradNorm, b.GradNorm, ca, cb)
	m.UpdateNorm = mergeOptional(a.UpdateNorm, b.UpdateNorm, ca, cb)
	m.Rl = mergeRL(a.GetRl(), b.GetRl(), float64(a.GetExamples()), float64(b.GetExamples()))
	m.CostUsd = addCosts(a.GetCostUsd(), b.GetCostUsd())
	return m
}

// addCosts adds two decimal USD costs exactly; an empty one (unpriced) adds nothing, and
// both empty stay empty. A sum that cannot be made exactly (a malformed record, an
// overflow) is empty rather than wrong.
func addCosts(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	x, err := money.ParseUSD(a, money.Digits)
	if err != nil {
		return ""
	}
	y, err := money.ParseUSD(b, money.Digits)
	if err != nil {
		return ""
	}
	s, err := money.Add(x, y)
	if err != nil {
		return ""
	}
	return s.String()
}

// mergeOptional is the weighted mean of two optional values (either one when the other is
// unset).
func mergeOptional(x, y *float64, wx, wy float64) *float64 {
	switch {
	case x == nil && y == nil:
		return nil
	case x == nil:
		return proto.Float64(*y)
	case y == nil:
		return proto.Float64(*x)
	}
	return proto.Float64(weighted(*x, *y, wx, wy))
}

func weighted(x, y, wx, wy float64) float64 {
	if wx+wy == 0 {
		return (x + y) / 2
	}
	return (x*wx + y*wy) / (wx + wy)
}

// pooledStd is the standard deviation of the union of two samples of sizes wx, wy with
// means mx, my and standard deviations sx, sy.
func pooledStd(mx, sx, wx, my, sy, wy float64) float64 {
	if wx+wy == 0 {
		return 0
	}
	mean := weighted(mx, my, wx, wy)
	v := (wx*(sx*sx+mx*mx)+wy*(sy*sy+my*my))/(wx+wy) - mean*mean
	return math.Sqrt(max(v, 0))
}

func mergeRL(a, b *loopsv1.RLStepMetrics, exA, exB float64) *loopsv1.RLStepMetrics {
	switch {
	case a == nil && b == nil:
		return nil
	case a == nil:
		return proto.CloneOf(b)
	case b == nil:
		return proto.CloneOf(a)
	}
	wa, wb := float64(a.GetTokens()), float64(b.GetTokens())
	m := &loopsv1.RLStepMetrics{
		Tokens:                a.GetTokens() + b.GetTokens(),
		KlSampleTrainK1:       weighted(a.GetKlSampleTrainK1(), b.GetKlSampleTrainK1(), wa, wb),
		KlSampleTrainK3:       weighted(a.GetKlSampleTrainK3(), b.GetKlSampleTrainK3(), wa, wb),
		RatioMean:             weighted(a.GetRatioMean(), b.GetRatioMean(), wa, wb),
		RatioStd:              pooledStd(a.GetRatioMean(), a.GetRatioStd(), wa, b.GetRatioMean(), b.GetRatioStd(), wb),
		AdvantageMean:         weighted(a.GetAdvantageMean(), b.GetAdvantageMean(), wa, wb),
		AdvantageStd:          pooledStd(a.GetAdvantageMean(), a.GetAdvantageStd(), wa, b.GetAdvantageMean(), b.GetAdvantageStd(), wb),
		ZeroAdvantageFraction: weighted(a.GetZeroAdvantageFraction(), b.GetZeroAdvantageFraction(), exA, exB),
		ClipFraction:          mergeOptional(a.ClipFraction, b.ClipFraction, wa, wb),
	}
	switch {
	case wa == 0:
		m.RatioMin, m.RatioMax = b.GetRatioMin(), b.GetRatioMax()
	case wb == 0:
		m.RatioMin, m.RatioMax = a.GetRatioMin(), a.GetRatioMax()
	default:
		m.RatioMin, m.RatioMax = min(a.GetRatioMin(), b.GetRatioMin()), max(a.GetRatioMax(), b.GetRatioMax())
	}
	return m
}
