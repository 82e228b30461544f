package core

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// TestOperationErrorsShowNoServerPaths: a backend error that names a checkpoint folder
// (here a load from a folder whose weights file vanished) never shows the server's data dir
// to the client: as an internal error it is masked to an error id.
func TestOperationErrorsShowNoServerPaths(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	save, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "ck"})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(save).GetState())
	var removed int
	require.NoError(t, filepath.WalkDir(h.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "adapter_model.safetensors" {
			removed++
			return os.Remove(p)
		}
		return err
	}))
	require.Equal(t, 1, removed)
	load, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: "tinker://" + run + "/weights/ck"})
	require.NoError(t, err)
	got := h.wait(load)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	// The server's fault: masked to an error id, the full text (and path) only in the log.
	require.Contains(t, got.GetError().GetMessage(), "internal error, id ")
	require.NotContains(t, got.GetError().GetMessage(), h.dir)
}
