package runcost_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/runcost"
)

// TestOf: the run's storage rows, its session's rows of no run and its pool's rows are
// summed apart, exactly; other runs', sessions' and kinds' rows add nothing.
func TestOf(t *testing.T) {
	b := func(kind loopsv1.UsageKind, session, run, cost string) *loopsv1.UsageBucket {
		u := &loopsv1.UsageBucket{Kind: kind, SessionId: session, TrainingRunId: run, Amount: 1, CostUsd: cost}
		if cost != "" {
			u.PricedAmount = 1
		}
		return u
	}
	const storage = loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS
	c := runcost.Of([]*loopsv1.UsageBucket{
		b(storage, "s1", "run-1", "0.000084931507"), b(storage, "s1", "run-1", "0.000000235921"), b(storage, "s1", "run-2", "1"),
		b(storage, "s1", "", "0.000042465753"), b(storage, "s2", "", "2"),
		b(loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, "s1", "", "1"), b(storage, "s1", "run-1", ""),
		b(loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS, "s1", "run-1", "3"),
		b(loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS, "s1", "run-1", "0.25"),
		b(loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS, "s1", "run-2", "7"),
	}, "run-1", "s1")
	require.Equal(t, "0.000085167428", c.Storage.Cost.String())
	require.Equal(t, [2]int64{3, 2}, [2]int64{c.Storage.Amount, c.Storage.Priced}, "one row unpriced")
	require.Equal(t, "0.000042465753", c.SessionStorage.Cost.String())
	require.Equal(t, "3.25", c.Pool.Cost.String())
	require.NoError(t, c.Storage.Err)
	c = runcost.Of([]*loopsv1.UsageBucket{b(storage, "", "", "1"), b(storage, "", "run-1", "2")}, "run-1", "")
	require.Equal(t, [2]string{"2", "0"}, [2]string{c.Storage.Cost.String(), c.SessionStorage.Cost.String()}, "a run of no session has no session rows")
}
