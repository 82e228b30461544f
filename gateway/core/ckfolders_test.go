package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
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

// ckStores are the checkpoint stores the crash tests run on: the local folder (the
// default), an S3 bucket on a real S3-compatible server (skipped without the weed binary,
// except under CI), and that bucket with a backend that reads and writes it through
// presigned URLs. opts returns the Options that every core of one test (its restarts
// included) opens with; backend returns a fresh backend whose saves hold the given content.
var ckStores = []struct {
	name    string
	opts    func(t *testing.T) Options
	backend func(content string) (backends.Backend, *fakeBackend, func(string))
}{
	{"local", func(t *testing.T) Options { return Options{CheckpointSweepGrace: time.Nanosecond} }, folderBackend},
	{"s3", func(t *testing.T) Options {
		return Options{CheckpointStore: newS3Store(t), CheckpointSweepGrace: time.Nanosecond}
	}, folderBackend},
	{"s3 through worker URLs", func(t *testing.T) Options {
		return Options{CheckpointStore: newS3Store(t), CheckpointSweepGrace: time.Nanosecond}
	}, func(content string) (backends.Backend, *fakeBackend, func(string)) {
		be := &urlBackend{fakeBackend: newFakeBackend(), content: content}
		return be, be.fakeBackend, be.set
	}},
}

// folderBackend is a contentBackend (a backend on the gateway's host, given folders).
func folderBackend(content string) (backends.Backend, *fakeBackend, func(string)) {
	be := &contentBackend{fakeBackend: newFakeBackend(), content: content}
	return be, be.fakeBackend, be.set
}

// newS3Store is a checkpoint store in a fresh bucket of the package's S3 server.
func newS3Store(t *testing.T) ckstore.Store {
	t.Helper()
	srv := s3test.Start(t)
	srv.SetEnv(t)
	st, err := ckstore.Open(t.Context(), "s3://"+srv.NewBucket(t)+"/loops", ckstore.Options{})
	require.NoError(t, err)
	return st
}

// checkAfterRestart opens a fresh core on dir and checks that checkpoint name of run is
// listed (or not, if gone), complete, loadable and holds want, and that no other
// generation survived the start-up sweep.
func checkAfterRestart(t *testing.T, dir string, opts Options, newBackend func(string) (backends.Backend, *fakeBackend, func(string)), run, name, want string, gone bool) {
	t.Helper()
	be, fake, _ := newBackend("")
	h, stop := openHarnessWith(t, dir, be, fake, opts)
	defer stop()
	keys, err := h.core.ckpt.Store().List(h.ctx, "ws-a/"+run)
	require.NoError(t, err)
	path := "tinker://" + run + "/weights/" + name
	if gone {
		require.Empty(t, h.listNames(run))
		require.Empty(t, keys, "the start-up sweep deleted every generation")
		_, _, err := h.core.resolveCheckpoint(h.ctx, "ws-a", path)
		require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
		return
	}
	require.Equal(t, []string{name}, h.listNames(run))
	ck, ref, err := h.core.resolveCheckpoint(h.ctx, "ws-a", path)
	require.NoError(t, err)
	defer ref.Release()
	require.FileExists(t, filepath.Join(ref.Dir(), ckfiles.CompleteMarker))
	got, err := os.ReadFile(filepath.Join(ref.Dir(), "adapter_model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, want, string(got))
	key, err := ckfiles.RecordKey("ws-a", ck)
	require.NoError(t, err)
	require.Equal(t, []string{key}, keys, "only the current generation survives the start-up sweep")
	staged, err := os.ReadDir(filepath.Join(dir, ckfiles.StagingFolder))
	require.NoError(t, err)
	require.Empty(t, staged, "the staging folder is emptied at start-up")
	op, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path, WithOptimizer: true})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
}

// TestOverwriteSurvivesACrashAtEveryStep kills an overwrite save right before each of its
// file-system and store steps, on each checkpoint store; after a restart the checkpoint is
// always listed, complete, loadable and either the old or the new one, and no other
// generation is left.
func TestOverwriteSurvivesACrashAtEveryStep(t *testing.T) {
	want := []ckStep{stepSaveMkdir, stepSaveWrite, stepSaveMarker, stepSavePut, stepSaveRecord, stepSaveRemove}
	for _, cs := range ckStores {
		t.Run(cs.name, func(t *testing.T) {
			opts := cs.opts(t)
			for at := -1; at < len(want); at++ {
				name := "clean run"
				if at >= 0 {
					name = "crash before " + string(want[at])
				}
				t.Run(name, func(t *testing.T) {
					dir := t.TempDir()
					be, fake, set := cs.backend("")
					h, stop := openHarnessWith(t, dir, be, fake, opts)
					run := h.newRun()
					set("old")
					_, err := h.save(run, "c", false)
					require.NoError(t, err)

					cr := &crasher{at: at}
					h.core.ckFault = cr.hook
					set("new")
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
					checkAfterRestart(t, dir, opts, cs.backend, run, "c", content, false)
				})
			}
		})
	}
}

// TestDeleteSurvivesACrashAtEveryStep kills a delete right before each step, on each
// checkpoint store: after a restart the checkpoint is either still there, whole, or gone
// with its files.
func TestDeleteSurvivesACrashAtEveryStep(t *testing.T) {
	want := []ckStep{stepDelRecord, stepDelRemove}
	for _, cs := range ckStores {
		t.Run(cs.name, func(t *testing.T) {
			opts := cs.opts(t)
			for at := -1; at < len(want); at++ {
				name := "clean run"
				if at >= 0 {
					name = "crash before " + string(want[at])
				}
				t.Run(name, func(t *testing.T) {
					dir := t.TempDir()
					be, fake, _ := cs.backend("old")
					h, stop := openHarnessWith(t, dir, be, fake, opts)
					run := h.newRun()
					path, err := h.save(run, "c", false)
					require.NoError(t, err)

					cr := &crasher{at: at}
					h.core.ckFault = cr.hook
					_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
					if at < 0 {
						require.NoError(t, err)
						require.Equal(t, want, cr.steps, "the steps of a delete")
					}
					stop()
					checkAfterRestart(t, dir, opts, cs.backend, run, "c", "old", at != 0)
				})
			}
		})
	}
}

// TestDeleteFailureLeavesARetryableState fails one step of a delete (the process lives on):
// before the record is deleted nothing changes and a retry works; after it, the delete has
// happened and the store sweep deletes the leftover files.
func TestDeleteFailureLeavesARetryableState(t *testing.T) {
	for _, failing := range []ckStep{stepDelRecord, stepDelRemove} {
		t.Run(string(failing), func(t *testing.T) {
			dir := t.TempDir()
			be := &contentBackend{fakeBackend: newFakeBackend(), content: "old"}
			opts := ckStores[0].opts(t)
			h, stop := openHarnessWith(t, dir, be, be.fakeBackend, opts)
			run := h.newRun()
			path, err := h.save(run, "c", false)
			require.NoError(t, err)
			var once sync.Once
			h.core.ckFault = func(s ckStep) error {
				var err error
				if s == failing {
					once.Do(func() {
						err = &os.PathError{Op: "rename", Path: filepath.Join(dir, "loops.db"), Err: errors.New("input/output error")}
					})
				}
				return err
			}
			_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
			if failing == stepDelRemove {
				require.NoError(t, err, "the record is gone: the delete happened")
				require.Empty(t, h.listNames(run))
				keys, err := h.core.ckpt.Store().List(h.ctx, "ws-a/"+run)
				require.NoError(t, err)
				require.Len(t, keys, 1, "the files are left for the sweep")
				stop()
				checkAfterRestart(t, dir, opts, folderBackend, run, "c", "", true)
				return
			}
			require.Equal(t, connect.CodeInternal, connect.CodeOf(err))
			require.ErrorContains(t, err, "nothing was deleted; retry")
			require.NotContains(t, err.Error(), dir, "no server paths in errors")
			// Unchanged: listed, complete, loadable.
			_, ref, err := h.core.resolveCheckpoint(h.ctx, "ws-a", path)
			require.NoError(t, err)
			require.FileExists(t, filepath.Join(ref.Dir(), "adapter_model.safetensors"))
			ref.Release()
			// The retry succeeds.
			_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
			require.NoError(t, err)
			require.Empty(t, h.listNames(run))
			keys, err := h.core.ckpt.Store().List(h.ctx, "ws-a/"+run)
			require.NoError(t, err)
			require.Empty(t, keys)
		})
	}
}

// TestSaveFailureLeavesNothing fails each step of a fresh save once: the save fails, the
// name is not listed, and neither the store nor the staging folder keeps anything.
func TestSaveFailureLeavesNothing(t *testing.T) {
	for _, failing := range []ckStep{stepSaveMkdir, stepSaveWrite, stepSaveMarker, stepSavePut, stepSaveRecord} {
		t.Run(string(failing), func(t *testing.T) {
			dir := t.TempDir()
			be := &contentBackend{fakeBackend: newFakeBackend(), content: "x"}
			h, _ := openHarness(t, dir, be, be.fakeBackend)
			run := h.newRun()
			h.core.ckFault = func(s ckStep) error {
				if s == failing {
					return errors.New("disk on fire")
				}
				return nil
			}
			_, err := h.save(run, "c", false)
			require.ErrorContains(t, err, "internal error, id ", "a disk fault is masked")
			require.Empty(t, h.listNames(run))
			keys, err := h.core.ckpt.Store().List(h.ctx, "ws-a/"+run)
			require.NoError(t, err)
			require.Empty(t, keys)
			staged, err := os.ReadDir(filepath.Join(dir, ckfiles.StagingFolder))
			require.NoError(t, err)
			require.Empty(t, staged)
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
