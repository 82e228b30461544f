package sqlite_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// BenchmarkApplyBatchStep is the persister's batch for one finished step: the operation's
// final record (created in an earlier batch) and its run's bookkeeping, in one transaction.
func BenchmarkApplyBatchStep(b *testing.B) {
	ctx := b.Context()
	s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "loops.db"))
	require.NoError(b, err)
	defer s.Close()
	now := timestamppb.New(time.Now())
	run := &loopsv1.TrainingRun{Id: "run-1", SessionId: "s-1", BaseModel: "loops/tiny", CreateTime: now}
	require.NoError(b, s.PutTrainingRun(ctx, "ws", run))
	b.ResetTimer()
	for i := range b.N {
		op := &loopsv1.Operation{Id: fmt.Sprintf("op-%d", i), Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP,
			TrainingRunId: "run-1", SeqId: int64(i), CreateTime: now, State: loopsv1.OperationState_OPERATION_STATE_PENDING}
		require.NoError(b, s.ApplyBatch(ctx, store.Batch{Operations: []store.OwnedOperation{{Workspace: "ws", Operation: op}}}))
		op.State, op.DoneTime = loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, now
		run.LastSeqId = int64(i)
		require.NoError(b, s.ApplyBatch(ctx, store.Batch{
			TrainingRuns: []store.OwnedTrainingRun{{Workspace: "ws", Run: run}},
			Operations:   []store.OwnedOperation{{Workspace: "ws", Operation: op}},
		}))
	}
}
