package trainrun

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestRunBeingCreatedStaysInMemory: a run whose creation task is not queued yet is never
// evictable, however long idle; once its creation task is committed (or the run fails) the
// usual rules apply.
func TestRunBeingCreatedStaysInMemory(t *testing.T) {
	for _, end := range []string{"commit", "fail"} {
		r := New(Config[int]{Workspace: "ws", Record: &loopsv1.TrainingRun{Id: "run-1"}, MaxPending: 4, Creating: true, Ready: func(*Run[int]) {}})
		require.False(t, r.Evictable(time.Hour, time.Millisecond, time.Millisecond), "being created")
		switch end {
		case "commit":
			seq, err := r.Admit(0, loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN)
			require.NoError(t, err)
			require.NoError(t, r.Commit(loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN, "op", &Task[int]{Seq: seq.Seq, Creates: true}))
			require.False(t, r.Evictable(time.Hour, time.Millisecond, time.Millisecond), "its creation is queued")
		case "fail":
			r.Fail("creating it failed")
			require.True(t, r.Evictable(time.Hour, time.Millisecond, time.Millisecond), "a failed run leaves memory once idle")
		}
	}
	r := New(Config[int]{Workspace: "ws", Record: &loopsv1.TrainingRun{Id: "run-2"}, MaxPending: 4, Ready: func(*Run[int]) {}})
	require.True(t, r.Evictable(time.Hour, time.Millisecond, time.Millisecond), "a run reloaded without its adapter leaves once idle")
}
