package core

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func (h *harness) cancel(id string) *loopsv1.Operation {
	h.t.Helper()
	op, err := h.svc.Operations.CancelOperation(h.ctx, &loopsv1.CancelOperationRequest{Id: id})
	require.NoError(h.t, err)
	return op
}

// TestCancelQueuedRunningAndFinished: a queued forward/backward is removed without running
// (its seq_id consumed, the run goes on with the next one), a running one finishes with its
// result dropped, a finished one is unchanged; the cancelled state survives the operation
// leaving memory (it is read back from the store), and another workspace sees nothing.
func TestCancelQueuedRunningAndFinished(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 10)
	running, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	<-h.fake.entered
	queued, err := h.fb(run, 2, datum(1, 2, 3))
	require.NoError(t, err)
	after, err := h.fb(run, 3, datum(1, 2, 3, 4))
	require.NoError(t, err)

	got := h.cancel(queued.GetId())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, got.GetState(), "removed from the queue at once")
	require.Equal(t, int32(connect.CodeCanceled), got.GetError().GetCode())
	require.Contains(t, got.GetError().GetMessage(), "removed from its queue")
	require.NotNil(t, got.GetCancelTime())
	require.Nil(t, got.GetResult())

	got = h.cancel(running.GetId())
	require.NotEqual(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, got.GetState(), "a running one finishes first")
	require.NotNil(t, got.GetCancelTime())

	close(h.fake.gate)
	got = h.wait(running)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "result was dropped")
	require.Nil(t, got.GetForwardBackward(), "its result is dropped")
	done := h.wait(after)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), "the run did not stall on the cancelled seq_id")
	require.Equal(t, []int{1, 1}, h.fake.batches, "the cancelled queued one never reached the backend")

	got = h.cancel(after.GetId())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), "a finished one is unchanged")
	require.Nil(t, got.GetCancelTime())

	// A retry of the cancelled seq_id answers the cancelled operation.
	again, err := h.fb(run, 2, datum(1, 2, 3))
	require.NoError(t, err)
	require.Equal(t, queued.GetId(), again.GetId())

	// Out of memory, from the store.
	require.NoError(t, h.core.ops.flush(h.ctx))
	h.core.ops.evictFinishedBefore(time.Now().Add(time.Hour))
	for _, id := range []string{queued.GetId(), running.GetId()} {
		got, err := h.svc.Operations.GetOperation(h.ctx, &loopsv1.GetOperationRequest{Id: id})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, got.GetState())
		require.NotNil(t, got.GetCancelTime())
	}

	res, err := h.svc.Operations.BatchGetOperations(h.ctx, &loopsv1.BatchGetOperationsRequest{Ids: []string{queued.GetId(), after.GetId(), "op-missing"}})
	require.NoError(t, err)
	require.Len(t, res.GetResults(), 3)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, res.GetResults()[0].GetOperation().GetState())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, res.GetResults()[1].GetOperation().GetState())
	require.Empty(t, res.GetResults()[1].GetOperation().GetForwardBackward().GetOutputs(), "no large results in a batch")
	require.Equal(t, int32(connect.CodeNotFound), res.GetResults()[2].GetError().GetCode())

	// Another workspace: every id is not found, and it cannot cancel.
	other := auth.WithWorkspace(t.Context(), "ws-b")
	res, err = h.svc.Operations.BatchGetOperations(other, &loopsv1.BatchGetOperationsRequest{Ids: []string{queued.GetId(), after.GetId(), "op-missing"}})
	require.NoError(t, err)
	for _, r := range res.GetResults() {
		require.Nil(t, r.GetOperation())
		require.Equal(t, int32(connect.CodeNotFound), r.GetError().GetCode())
	}
	_, err = h.svc.Operations.CancelOperation(other, &loopsv1.CancelOperationRequest{Id: after.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

// TestCancelQueuedHeadOfAReadyRun: a cancelled task that was the head of a run waiting in
// its lane is skipped, and the run's next task runs.
func TestCancelQueuedHeadOfAReadyRun(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	runs := []string{h.newRun(), h.newRun()}
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 10)
	first, err := h.fb(runs[0], 1, datum(1, 2))
	require.NoError(t, err)
	<-h.fake.entered // the lane's one batch runs; runs[1] waits in the ready list
	head, err := h.fb(runs[1], 1, datum(1, 2))
	require.NoError(t, err)
	next, err := h.fb(runs[1], 2, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, h.cancel(head.GetId()).GetState())
	close(h.fake.gate)
	h.wait(first)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(next).GetState())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_CANCELLED, h.wait(head).GetState())
}

func TestBatchGetOperationsBounds(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	_, err := h.svc.Operations.BatchGetOperations(h.ctx, &loopsv1.BatchGetOperationsRequest{})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	ids := make([]string, MaxBatchGet+1)
	for i := range ids {
		ids[i] = "op-" + string(rune('a'+i%26)) + time.Duration(i).String()
	}
	_, err = h.svc.Operations.BatchGetOperations(h.ctx, &loopsv1.BatchGetOperationsRequest{Ids: ids})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "more than 100")
	_, err = h.svc.Operations.BatchGetOperations(h.ctx, &loopsv1.BatchGetOperationsRequest{Ids: []string{"op-x", "op-x"}})
	require.ErrorContains(t, err, "twice")
	_, err = h.svc.Operations.CancelOperation(h.ctx, &loopsv1.CancelOperationRequest{})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
}
