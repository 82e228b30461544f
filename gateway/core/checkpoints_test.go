package core

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// These tests use only the service API and the store, so they also run against the code
// before checkpoint generations (where they fail).

func (h *harness) save(run, name string, overwrite bool) (string, error) {
	h.t.Helper()
	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: name, Overwrite: overwrite})
	if err != nil {
		return "", err
	}
	done := h.wait(op)
	if done.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
		return "", connect.NewError(connect.Code(done.GetError().GetCode()), errorString(done.GetError().GetMessage()))
	}
	return done.GetSaveWeights().GetPath(), nil
}

type errorString string

// openHarness starts a core on dir with its own store; stop (also run at cleanup) closes
// both, as a process exit would, so the next openHarness on dir is a restart.
func openHarness(t *testing.T, dir string, be backends.Backend, fake *fakeBackend) (h *harness, stop func()) {
	t.Helper()
	return openHarnessWith(t, dir, be, fake, Options{CheckpointSweepGrace: time.Nanosecond})
}

// openHarnessWith is openHarness with options (DataDir is set to dir).
func openHarnessWith(t *testing.T, dir string, be backends.Backend, fake *fakeBackend, opts Options) (h *harness, stop func()) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	opts.DataDir = dir
	c, err := New(t.Context(), st, be, opts)
	require.NoError(t, err)
	// The start-up sweep runs in the background; with the tests' tiny grace it could take a
	// save's generation before its record is written, so the tests start after it.
	<-c.ckSwept
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = c.Close()
			_ = st.Close()
		})
	}
	t.Cleanup(stop)
	return &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}, stop
}

func (e errorString) Error() string { return string(e) }

func (h *harness) listNames(run string) []string {
	h.t.Helper()
	list, err := h.svc.Checkpoints.ListCheckpoints(h.ctx, &loopsv1.ListCheckpointsRequest{TrainingRunId: run})
	require.NoError(h.t, err)
	var out []string
	for _, ck := range list.GetCheckpoints() {
		out = append(out, ck.GetName())
	}
	return out
}

func TestCheckpointTTLHasAMaximumAndNeverWraps(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := newHarness(t, t.TempDir(), Options{Now: clock})
	run := h.newRun()
	const tenYears = int64(10 * 365 * 24 * 3600)

	// ttl_seconds=10**10 once overflowed time.Duration: expires_at landed in 1759 and the
	// janitor deleted the checkpoint.
	for _, ttl := range []int64{1e10, tenYears + 1, 0, -1} {
		_, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "long", TtlSeconds: ptr(ttl)})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "ttl %d", ttl)
		require.ErrorContains(t, err, "between 1 and 315360000 (10 years)")
	}
	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "long", TtlSeconds: ptr(tenYears)})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	ck := done.GetSaveWeights().GetCheckpoint()
	require.Equal(t, tenYears, int64(ck.GetExpireTime().AsTime().Sub(ck.GetCreateTime().AsTime())/time.Second))
	path := ck.GetTinkerPath()

	for _, ttl := range []int64{1e10, tenYears + 1, 0, -1} {
		_, err := h.svc.Checkpoints.SetCheckpointTTL(h.ctx, &loopsv1.SetCheckpointTTLRequest{Path: path, TtlSeconds: ptr(ttl)})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "ttl %d", ttl)
		require.ErrorContains(t, err, "between 1 and 315360000 (10 years)")
	}
	got, err := h.svc.Checkpoints.SetCheckpointTTL(h.ctx, &loopsv1.SetCheckpointTTLRequest{Path: path, TtlSeconds: ptr(tenYears)})
	require.NoError(t, err)
	require.Equal(t, now.Add(time.Duration(tenYears)*time.Second), got.GetExpireTime().AsTime())

	// The janitor keeps it until the ten years are up.
	mu.Lock()
	now = now.Add(time.Duration(tenYears-1) * time.Second)
	mu.Unlock()
	h.core.sweep(h.ctx)
	still, err := h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: path})
	require.NoError(t, err)
	require.Empty(t, cmp.Diff(got, still, protocmp.Transform()))
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	h.core.sweep(h.ctx)
	_, err = h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: path})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

// httpGet fetches a URL path from the test server and returns the status and body.
func httpGet(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestDownloadLinksAreRevokedWithTheCheckpoint(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	srv := httptest.NewServer(archiveHandler(h.core))
	defer srv.Close()
	wsB := auth.WithWorkspace(t.Context(), "ws-b")
	run := h.newRun()
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: path, Public: true})
	require.NoError(t, err)

	links := func(ctx2 bool) (file, archive string) {
		ctx := h.ctx
		if ctx2 {
			ctx = wsB
		}
		urls, err := h.svc.Checkpoints.GetCheckpointFileURLs(ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: path})
		require.NoError(t, err)
		tar, err := h.svc.Checkpoints.GetCheckpointArchiveURL(ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: path})
		require.NoError(t, err)
		return urls.GetUrls()["adapter_model.safetensors"], tar.GetUrl()
	}
	bFile, bTar := links(true)
	aFile, aTar := links(false)
	for _, u := range []string{bFile, bTar, aFile, aTar} {
		code, body := httpGet(t, srv, u)
		require.Equal(t, http.StatusOK, code, body)
	}

	// Unpublished: the other workspace's links stop working; the owner's keep working.
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: path, Public: false})
	require.NoError(t, err)
	for _, u := range []string{bFile, bTar} {
		code, body := httpGet(t, srv, u)
		require.Equal(t, http.StatusNotFound, code)
		require.Contains(t, body, "no longer public")
	}
	for _, u := range []string{aFile, aTar} {
		code, body := httpGet(t, srv, u)
		require.Equal(t, http.StatusOK, code, body)
	}
	// Publishing again does not revive a revoked link (a new one works).
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: path, Public: true})
	require.NoError(t, err)
	code, _ := httpGet(t, srv, bFile)
	require.Equal(t, http.StatusNotFound, code)

	// Saved again under the same name: old links do not serve the new content.
	_, err = h.save(run, "c", true)
	require.NoError(t, err)
	for _, u := range []string{aFile, aTar} {
		code, body := httpGet(t, srv, u)
		require.Equal(t, http.StatusNotFound, code)
		require.Contains(t, body, "deleted or saved again")
	}
	// Deleted and re-saved: the same.
	aFile, _ = links(false)
	_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
	require.NoError(t, err)
	_, err = h.save(run, "c", false)
	require.NoError(t, err)
	code, body := httpGet(t, srv, aFile)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "deleted or saved again")
}

func TestWorkspaceFolderSymlinkedOutsideIsRefused(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	h := newHarness(t, dir, Options{})
	run := h.newRun()
	// An operator (or an old unvalidated workspace name) made the workspace folder a link
	// out of the data dir.
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, ckfiles.LocalStoreFolder, "ws-a")))
	_, err := h.save(run, "c", false)
	require.Error(t, err)
	require.Contains(t, err.Error(), "internal error, id ", "a server misconfiguration is masked")
	require.NotContains(t, err.Error(), dir)
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing is written outside the data dir")

	// A record whose folder sits behind such a link is not served either.
	require.NoError(t, os.Remove(filepath.Join(dir, ckfiles.LocalStoreFolder, "ws-a")))
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	require.NoError(t, os.Rename(filepath.Join(dir, ckfiles.LocalStoreFolder, "ws-a"), filepath.Join(outside, "ws-a")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "ws-a"), filepath.Join(dir, ckfiles.LocalStoreFolder, "ws-a")))
	_, _, err = h.core.resolveCheckpoint(h.ctx, "ws-a", path)
	require.Error(t, err)
	require.Contains(t, err.Error(), "outside the checkpoint store")
	require.NotContains(t, err.Error(), outside)
}

func TestCheckpointErrorsShowNoServerPaths(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, Options{})
	run := h.newRun()
	// A file where the run's checkpoint folder should be: the save fails on the file system.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, ckfiles.LocalStoreFolder, "ws-a"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ckfiles.LocalStoreFolder, "ws-a", run), nil, 0o644))
	_, err := h.save(run, "c", false)
	require.Error(t, err)
	real, rerr := filepath.EvalSymlinks(dir)
	require.NoError(t, rerr)
	require.NotContains(t, err.Error(), dir)
	require.NotContains(t, err.Error(), real)
	// A file-system failure is the server's: masked to an error id (the log has the text).
	require.Contains(t, err.Error(), "internal error, id ")
}

// TestStartupMovesTheOldFolderLayoutIntoTheStore: checkpoints that versions before the
// checkpoint store kept under DataDir/checkpoints (plain <name> folders, generation
// folders, the trash of a delete whose record survived) are moved into the store at
// start-up and stay loadable with their content; folders no record references go.
func TestStartupMovesTheOldFolderLayoutIntoTheStore(t *testing.T) {
	dir := t.TempDir()
	fake := newFakeBackend()
	h, stop := openHarness(t, dir, fake, fake)
	run := h.newRun()
	created := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	gen := strconv.FormatInt(created.UnixNano(), 10)
	kd := filepath.Join(dir, ckfiles.LegacyFolder, "ws-a", run, "weights")
	folders := map[string]string{ // folder -> content
		"old":                     "old",
		"old.tmp-0123456789ab":    "tmp",
		"gone":                    "gone",
		"g@" + gen:                "g",
		"g@1":                     "stale generation",
		"t@" + gen + "@trash":     "t",
		"other@" + gen + "@trash": "deleted",
	}
	for d, content := range folders {
		require.NoError(t, os.MkdirAll(filepath.Join(kd, d), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(kd, d, "adapter_model.safetensors"), []byte(content), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(kd, d, "checkpoint_complete"), nil, 0o644))
	}
	for _, name := range []string{"old", "g", "t"} {
		require.NoError(t, h.core.store.PutCheckpoint(h.ctx, "ws-a", &loopsv1.Checkpoint{
			Id: "weights/" + name, TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: name,
			TinkerPath: "tinker://" + run + "/weights/" + name, CreateTime: timestamppb.New(created),
			BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
		}))
	}
	stop()

	h2, _ := openHarness(t, dir, fake, fake)
	_, err := os.Stat(filepath.Join(dir, ckfiles.LegacyFolder))
	require.ErrorIs(t, err, os.ErrNotExist, "the old layout's folders are gone")
	for _, name := range []string{"old", "g", "t"} {
		_, ref, err := h2.core.resolveCheckpoint(h2.ctx, "ws-a", "tinker://"+run+"/weights/"+name)
		require.NoError(t, err, name)
		got, err := os.ReadFile(filepath.Join(ref.Dir(), "adapter_model.safetensors"))
		require.NoError(t, err)
		require.Equal(t, name, string(got))
		ref.Release()
	}
	keys, err := h2.core.ckpt.Store().List(h2.ctx, "ws-a/"+run)
	require.NoError(t, err)
	require.Len(t, keys, 3)
	// Overwriting works as for any checkpoint.
	_, err = h2.save(run, "old", true)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"g", "old", "t"}, h2.listNames(run))
}
