package ckfiles

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// records is a fake record reader: checkpoints by workspace, run and id.
type records struct {
	mu   sync.Mutex
	m    map[string]*loopsv1.Checkpoint
	fail map[string]error
}

func (r *records) put(ws string, ck *loopsv1.Checkpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*loopsv1.Checkpoint{}
	}
	r.m[ws+"/"+ck.GetTrainingRunId()+"/"+ck.GetId()] = ck
}

func (r *records) GetCheckpoint(_ context.Context, ws, runID, id string) (*loopsv1.Checkpoint, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := ws + "/" + runID + "/" + id
	if err := r.fail[k]; err != nil {
		return nil, err
	}
	if ck, ok := r.m[k]; ok {
		return ck, nil
	}
	return nil, store.ErrNotFound
}

func record(runID string, kind loopsv1.CheckpointKind, name string, created time.Time) *loopsv1.Checkpoint {
	return &loopsv1.Checkpoint{
		Id: KindSegment(kind) + "/" + name, TrainingRunId: runID, Kind: kind, Name: name,
		TinkerPath: "tinker://" + runID + "/" + KindSegment(kind) + "/" + name, CreateTime: timestamppb.New(created),
	}
}

// TestSweepDeletesWhatNoRecordReferences: past the grace, generations no record points at
// and step snapshots no live run holds are deleted; the current generations, live
// snapshots, young keys (a save may be about to record them), keys whose record could not
// be read and keys that are not the core's stay.
func TestSweepDeletesWhatNoRecordReferences(t *testing.T) {
	f, _ := newFiles(t, nil) // grace: a minute
	ctx := t.Context()
	now := time.Now()
	old, young := now.Add(-time.Hour), now.Add(-time.Second)
	recs := &records{fail: map[string]error{"ws/run/weights/unreadable": errors.New("store down")}}
	current := record("run", kinds[0], "c", old)
	recs.put("ws", current)
	put := func(key string) string {
		t.Helper()
		_, err := f.Store().Put(ctx, key, folder(t, key))
		require.NoError(t, err)
		return key
	}
	mustKey := func(k string, err error) string { require.NoError(t, err); return k }
	keep := []string{
		put(mustKey(RecordKey("ws", current))),
		put(mustKey(Key("ws", "run", kinds[0], "fresh", young.UnixNano()))),
		put(mustKey(Key("ws", "run", kinds[0], "unreadable", old.UnixNano()))),
		put(mustKey(SnapshotKey("ws", "run", 3, old.UnixNano()))), // live
		put(mustKey(SnapshotKey("ws", "run", 4, young.UnixNano()))),
		put("ws/run/other/x@1"),
	}
	gone := []string{
		put(mustKey(Key("ws", "run", kinds[0], "c", old.UnixNano()-1))), // replaced
		put(mustKey(Key("ws", "run", kinds[1], "deleted", old.UnixNano()))),
		put(mustKey(SnapshotKey("ws", "run", 2, old.UnixNano()))),
	}
	live := func(key string) bool { return key == keep[3] }
	f.Sweep(ctx, now, recs, live)
	keys, err := f.Store().List(ctx, "")
	require.NoError(t, err)
	require.ElementsMatch(t, keep, keys)
	require.Equal(t, now, f.LastSweep())
	for _, k := range gone {
		require.NotContains(t, keys, k)
	}
}

// TestMigrateMovesTheOldFolderLayout: folders of the layout before the checkpoint store
// that a record references (its generation's folder, else the trash of a delete that
// stopped before its record went, else the plain folder) are put into the store under the
// record's key; every other folder goes, and the old tree with it. Files and symbolic links
// are left alone.
func TestMigrateMovesTheOldFolderLayout(t *testing.T) {
	f, dir := newFiles(t, nil)
	ctx := t.Context()
	created := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	gen := strconv.FormatInt(created.UnixNano(), 10)
	kd := filepath.Join(dir, LegacyFolder, "ws-a", "run-1", "weights")
	for d, content := range map[string]string{
		"old": "old", "old.tmp-0123456789ab": "tmp", "gone": "gone",
		"g@" + gen: "g", "g@1": "stale generation", "g": "plain g",
		"t@" + gen + "@trash": "t", "other@" + gen + "@trash": "deleted",
	} {
		require.NoError(t, os.MkdirAll(filepath.Join(kd, d), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(kd, d, "adapter_model.safetensors"), []byte(content), 0o644))
		require.NoError(t, WriteMarker(filepath.Join(kd, d)))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(kd, "incomplete@"+gen), 0o755)) // no marker
	require.NoError(t, os.WriteFile(filepath.Join(dir, LegacyFolder, "ws-a", "notes.txt"), []byte("x"), 0o644))
	recs := &records{}
	for _, name := range []string{"old", "g", "t", "incomplete"} {
		recs.put("ws-a", record("run-1", kinds[0], name, created))
	}
	require.NoError(t, f.Migrate(ctx, recs))

	keys, err := f.Store().List(ctx, "")
	require.NoError(t, err)
	require.Len(t, keys, 3)
	for _, name := range []string{"old", "g", "t"} {
		key, err := RecordKey("ws-a", record("run-1", kinds[0], name, created))
		require.NoError(t, err)
		ref, ok, err := f.Open(ctx, key)
		require.NoError(t, err)
		require.True(t, ok, name)
		got, err := os.ReadFile(filepath.Join(ref.Dir(), "adapter_model.safetensors"))
		require.NoError(t, err)
		require.Equal(t, name, string(got), "the generation's own folder is moved")
		ref.Release()
	}
	_, err = os.Stat(filepath.Join(dir, LegacyFolder, "ws-a", "run-1"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.FileExists(t, filepath.Join(dir, LegacyFolder, "ws-a", "notes.txt"), "files are not the migration's to remove")

	// A data dir without the old layout has nothing to do.
	g, _ := newFiles(t, nil)
	require.NoError(t, g.Migrate(ctx, recs))
}
