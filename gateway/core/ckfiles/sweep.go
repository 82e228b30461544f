package ckfiles

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Records reads checkpoint records (store.Store has it): the sweep and the migration look up
// which generation a checkpoint's record points at. A missing record is store.ErrNotFound.
type Records interface {
	GetCheckpoint(ctx context.Context, ws, runID, id string) (*loopsv1.Checkpoint, error)
}

// LastSweep is when the last Sweep started (zero: none yet).
func (f *Files) LastSweep() time.Time {
	f.sweepMu.Lock()
	defer f.sweepMu.Unlock()
	return f.lastSweep
}

// Sweep deletes the checkpoint keys that no record references and whose generation is
// older than the grace at now (a save of this or another gateway may still be about to
// record it), and the step snapshots that live does not report as a run's recovery point,
// once past the grace; then it has the store remove its own leftovers (ckstore
// Store.Sweep: parts of killed uploads) older than the grace. A store error leaves the key
// alone. Sweeps run one at a time.
func (f *Files) Sweep(ctx context.Context, now time.Time, records Records, live func(key string) bool) {
	f.sweepMu.Lock()
	defer f.sweepMu.Unlock()
	f.lastSweep = now
	keys, err := f.st.List(ctx, "")
	if err != nil {
		f.log.Error("listing the checkpoint store to sweep it", slog.Any("err", err))
		return
	}
	cutoff := now.Add(-f.grace).UnixNano()
	for _, key := range keys {
		if gen, ok := IsSnapshotKey(key); ok {
			// A step snapshot no live run holds as its recovery point (one replaced, or
			// left by a gateway that died) is garbage once past the grace.
			if !live(key) && gen < cutoff {
				if err := f.st.Delete(ctx, key); err != nil {
					f.log.Error("deleting a stale step snapshot", slog.String("key", key), slog.Any("err", err))
				}
			}
			continue
		}
		ws, runID, kind, name, gen, ok := ParseKey(key)
		if !ok || gen >= cutoff {
			continue
		}
		id := KindSegment(kind) + "/" + name
		gone := func() bool {
			defer f.Lock(ws, runID, id)()
			ck, err := records.GetCheckpoint(ctx, ws, runID, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				f.log.Error("looking up a checkpoint while sweeping the checkpoint store", slog.String("key", key), slog.Any("err", err))
				return false
			case Generation(ck) == gen:
				return false
			}
			if err := f.st.Delete(ctx, key); err != nil {
				f.log.Error("deleting an unreferenced checkpoint", slog.String("key", key), slog.Any("err", err))
				return false
			}
			return true
		}()
		if gone {
			f.log.Info("deleted an unreferenced checkpoint from the checkpoint store", slog.String("key", key))
		}
	}
	if n, err := f.st.Sweep(ctx, "", f.grace); err != nil {
		f.log.Error("sweeping the checkpoint store", slog.Any("err", err))
	} else if n > 0 {
		f.log.Info("removed leftovers of unfinished checkpoint saves", slog.Int("objects", n))
	}
}

// Migrate moves the checkpoints of the folder layout that versions before the checkpoint
// store used (DataDir/checkpoints/<ws>/<run>/<kind>/<name>@<gen>, or <name> for checkpoints
// older still, each with a checkpoint_complete marker; <name>@<gen>@trash for a delete
// under way) into the store, then removes the folders. A folder is moved when a record
// references it: its generation's folder, the plain <name> folder when no generation
// folder exists, or the trash of a delete that stopped before its record went. The store
// key is put before the folder is removed, so a crash during the migration leaves either
// (and the next start-up finishes it). Folders no record references were garbage already
// and are removed. Symbolic links and files are left alone.
func (f *Files) Migrate(ctx context.Context, records Records) error {
	root := filepath.Join(f.dataDir, LegacyFolder)
	wss, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("core: reading the old checkpoint folder: %w", err)
	}
	moved := 0
	for _, ws := range wss {
		if !ws.IsDir() {
			continue
		}
		runs, _ := os.ReadDir(filepath.Join(root, ws.Name()))
		for _, run := range runs {
			if !run.IsDir() {
				continue
			}
			for _, kind := range []loopsv1.CheckpointKind{
				loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING,
				loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER,
				loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL,
			} {
				n, err := f.migrateKind(ctx, records, filepath.Join(root, ws.Name(), run.Name(), KindSegment(kind)), ws.Name(), run.Name(), kind)
				moved += n
				if err != nil {
					return err
				}
			}
			_ = removeEmpty(filepath.Join(root, ws.Name(), run.Name()))
		}
		_ = removeEmpty(filepath.Join(root, ws.Name()))
	}
	_ = os.Remove(root) // only when empty
	if moved > 0 {
		f.log.Info("moved checkpoints of the old folder layout into the checkpoint store", slog.Int("count", moved), slog.String("checkpoint_store", f.st.String()))
	}
	return nil
}

// removeEmpty removes dir and the empty folders under it.
func removeEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			_ = removeEmpty(filepath.Join(dir, e.Name()))
		}
	}
	return os.Remove(dir)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func (f *Files) migrateKind(ctx context.Context, records Records, kd, ws, runID string, kind loopsv1.CheckpointKind) (int, error) {
	if info, err := os.Lstat(kd); err != nil || !info.IsDir() {
		return 0, nil
	}
	entries, err := os.ReadDir(kd)
	if err != nil {
		return 0, fmt.Errorf("core: reading old checkpoint folder: %w", f.Scrub(err))
	}
	found := map[string]*loopsv1.Checkpoint{}
	lookup := func(name string) (*loopsv1.Checkpoint, error) {
		if ck, ok := found[name]; ok {
			return ck, nil
		}
		ck, err := records.GetCheckpoint(ctx, ws, runID, KindSegment(kind)+"/"+name)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("core: looking up a checkpoint of the old folder layout: %w", err)
		}
		found[name] = ck // nil: no record
		return ck, nil
	}
	// Which folder holds each record's files: the generation folder, else its trash, else
	// the plain folder.
	rank := func(entry, name string, ck *loopsv1.Checkpoint) int {
		switch entry {
		case genEntry(name, Generation(ck)):
			return 3
		case genEntry(name, Generation(ck)) + "@trash":
			return 2
		case name:
			return 1
		}
		return 0
	}
	best := map[string]string{} // name -> entry to move
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name, _, _ := strings.Cut(e.Name(), "@")
		ck, err := lookup(name)
		if err != nil {
			return 0, err
		}
		if ck == nil || !exists(filepath.Join(kd, e.Name(), CompleteMarker)) {
			continue
		}
		if r := rank(e.Name(), name, ck); r > 0 && r > rank(best[name], name, ck) {
			best[name] = e.Name()
		}
	}
	moved := 0
	for name, entry := range best {
		ck := found[name]
		key, err := RecordKey(ws, ck)
		if err != nil {
			return moved, err
		}
		if _, err := f.st.Stat(ctx, key); errors.Is(err, ckstore.ErrNotFound) {
			if _, err := f.st.Put(ctx, key, filepath.Join(kd, entry)); err != nil {
				return moved, fmt.Errorf("core: moving checkpoint %s into the checkpoint store: %w", ck.GetTinkerPath(), f.Scrub(err))
			}
		} else if err != nil {
			return moved, fmt.Errorf("core: moving checkpoint %s into the checkpoint store: %w", ck.GetTinkerPath(), f.Scrub(err))
		}
		moved++
	}
	for _, e := range entries {
		if !e.IsDir() { // symbolic links and files are not ours to remove
			continue
		}
		if err := os.RemoveAll(filepath.Join(kd, e.Name())); err != nil {
			f.log.Error("removing a checkpoint folder of the old layout", slog.String("dir", f.Rel(filepath.Join(kd, e.Name()))), slog.Any("err", err))
		}
	}
	_ = os.Remove(kd)
	return moved, nil
}
