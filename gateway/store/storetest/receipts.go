package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// receiptSteps returns n receipt steps of a run at seq 1..n.
func receiptSteps(ws, runID string, n int) []store.OwnedReceiptStep {
	var out []store.OwnedReceiptStep
	for k := int64(1); k <= int64(n); k++ {
		out = append(out, store.OwnedReceiptStep{Workspace: ws, Step: &loopsv1.ReceiptStep{
			TrainingRunId: runID, SeqId: k, Step: k, Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD,
			LossFn: "cross_entropy", LossFnConfig: map[string]float64{"x": 0.5}, Loss: proto.Float64(float64(k) / 3),
			BatchSha256: "sha256:00", Examples: 2, Tokens: 24, DataRecorded: k%2 == 0, Time: ts(time.Duration(k) * time.Second),
		}})
	}
	return out
}

// testReceiptSteps: ApplyBatch writes receipt steps with the batch (with its operations,
// in one transaction), ListReceiptSteps pages them in seq_id order with the run's count,
// another workspace sees none, a step is replaced by one with the same seq_id, and they
// survive reopening the store.
func testReceiptSteps(t *testing.T, open Opener) {
	ctx := t.Context()
	path := newPath(t)
	first := open(t, path)
	steps := receiptSteps(wsA, "r1", 5)
	require.NoError(t, first.ApplyBatch(ctx, store.Batch{
		TrainingRuns: []store.OwnedTrainingRun{{Workspace: wsA, Run: trainingRun("r1", 0)}},
		Operations:   []store.OwnedOperation{{Workspace: wsA, Operation: operation("op1", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)}},
		// out of order, as groups of several runs may be
		ReceiptSteps: []store.OwnedReceiptStep{steps[3], steps[0], steps[4], steps[1], steps[2]},
	}))
	// A journal replay of a step replaces it.
	replaced := proto.CloneOf(steps[2].Step)
	replaced.Loss = proto.Float64(7)
	require.NoError(t, first.ApplyBatch(ctx, store.Batch{ReceiptSteps: []store.OwnedReceiptStep{{Workspace: wsA, Step: replaced}}}))
	require.NoError(t, first.Close())

	st := openAt(t, open, path)
	want := []*loopsv1.ReceiptStep{steps[0].Step, steps[1].Step, replaced, steps[3].Step, steps[4].Step}
	got, n, err := st.ListReceiptSteps(ctx, wsA, "r1", 0, 0)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	requireProtoEqual(t, want, got)
	got, n, err = st.ListReceiptSteps(ctx, wsA, "r1", 2, 2)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	requireProtoEqual(t, want[1:3], got)
	got, _, err = st.ListReceiptSteps(ctx, wsA, "r1", 6, 10)
	require.NoError(t, err)
	require.Empty(t, got)

	got, n, err = st.ListReceiptSteps(ctx, wsB, "r1", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got)
	require.Zero(t, n)
	got, _, err = st.ListReceiptSteps(ctx, wsA, "r2", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got)

	// A step without its run or seq_id fails the whole batch.
	bad := proto.CloneOf(steps[0].Step)
	bad.SeqId = 0
	require.Error(t, st.ApplyBatch(ctx, store.Batch{
		Operations:   []store.OwnedOperation{{Workspace: wsA, Operation: operation("op2", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)}},
		ReceiptSteps: []store.OwnedReceiptStep{{Workspace: wsA, Step: bad}},
	}))
	_, err = st.GetOperation(ctx, wsA, "op2")
	require.ErrorIs(t, err, store.ErrNotFound)
}
