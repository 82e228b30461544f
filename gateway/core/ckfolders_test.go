package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// contentBackend is the fake backend whose saved adapter_model.safetensors holds a chosen
// content, so a test can tell an old checkpoint from a new one.
type contentBackend struct {
	*fakeBackend
	mu      sync.Mutex
	content string
}

func (b *contentBackend) Trainer() backends.Trainer { return b }

func (b *contentBackend) set(content string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.content = content
}

func (b *contentBackend) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	resp, err := b.fakeBackend.SaveAdapter(ctx, req)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return resp, os.WriteFile(filepath.Join(req.GetDir(), "adapter_model.safetensors"), []byte(b.content), 0o644)
}

var errCrashed = errors.New("crashed")

// crasher is a fault hook that simulates a process crash right before step number at
// (counting from 0): that step and every later one fail without doing anything. With
// at < 0 it only records the steps.
type crasher struct {
	mu      sync.Mutex
	at      int
	steps   []ckStep
	crashed bool
}

func (c *crasher) hook(s ckStep) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed || len(c.steps) == c.at {
		c.crashed = true
		return errCrashed
	}
	c.steps = append(c.steps, s)
	return nil
}

// checkAfterRestart opens a fresh core on dir and checks that checkpoint name of run is
// listed (or not, if gone), complete, loadable and holds want, and that no other folder
// survived the start-up sweep.
func checkAfterRestart(t *testing.T, dir, run, name, want string, gone bool) {
	t.Helper()
	be := &contentBackend{fakeBackend: newFakeBackend()}
	h, stop := openHarness(t, dir, be, be.fakeBackend)
	defer stop()
	kd := filepath.Join(dir, "checkpoints", "ws-a", run, "weights")
	entries, err := os.ReadDir(kd)
	require.NoError(t, err)
	path := "tinker://" + run + "/weights/" + name
	if gone {
		require.Empty(t, h.listNames(run))
		require.Empty(t, entries, "the start-up sweep removed every folder")
		_, _, err := h.core.resolveCheckpoint(h.ctx, "ws-a", path)
		require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
		return
	}
	require.Equal(t, []string{name}, h.listNames(run))
	_, folder, err := h.core.resolveCheckpoint(h.ctx, "ws-a", path)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(folder, completeMarker))
	got, err := os.ReadFile(filepath.Join(folder, "adapter_model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, want, string(got))
	require.Len(t, entries, 1, "only the current generation survives the start-up sweep")
	require.Equal(t, filepath.Base(folder), entries[0].Name())
	op, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path, WithOptimizer: true})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
}

// TestOverwriteSurvivesACrashAtEveryStep kills an overwrite save right before each of its
// file-system and store steps; after a restart the checkpoint is always listed, complete,
// loadable and either the old or the new one, and no temporary folder is left.
func TestOverwriteSurvivesACrashAtEveryStep(t *testing.T) {
	want := []ckStep{stepSaveMkdir, stepSaveWrite, stepSaveMarker, stepSaveSync, stepSaveRecord, stepSaveRemove}
	for at := -1; at < len(want); at++ {
		name := "clean run"
		if at >= 0 {
			name = "crash before " + string(want[at])
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			be := &contentBackend{fakeBackend: newFakeBackend()}
			h, stop := openHarness(t, dir, be, be.fakeBackend)
			run := h.newRun()
			be.set("old")
			_, err := h.save(run, "c", false)
			require.NoError(t, err)

			cr := &crasher{at: at}
			h.core.ckpt.fault = cr.hook
			be.set("new")
			_, err = h.save(run, "c", true)
			if at < 0 {
				require.NoError(t, err)
				require.Equal(t, want, cr.steps, "the steps of an overwrite")
			}
			stop()

			content := "new"
			if at >= 0 && at <= 4 { // before the record was replaced
				content = "old"
			}
			checkAfterRestart(t, dir, run, "c", content, false)
		})
	}
}

// TestDeleteSurvivesACrashAtEveryStep kills a delete right before each step: after a restart
// the checkpoint is either still there, whole, or gone with its files.
func TestDeleteSurvivesACrashAtEveryStep(t *testing.T) {
	want := []ckStep{stepDelTrash, stepDelRecord, stepDelRemove}
	for at := -1; at < len(want); at++ {
		name := "clean run"
		if at >= 0 {
			name = "crash before " + string(want[at])
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			be := &contentBackend{fakeBackend: newFakeBackend(), content: "old"}
			h, stop := openHarness(t, dir, be, be.fakeBackend)
			run := h.newRun()
			path, err := h.save(run, "c", false)
			require.NoError(t, err)

			cr := &crasher{at: at}
			h.core.ckpt.fault = cr.hook
			_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
			if at < 0 {
				require.NoError(t, err)
				require.Equal(t, want, cr.steps, "the steps of a delete")
			}
			stop()
			checkAfterRestart(t, dir, run, "c", "old", at < 0 || at > 1)
		})
	}
}

// TestDeleteFailureLeavesARetryableState fails one step of a delete (the process lives on):
// before the record is deleted nothing changes and a retry works; after it, the delete has
// happened and the start-up sweep removes the leftover files.
func TestDeleteFailureLeavesARetryableState(t *testing.T) {
	for _, failing := range []ckStep{stepDelTrash, stepDelRecord, stepDelRemove} {
		t.Run(string(failing), func(t *testing.T) {
			dir := t.TempDir()
			be := &contentBackend{fakeBackend: newFakeBackend(), content: "old"}
			h, stop := openHarness(t, dir, be, be.fakeBackend)
			run := h.newRun()
			path, err := h.save(run, "c", false)
			require.NoError(t, err)
			var once sync.Once
			h.core.ckpt.fault = func(s ckStep) error {
				var err error
				if s == failing {
					once.Do(func() {
						err = &os.PathError{Op: "rename", Path: filepath.Join(h.core.ckpt.root, "ws-a", run), Err: errors.New("input/output error")}
					})
				}
				return err
			}
			_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
			if failing == stepDelRemove {
				require.NoError(t, err, "the record is gone: the delete happened")
				require.Empty(t, h.listNames(run))
				stop()
				checkAfterRestart(t, dir, run, "c", "", true)
				return
			}
			require.Equal(t, connect.CodeInternal, connect.CodeOf(err))
			require.ErrorContains(t, err, "nothing was deleted; retry")
			require.NotContains(t, err.Error(), dir, "no server paths in errors")
			require.Contains(t, err.Error(), "ws-a/"+run)
			// Unchanged: listed, complete, loadable.
			_, folder, err := h.core.resolveCheckpoint(h.ctx, "ws-a", path)
			require.NoError(t, err)
			require.FileExists(t, filepath.Join(folder, "adapter_model.safetensors"))
			// The retry succeeds.
			_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
			require.NoError(t, err)
			require.Empty(t, h.listNames(run))
			entries, err := os.ReadDir(filepath.Dir(folder))
			require.NoError(t, err)
			require.Empty(t, entries)
		})
	}
}

// TestSaveFailureLeavesNoFolder fails each step of a fresh save once: the save fails, the
// name is not listed and its unfinished folder is gone at once.
func TestSaveFailureLeavesNoFolder(t *testing.T) {
	for _, failing := range []ckStep{stepSaveWrite, stepSaveMarker, stepSaveSync, stepSaveRecord} {
		t.Run(string(failing), func(t *testing.T) {
			dir := t.TempDir()
			be := &contentBackend{fakeBackend: newFakeBackend(), content: "x"}
			h, _ := openHarness(t, dir, be, be.fakeBackend)
			run := h.newRun()
			h.core.ckpt.fault = func(s ckStep) error {
				if s == failing {
					return errors.New("disk on fire")
				}
				return nil
			}
			_, err := h.save(run, "c", false)
			require.ErrorContains(t, err, "internal error, id ", "a disk fault is masked")
			require.Empty(t, h.listNames(run))
			entries, err := os.ReadDir(filepath.Join(dir, "checkpoints", "ws-a", run, "weights"))
			require.NoError(t, err)
			require.Empty(t, entries)
		})
	}
}

func TestDownloadLinksAreBounded(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	for range MaxArchiveLinksPerWorkspace {
		_, err := h.svc.Checkpoints.GetCheckpointArchiveURL(h.ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: path})
		require.NoError(t, err)
	}
	_, err = h.svc.Checkpoints.GetCheckpointFileURLs(h.ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: path})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.ErrorContains(t, err, "1000 unexpired download links")
	// Expired links free their places.
	h.core.archives.sweep(h.core.now().Add(h.core.opts.ArchiveURLTTL + 1))
	_, err = h.svc.Checkpoints.GetCheckpointArchiveURL(h.ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: path})
	require.NoError(t, err)
}

func TestCheckpointPathsNeverLeaveTheStore(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	for _, ws := range []string{"..", "../x", "a/b", "", "."} {
		_, err := h.core.ckpt.kindDir(ws, "run-1", loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING)
		require.Error(t, err, ws)
		require.False(t, strings.Contains(err.Error(), h.dir), err.Error())
	}
}
