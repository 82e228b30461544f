package core

import (
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzEstimateAmounts: any request either is refused with InvalidArgument or gives
// non-negative token counts; none panics or wraps around.
func FuzzEstimateAmounts(f *testing.F) {
	f.Add(int64(3), int64(2), int64(12), int64(9), false, int64(0), int64(0), int64(0), int64(0))
	f.Add(int64(1_000_000), int64(100_000), int64(1<<20), int64(1<<20), true, int64(1024), int64(1<<20), int64(16), int64(10_000_000))
	f.Add(int64(-1), int64(0), int64(-5), int64(0), true, int64(-1), int64(-1), int64(-1), int64(-1))
	f.Fuzz(func(t *testing.T, steps, batch, t0, t1 int64, rl bool, group, completion, passes, evals int64) {
		req := &loopsv1.EstimateCostRequest{BaseModel: "m", Steps: steps, BatchSize: batch, Passes: passes,
			EvalRequests: evals, EvalPromptTokens: t1, CompletionTokens: completion, GroupSize: group}
		if rl {
			req.PromptTokens = []int64{t0, t1}
		} else {
			req.ExampleTokens = []int64{t0, t1}
		}
		out, err := estimateAmounts(req)
		if err != nil {
			return
		}
		for _, a := range out {
			require.Positive(t, a.n, a.kind)
		}
	})
}

// TestEstimateAmountsOverflow: a run too large for int64 is refused, not wrapped.
func TestEstimateAmountsOverflow(t *testing.T) {
	_, err := estimateAmounts(&loopsv1.EstimateCostRequest{BaseModel: "m", Steps: 1_000_000, BatchSize: 100_000,
		PromptTokens: []int64{1 << 20}, GroupSize: 1024, CompletionTokens: 1 << 20})
	require.ErrorContains(t, err, "too large to estimate")
}
