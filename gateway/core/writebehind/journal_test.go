package writebehind

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestJournalReplayStopsAtTornRecord: a journal file whose last record was torn (an OS crash
// in the middle of a write) replays the records before it; files replay oldest first, so a
// later record of the same id wins.
func TestJournalReplayStopsAtTornRecord(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir)
	require.NoError(t, err)
	op := func(id string, state loopsv1.OperationState) store.OwnedOperation {
		return store.OwnedOperation{Workspace: "ws-a", Operation: &loopsv1.Operation{Id: id, State: state, TrainingRunId: "run-1"}}
	}
	pending, done := loopsv1.OperationState_OPERATION_STATE_PENDING, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED
	require.NoError(t, j.append(store.Batch{
		TrainingRuns: []store.OwnedTrainingRun{{Workspace: "ws-a", Run: &loopsv1.TrainingRun{Id: "run-1", LastSeqId: 1}}},
		Operations:   []store.OwnedOperation{op("op-1", pending), op("op-2", pending)},
	}))
	first := j.name
	_, err = j.rotate()
	require.NoError(t, err)
	require.NoError(t, j.append(store.Batch{Operations: []store.OwnedOperation{op("op-1", done)}}))
	require.NoError(t, j.append(store.Batch{Operations: []store.OwnedOperation{op("op-2", done)}}))
	j.close(false)
	// Tear the last record.
	fi, err := os.Stat(j.name)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(j.name, fi.Size()-3))

	runs, ops := map[string]store.OwnedTrainingRun{}, map[string]store.OwnedOperation{}
	names, err := journalFiles(filepath.Join(dir, JournalDir))
	require.NoError(t, err)
	require.Equal(t, []string{first, j.name}, names)
	for i, name := range names {
		clean, err := readJournalFile(name, runs, ops, nil)
		require.NoError(t, err)
		require.Equal(t, i == 0, clean)
	}
	require.EqualValues(t, 1, runs["run-1"].Run.GetLastSeqId())
	require.Equal(t, done, ops["op-1"].Operation.GetState())
	require.Equal(t, pending, ops["op-2"].Operation.GetState(), "the torn record is not replayed")
	require.Equal(t, "ws-a", ops["op-2"].Workspace)
}
