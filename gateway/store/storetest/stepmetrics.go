package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// stepRecords returns the records of n steps of a run: a forward_backward at seq 2k-1 and
// an optim_step at seq 2k for step k = 1..n.
func stepRecords(ws, runID string, n int) []store.OwnedStepMetrics {
	var out []store.OwnedStepMetrics
	for k := int64(1); k <= int64(n); k++ {
		out = append(out,
			store.OwnedStepMetrics{Workspace: ws, RunID: runID, Metrics: &loopsv1.StepMetrics{
				Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, SeqId: 2*k - 1, Step: k, Count: 1,
				Time: ts(time.Duration(k) * time.Second), LossFn: "cross_entropy",
				LossSum: float64(k), LossTokens: 10, LossMean: float64(k) / 10, Tokens: 12, Examples: 2, BackendSeconds: 0.5,
			}},
			store.OwnedStepMetrics{Workspace: ws, RunID: runID, Metrics: &loopsv1.StepMetrics{
				Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, SeqId: 2 * k, Step: k, Count: 1,
				Time: ts(time.Duration(k) * time.Second), LearningRate: proto.Float64(1e-4),
			}})
	}
	return out
}

// testStepMetrics: ApplyBatch writes step metrics with the batch, ListStepMetrics lists
// them oldest first by step range, another workspace sees none, a record is replaced by
// one with the same seq_id, and the run's records stay within the bound, downsampled.
func testStepMetrics(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	recs := stepRecords(wsA, "r1", 3)
	require.NoError(t, st.ApplyBatch(ctx, store.Batch{
		TrainingRuns: []store.OwnedTrainingRun{{Workspace: wsA, Run: trainingRun("r1", 0)}},
		StepMetrics:  recs,
	}))
	got, err := st.ListStepMetrics(ctx, wsA, "r1", 0, 0)
	require.NoError(t, err)
	want := make([]*loopsv1.StepMetrics, len(recs))
	for i, r := range recs {
		want[i] = r.Metrics
	}
	requireProtoEqual(t, want, got)

	got, err = st.ListStepMetrics(ctx, wsA, "r1", 2, 2)
	require.NoError(t, err)
	requireProtoEqual(t, want[2:4], got)
	got, err = st.ListStepMetrics(ctx, wsA, "r1", 3, 0)
	require.NoError(t, err)
	requireProtoEqual(t, want[4:], got)

	got, err = st.ListStepMetrics(ctx, wsB, "r1", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "another workspace's run has no metrics")
	got, err = st.ListStepMetrics(ctx, wsA, "nope", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got)

	// The same seq_id again (a journal replay): replaced, not doubled.
	again := proto.CloneOf(recs[0].Metrics)
	again.LossSum = 42
	require.NoError(t, st.ApplyBatch(ctx, store.Batch{StepMetrics: []store.OwnedStepMetrics{{Workspace: wsA, RunID: "r1", Metrics: again}}}))
	got, err = st.ListStepMetrics(ctx, wsA, "r1", 1, 1)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.StepMetrics{again, want[1]}, got)

	// A record without a run id or seq_id fails the batch.
	require.Error(t, st.ApplyBatch(ctx, store.Batch{StepMetrics: []store.OwnedStepMetrics{{Workspace: wsA, RunID: "r1", Metrics: &loopsv1.StepMetrics{}}}}))
}

// testStepMetricsBound: a run never holds more than MaxStepMetricsPerRun records; the
// newest are kept one by one, older ones merged (CompactStepMetrics) with their sums kept,
// and a replayed record that a merged one covers is dropped.
func testStepMetricsBound(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	const steps = store.MaxStepMetricsPerRun // 2 records per step: twice the bound
	all := stepRecords(wsA, "r1", steps)
	other := stepRecords(wsA, "r2", 2)
	for i := 0; i < len(all); i += 500 {
		b := store.Batch{StepMetrics: all[i:min(i+500, len(all))]}
		if i == 0 {
			b.StepMetrics = slices.Concat(b.StepMetrics, other)
		}
		require.NoError(t, st.ApplyBatch(ctx, b))
	}
	got, err := st.ListStepMetrics(ctx, wsA, "r1", 0, 0)
	require.NoError(t, err)
	require.LessOrEqual(t, len(got), store.MaxStepMetricsPerRun+store.StepMetricsCheckEvery)
	require.Greater(t, len(got), store.MaxStepMetricsPerRun/2)

	// Together the records cover every operation once, in order, and keep the sums.
	var (
		count, prev int64
		lossSum     float64
		wantSum     float64
		nextSeq     = map[loopsv1.OperationKind]int64{}
	)
	for _, r := range all {
		wantSum += r.Metrics.GetLossSum()
	}
	for _, m := range got {
		count += max(m.GetCount(), 1)
		lossSum += m.GetLossSum()
		require.Greater(t, m.GetSeqId(), prev, "records are oldest first")
		prev = m.GetSeqId()
		require.GreaterOrEqual(t, m.GetSeqId(), nextSeq[m.GetKind()], "records of one kind do not overlap")
		nextSeq[m.GetKind()] = max(m.GetLastSeqId(), m.GetSeqId()) + 1
	}
	require.Equal(t, int64(len(all)), count)
	require.InDelta(t, wantSum, lossSum, 1e-6)
	// The newest steps are kept one by one.
	last := got[len(got)-1]
	requireProtoEqual(t, all[len(all)-1].Metrics, last)
	require.Greater(t, got[0].GetCount(), int64(1), "the oldest records are merged")

	// A record that a merged one covers (a journal replay) is not written again.
	require.NoError(t, st.ApplyBatch(ctx, store.Batch{StepMetrics: all[2:3]}))
	again, err := st.ListStepMetrics(ctx, wsA, "r1", 0, 0)
	require.NoError(t, err)
	requireProtoEqual(t, got, again)

	// Another run is untouched.
	got2, err := st.ListStepMetrics(ctx, wsA, "r2", 0, 0)
	require.NoError(t, err)
	require.Len(t, got2, 4)
}
