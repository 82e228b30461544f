package core

import (
	"context"
	"testing"
	"time"

	"github.com/loops-dev/loops/gateway/core/writebehind"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestFinishedOperationsLeaveMemoryButStayRetrievable: a finished operation leaves memory
// after finishedInMemory, and is still answered in full (its record from the store, its
// per-token outputs from the result cache).
func TestFinishedOperationsLeaveMemoryButStayRetrievable(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	op, err := h.fb(run, 0, datum(1, 2, 3))
	require.NoError(t, err)
	done := h.wait(op)
	require.NotEmpty(t, done.GetForwardBackward().GetOutputs())
	require.NoError(t, h.core.ops.persist.Sync(context.Background())) // its records (the retrieval too) are committed (write-behind)
	stored, err := h.core.store.(writebehind.ReadStore).Store.GetOperation(h.ctx, "ws-a", op.GetId())
	require.NoError(t, err)
	require.True(t, isDone(stored))

	h.core.ops.evictFinishedBefore(h.core.now().Add(finishedInMemory))
	h.core.ops.mu.Lock()
	_, inMemory := h.core.ops.byID[op.GetId()]
	h.core.ops.mu.Unlock()
	require.False(t, inMemory)

	again, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Second)})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, again.GetState())
	require.Equal(t, len(done.GetForwardBackward().GetOutputs()), len(again.GetForwardBackward().GetOutputs()))
}
