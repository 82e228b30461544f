package ckfiles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/ckstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newFiles opens Files on a fresh data dir with the local store (st nil) or st.
func newFiles(t *testing.T, st ckstore.Store) (*Files, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := New(Config{DataDir: dir, Store: st, CacheBytes: 1 << 20, SweepGrace: time.Minute, Log: quiet})
	require.NoError(t, err)
	return f, dir
}

// folder writes a checkpoint folder holding adapter_model.safetensors with content.
func folder(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), []byte(content), 0o644))
	require.NoError(t, WriteMarker(dir))
	return dir
}

// remote is a store that is not local (no LocalDirs), as S3 is: readers get cached copies.
type remote struct{ ckstore.Store }

// urlStore is a remote store that hands out presigned URLs.
type urlStore struct{ remote }

func (urlStore) BeginUpload(context.Context, string, []string, time.Duration) (*ckstore.Upload, error) {
	return nil, errors.New("not used")
}

func (urlStore) CommitUpload(context.Context, *ckstore.Upload, []ckstore.File) (*ckstore.Manifest, error) {
	return nil, errors.New("not used")
}

func (urlStore) AbortUpload(*ckstore.Upload) {}

func (urlStore) DownloadURLs(_ context.Context, key string, m *ckstore.Manifest, ttl time.Duration) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range m.Files {
		out[f.Name] = fmt.Sprintf("https://store.example/%s/%s?ttl=%s", key, f.Name, ttl)
	}
	return out, nil
}

func localStore(t *testing.T) ckstore.Store {
	t.Helper()
	st, err := ckstore.NewLocal(t.TempDir(), ckstore.Options{})
	require.NoError(t, err)
	return st
}

func TestNewEmptiesTheStagingFolderAndOpensTheLocalStore(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, StagingFolder, "save-1"), 0o755))
	f, err := New(Config{DataDir: dir})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, StagingFolder), f.Staging())
	entries, err := os.ReadDir(f.Staging())
	require.NoError(t, err)
	require.Empty(t, entries)
	require.Contains(t, f.Store().String(), filepath.Join(dir, LocalStoreFolder))
	require.False(t, f.UseURLs(), "the local store hands out no presigned URLs")
	require.Nil(t, f.URLs())
}

// TestOpenReadsTheLocalStoreInPlace: the local store's readers get its own folder, and a
// key the store does not have is not found (ok false, no error).
func TestOpenReadsTheLocalStoreInPlace(t *testing.T) {
	f, dir := newFiles(t, nil)
	ctx := t.Context()
	key, err := Key("ws", "run", kinds[0], "c", 1)
	require.NoError(t, err)
	_, err = f.Store().Put(ctx, key, folder(t, "weights"))
	require.NoError(t, err)

	ref, ok, err := f.Open(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, key, ref.Key())
	require.True(t, strings.HasPrefix(ref.Dir(), filepath.Join(dir, LocalStoreFolder)), ref.Dir())
	got, err := os.ReadFile(filepath.Join(ref.Dir(), "adapter_model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, "weights", string(got))
	src, files, err := f.Source(ctx, ref.Hold())
	require.NoError(t, err)
	require.Equal(t, ref.Dir(), src)
	require.Empty(t, files)
	ref.Release()
	ref.Release()

	_, ok, err = f.Open(ctx, key+"0")
	require.NoError(t, err)
	require.False(t, ok)
	var none *Ref
	none.Release() // no adapter
	src, files, err = f.Source(ctx, none)
	require.NoError(t, err)
	require.Empty(t, src)
	require.Empty(t, files)
}

// TestOpenCopiesARemoteStoreIntoTheCacheWhileHeld: a remote store's checkpoint is read from
// a verified copy in DataDir/checkpoint-cache, kept while a holder has it.
func TestOpenCopiesARemoteStoreIntoTheCacheWhileHeld(t *testing.T) {
	st := remote{localStore(t)}
	f, dir := newFiles(t, st)
	ctx := t.Context()
	key, err := Key("ws", "run", kinds[0], "c", 1)
	require.NoError(t, err)
	_, err = st.Put(ctx, key, folder(t, "remote weights"))
	require.NoError(t, err)

	ref, ok, err := f.Open(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, strings.HasPrefix(ref.Dir(), filepath.Join(dir, CacheFolder)), ref.Dir())
	got, err := os.ReadFile(filepath.Join(ref.Dir(), "adapter_model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, "remote weights", string(got))
	ref.Release()

	_, ok, err = f.Open(ctx, "ws/run/weights/none@1")
	require.NoError(t, err)
	require.False(t, ok)
}

// TestAdapterGivesPresignedFilesToABackendThatTakesURLs: with UseURLs, a backend request
// names the checkpoint's files by URL (with sizes and SHA-256s), and nothing is copied to
// the gateway's disk.
func TestAdapterGivesPresignedFilesToABackendThatTakesURLs(t *testing.T) {
	st := urlStore{remote{localStore(t)}}
	f, dir := newFiles(t, st)
	require.True(t, f.UseURLs())
	ctx := t.Context()
	key, err := Key("ws", "run", kinds[1], "s", 5)
	require.NoError(t, err)
	m, err := st.Put(ctx, key, folder(t, "w"))
	require.NoError(t, err)

	ref, ok, err := f.Adapter(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	defer ref.Release()
	require.Empty(t, ref.Dir())
	src, files, err := f.Source(ctx, ref)
	require.NoError(t, err)
	require.Empty(t, src)
	require.Len(t, files, len(m.Files))
	for i, file := range files {
		require.Equal(t, m.Files[i].Name, file.GetName())
		require.Equal(t, m.Files[i].SHA256, file.GetSha256())
		require.Equal(t, m.Files[i].Size, file.GetSize())
		require.Equal(t, "https://store.example/"+key+"/"+file.GetName()+"?ttl=2h0m0s", file.GetUrl())
	}
	cached, err := os.ReadDir(filepath.Join(dir, CacheFolder))
	require.NoError(t, err)
	require.Empty(t, cached)

	_, ok, err = f.Adapter(ctx, "ws/run/sampler_weights/none@1")
	require.NoError(t, err)
	require.False(t, ok)
}

// TestInsideRefusesFoldersLinkedOutOfTheStore: a workspace folder that is a symbolic link
// out of the local store is refused, and the error shows no server path.
func TestInsideRefusesFoldersLinkedOutOfTheStore(t *testing.T) {
	f, dir := newFiles(t, nil)
	outside := t.TempDir()
	key, err := Key("ws-a", "run", kinds[0], "c", 1)
	require.NoError(t, err)
	require.NoError(t, f.Inside(key), "a key whose folders do not exist yet is inside")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, LocalStoreFolder), 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, LocalStoreFolder, "ws-a")))
	err = f.Inside(key)
	require.Equal(t, connect.CodeInternal, connect.CodeOf(err))
	require.ErrorContains(t, err, "resolves outside the checkpoint store")
	require.NotContains(t, err.Error(), dir)
	_, _, err = f.Open(t.Context(), key)
	require.ErrorContains(t, err, "resolves outside the checkpoint store")
	// A remote store has no folders to check.
	r, _ := newFiles(t, remote{localStore(t)})
	require.NoError(t, r.Inside(key))
}

// TestScrubHidesTheDataDir: errors naming files of the data dir show them relative to it,
// keep their Connect code and what they wrap; others are left as they are.
func TestScrubHidesTheDataDir(t *testing.T) {
	f, dir := newFiles(t, nil)
	real, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	pathErr := &os.PathError{Op: "open", Path: filepath.Join(real, "checkpoint-store", "x"), Err: os.ErrPermission}
	got := f.Scrub(pathErr)
	require.Equal(t, "open checkpoint-store/x: permission denied", got.Error())
	require.ErrorIs(t, got, os.ErrPermission)

	ce := f.Scrub(connect.NewError(connect.CodeUnavailable, fmt.Errorf("saving into %s: busy", dir)))
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(ce))
	require.Equal(t, "saving into .: busy", errs.Message(ce))

	plain := errors.New("no paths here")
	require.Same(t, plain, f.Scrub(plain))
	require.NoError(t, f.Scrub(nil))
	require.Equal(t, "checkpoint-store/a", f.Rel(filepath.Join(dir, "checkpoint-store", "a")))

	in := f.Internal("reading checkpoint", pathErr)
	require.Equal(t, connect.CodeInternal, connect.CodeOf(in))
	require.NotContains(t, in.Error(), dir)
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(f.Internal("reading checkpoint", context.Canceled)))
}

// TestGenerationsOnlyIncrease: a new generation is after the save's time, the previous
// generation and every generation issued before, also when saves race.
func TestGenerationsOnlyIncrease(t *testing.T) {
	f, _ := newFiles(t, nil)
	now := time.Unix(100, 0)
	g1 := f.NextGeneration(now, nil)
	require.Equal(t, now.UnixNano(), g1)
	require.Equal(t, g1+1, f.NextGeneration(now, nil), "the same time twice")
	prev := &loopsv1.Checkpoint{CreateTime: timestampAt(now.Add(time.Hour))}
	require.Equal(t, Generation(prev)+1, f.NextGeneration(now, prev), "a record from a clock ahead")

	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				g := f.NextGeneration(now, nil)
				mu.Lock()
				if seen[g] {
					t.Errorf("generation %d issued twice", g)
				}
				seen[g] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, 800)
}

// TestLockSerialisesOneCheckpointOnly: a checkpoint's lock makes another change of the same
// checkpoint wait and lets others go; the table keeps no entry once no one holds or waits.
func TestLockSerialisesOneCheckpointOnly(t *testing.T) {
	f, _ := newFiles(t, nil)
	unlock := f.Lock("ws", "run", "weights/a")
	other := make(chan struct{})
	go func() {
		f.Lock("ws", "run", "weights/b")()
		f.Lock("ws", "run2", "weights/a")()
		close(other)
	}()
	select {
	case <-other:
	case <-time.After(10 * time.Second):
		t.Fatal("another checkpoint's lock waited")
	}
	same := make(chan struct{})
	go func() {
		f.Lock("ws", "run", "weights/a")()
		close(same)
	}()
	select {
	case <-same:
		t.Fatal("the same checkpoint's lock did not wait")
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	<-same
	f.locks.mu.Lock()
	defer f.locks.mu.Unlock()
	require.Empty(t, f.locks.m)
}
