package core

import (
	"testing"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// TestAnswerOfFinishedWorkHasItsResult: a request whose work has finished by the time it
// is answered (a retry of a seq_id, or work faster than the answer under load) gets the
// operation with its full result, never the small copy memory holds (a SUCCEEDED sample
// without its sequences, a forward_backward without its outputs, which the OpenAI routes
// once answered as an empty completion and a null embedding).
func TestAnswerOfFinishedWorkHasItsResult(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	fb, err := h.fb(run, 1, datum(1, 2, 3))
	require.NoError(t, err)
	require.Len(t, h.wait(fb).GetForwardBackward().GetOutputs(), 1)
	again, err := h.fb(run, 1, datum(1, 2, 3))
	require.NoError(t, err)
	require.Equal(t, fb.GetId(), again.GetId())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, again.GetState())
	require.Len(t, again.GetForwardBackward().GetOutputs(), 1, "the retry's answer holds the outputs")

	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
	require.NoError(t, err)
	req := &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1, 2}, NumSamples: 2, SeqId: ptr(int64(1))}
	op, err := h.svc.Sampling.Sample(h.ctx, req)
	require.NoError(t, err)
	require.Len(t, h.wait(op).GetSample().GetSequences(), 2)
	again, err = h.svc.Sampling.Sample(h.ctx, req)
	require.NoError(t, err)
	require.Equal(t, op.GetId(), again.GetId())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, again.GetState())
	require.Len(t, again.GetSample().GetSequences(), 2, "the retry's answer holds the sequences")
}
