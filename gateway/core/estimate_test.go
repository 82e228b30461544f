package core

import (
	"testing"

	"connectrpc.com/connect"
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

// FuzzEstimateUsage: any usage lines are either refused with InvalidArgument or come back
// in UsageKind order with low <= amount <= high, each at most 2^53 (no sum of them wraps).
func FuzzEstimateUsage(f *testing.F) {
	f.Add(int32(1), int64(100), int64(90), int64(120), int32(3), int64(5), int64(0), int64(0))
	f.Add(int32(7), int64(1<<53), int64(0), int64(1<<53), int32(7), int64(1), int64(1), int64(1))
	f.Add(int32(4), int64(-1), int64(5), int64(2), int32(99), int64(0), int64(-3), int64(1<<62))
	f.Fuzz(func(t *testing.T, k0 int32, n0, lo0, hi0 int64, k1 int32, n1, lo1, hi1 int64) {
		req := &loopsv1.EstimateCostRequest{BaseModel: "m", Usage: []*loopsv1.UsageEstimate{
			{Kind: loopsv1.UsageKind(k0), Amount: n0, AmountLow: lo0, AmountHigh: hi0},
			{Kind: loopsv1.UsageKind(k1), Amount: n1, AmountLow: lo1, AmountHigh: hi1},
		}}
		out, err := estimateAmounts(req)
		if err != nil {
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
			return
		}
		require.Len(t, out, 2)
		require.Less(t, usageKinds[out[0].kind], usageKinds[out[1].kind])
		for _, a := range out {
			require.True(t, 0 <= a.low && a.low <= a.n && a.n <= a.high && a.high <= 1<<53, a)
		}
	})
}
