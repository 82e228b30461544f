package core

import (
	"math"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/core/sequencer"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// TestRepeatedSeqIDOfAnotherKindIsRefused: an optim_step at a seq_id a forward_backward
// already used must not resolve to the forward_backward's operation (the step would
// silently never run).
func TestRepeatedSeqIDOfAnotherKindIsRefused(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	fb, err := h.fb(run, 1, datum(1, 2, 3))
	require.NoError(t, err)
	adam := &loopsv1.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
	_, err = h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 1, Adam: adam})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "seq_id 1 of training run "+run+" was already used by a forward_backward request; this optim_step needs a seq_id of its own")
	// A forward-only pass is another kind too.
	_, err = h.svc.Training.ForwardBackward(h.ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: 1, ForwardOnly: true, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 2, 3)}})
	require.ErrorContains(t, err, "this forward needs a seq_id of its own")
	// The same kind still de-duplicates, and the run goes on at the next seq_id.
	again, err := h.fb(run, 1, datum(1, 2, 3))
	require.NoError(t, err)
	require.Equal(t, fb.GetId(), again.GetId())
	step, err := h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 2, Adam: adam})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(step).GetState())
	require.Equal(t, []string{run, "optim:" + run}, h.fake.calls)
}

// TestSeqIDRange: seq_ids beyond sequencer.MaxSeqID are refused, so a later "next seq_id" (seq_id 0)
// can never overflow into a negative number that would wedge the run.
func TestSeqIDRange(t *testing.T) {
	// MaxSeqID leaves a gap after the run's first seq_ids: skip it quickly.
	h := newHarness(t, t.TempDir(), Options{GapTimeout: 20 * time.Millisecond})
	run := h.newRun()
	for _, seq := range []int64{math.MaxInt64, sequencer.MaxSeqID + 1, -1, math.MinInt64} {
		_, err := h.fb(run, seq, datum(1, 2))
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "seq_id %d", seq)
		require.ErrorContains(t, err, "out of range: use 0 to 4611686018427387904")
	}
	// The largest allowed seq_id works, and the run is not wedged afterwards: seq_id 0 (the
	// next one) is refused with a clear reason instead of overflowing.
	op, err := h.fb(run, sequencer.MaxSeqID, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	_, err = h.fb(run, 0, datum(1, 2))
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "has used every seq_id")
	// Sampling seq_ids are range-checked the same way.
	_, err = h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: "x", SeqId: ptr(int64(math.MaxInt64)), Prompt: []int32{1}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
}
