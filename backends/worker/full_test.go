package worker

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFullRunsKeepApart: a full fine-tuning run (LoRA rank 0) goes to the replica holding
// the fewest full runs, before the fewest adapters (a torch worker holds
// --full-finetune-runs of them); a LoRA adapter still goes to the fewest adapters; deleting
// a full run frees its replica for the next; a full checkpoint folder names its base model
// (so an offloaded full run is restored on a replica serving it) and marks the run full.
func TestFullRunsKeepApart(t *testing.T) {
	b, ws := replicas(2)
	b.bind("full-1", ws[0], true)
	for _, id := range []string{"lora-1", "lora-2", "lora-3"} {
		b.bind(id, ws[1], false)
	}
	w, err := b.pickAdapter("", true, "m")
	require.NoError(t, err)
	require.Same(t, ws[1], w, "the replica without a full run, though it holds 3 adapters to 1")
	w, err = b.pickAdapter("", false, "m")
	require.NoError(t, err)
	require.Same(t, ws[0], w, "a LoRA adapter goes to the fewest adapters")

	b.bind("full-2", ws[1], true)
	b.mu.Lock()
	b.unbindLocked("full-1", ws[0]) // DeleteAdapter's bookkeeping
	b.mu.Unlock()
	require.Zero(t, ws[0].nFull)
	w, err = b.pickAdapter("", true, "m")
	require.NoError(t, err)
	require.Same(t, ws[0], w)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, FullMarker), []byte(`{"format": 1, "base_model": "m", "step": 3}`), 0o644))
	base, full := fullFolderBaseModel(dir)
	require.Equal(t, "m", base)
	require.True(t, full)
	require.Empty(t, folderBaseModel(dir), "not a PEFT folder")
	base, full = fullFolderBaseModel(t.TempDir())
	require.False(t, full)
	require.Empty(t, base)
	_, full = fullFolderBaseModel("relative")
	require.False(t, full)
}
