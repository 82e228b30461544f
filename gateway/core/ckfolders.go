package core

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Checkpoint folders
//
// A checkpoint's files live in a generation folder,
// <data-dir>/checkpoints/<workspace>/<run>/<kind>/<name>@<generation>, where the generation
// is the checkpoint's create_time in Unix nanoseconds (kept unique: see nextGeneration). The
// store record is the commit point: a save writes the new generation completely (files, the
// checkpoint_complete marker, fsync), then replaces the record, then removes the previous
// generation; a delete renames the folder to <name>@<generation>@trash, then deletes the
// record, then removes the trash. At start-up, sweepFolders restores a trash folder whose
// record is still there and removes every folder that no record references, so a crash at
// any step leaves either the old or the new checkpoint, complete and listed. A checkpoint
// saved before generations existed lives in the plain <name> folder, which stays its folder
// until it is overwritten or deleted.

// ckStep names a file-system or store step of a checkpoint save or delete (see
// checkpointFolders.step).
type ckStep string

// The steps of saves and deletes, in order.
const (
	stepSaveMkdir   ckStep = "save: create the kind folder"
	stepSaveWrite   ckStep = "save: backend writes the generation folder"
	stepSaveMarker  ckStep = "save: write the checkpoint_complete marker"
	stepSaveSync    ckStep = "save: fsync the generation folder"
	stepSaveRecord  ckStep = "save: replace the store record"
	stepSaveRemove  ckStep = "save: remove the previous generation"
	stepSaveCleanup ckStep = "save: remove the unfinished generation"
	stepDelTrash    ckStep = "delete: rename the folder to trash"
	stepDelRecord   ckStep = "delete: delete the store record"
	stepDelRestore  ckStep = "delete: rename the trash back"
	stepDelRemove   ckStep = "delete: remove the trash"
)

// trashSuffix ends the name of a folder being deleted.
const trashSuffix = "@trash"

// checkpointFolders lays out checkpoint files under <data-dir>/checkpoints and refuses any
// path that leaves it.
type checkpointFolders struct {
	// root is <data-dir>/checkpoints, absolute, symbolic links resolved.
	root string
	// hide maps the absolute spellings of root and of the data dir, longest first, to what
	// error messages show instead.
	hide [][2]string

	// locks serialise changes to one checkpoint's record and the folders it points at, one
	// lock per checkpoint, so that one workspace's slow save or delete never waits on
	// another's (see lock).
	locks keyLocks
	// genMu guards lastGen, the last generation this process issued.
	genMu   sync.Mutex
	lastGen int64

	// fault, when set (tests only), runs before each step; an error makes the step fail
	// without doing anything.
	fault func(ckStep) error
}

func newCheckpointFolders(dataDir string) (*checkpointFolders, error) {
	dir := filepath.Join(dataDir, "checkpoints")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("core: creating data dir: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("core: data dir: %w", err)
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("core: data dir: %w", err)
	}
	f := &checkpointFolders{root: root}
	// Only absolute spellings: a relative one could match inside other words.
	for _, p := range []string{root, abs} {
		f.hide = append(f.hide, [2]string{p + string(filepath.Separator), ""}, [2]string{p, "."})
	}
	for _, p := range []string{filepath.Dir(root), filepath.Dir(abs)} {
		if p != filepath.Dir(p) { // not the file-system root
			f.hide = append(f.hide, [2]string{p + string(filepath.Separator), ""})
		}
	}
	slices.SortStableFunc(f.hide, func(a, b [2]string) int { return len(b[0]) - len(a[0]) })
	return f, nil
}

// step runs the test hook of a step.
func (f *checkpointFolders) step(s ckStep) error {
	if f.fault != nil {
		return f.fault(s)
	}
	return nil
}

// generation is a checkpoint's generation: its create_time in Unix nanoseconds.
func generation(ck *loopsv1.Checkpoint) int64 { return ck.GetCreateTime().AsTime().UnixNano() }

func genEntry(name string, gen int64) string { return name + "@" + strconv.FormatInt(gen, 10) }

// kindDir is the folder of a run's checkpoints of one kind; it checks that the folder stays
// inside the checkpoint store, symbolic links included.
func (f *checkpointFolders) kindDir(ws, runID string, kind loopsv1.CheckpointKind) (string, error) {
	for _, e := range []string{ws, runID} {
		if e == "" || e == "." || e == ".." || strings.ContainsAny(e, `/\`) || strings.ContainsRune(e, 0) {
			return "", connect.NewError(connect.CodeInternal, fmt.Errorf("checkpoint folder element %q is not a plain name; refused", e))
		}
	}
	dir := filepath.Join(f.root, ws, runID, kindSegment(kind))
	return dir, f.inside(dir)
}

// inside checks that p, with its deepest existing ancestor's symbolic links resolved, is
// inside the checkpoint store.
func (f *checkpointFolders) inside(p string) error {
	q := p
	for {
		real, err := filepath.EvalSymlinks(q)
		if err == nil {
			rel, err := filepath.Rel(f.root, real)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("checkpoint folder %s resolves outside the checkpoint store (a symbolic link?); refused", f.rel(p)))
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return f.internalFS("resolving checkpoint folder "+f.rel(p), err)
		}
		parent := filepath.Dir(q)
		if parent == q || len(parent) < len(f.root) {
			return f.internalFS("resolving checkpoint folder "+f.rel(p), err)
		}
		q = parent
	}
}

// nextGeneration picks the generation of a new save of name: its time, but always after the
// previous generation and every generation this process issued, and never one with a folder
// (or trash) still on disk.
func (f *checkpointFolders) nextGeneration(now time.Time, prev *loopsv1.Checkpoint, kindDir, name string) int64 {
	g := now.UnixNano()
	if prev != nil {
		g = max(g, generation(prev)+1)
	}
	for {
		g = f.reserveGeneration(g)
		// The look at the disk happens outside genMu: reserved generations are never
		// handed out twice, so none can be taken meanwhile.
		if !exists(filepath.Join(kindDir, genEntry(name, g))) && !exists(filepath.Join(kindDir, genEntry(name, g)+trashSuffix)) {
			return g
		}
		g++
	}
}

// reserveGeneration returns the first generation at or after g that this process has not
// issued, and marks it issued.
func (f *checkpointFolders) reserveGeneration(g int64) int64 {
	f.genMu.Lock()
	defer f.genMu.Unlock()
	g = max(g, f.lastGen+1)
	f.lastGen = g
	return g
}

// lock takes the lock of one checkpoint (workspace, run, checkpoint id), held across the
// read-check-write of its record and the renames of its folders; call the returned func
// to release it.
func (f *checkpointFolders) lock(ws, runID, id string) (unlock func()) {
	return f.locks.lock(ws + "\x00" + runID + "\x00" + id)
}

// keyLocks is a set of mutexes by key. An entry lives only while someone holds or waits
// for it, so the map is bounded by the callers in flight.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	refs int
}

func (k *keyLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// current returns the folder that holds ck's files: its generation folder, or the plain
// <name> folder of a checkpoint saved before generations existed; ok is false when
// neither is complete.
func (f *checkpointFolders) current(ws string, ck *loopsv1.Checkpoint) (dir string, ok bool, err error) {
	kd, err := f.kindDir(ws, ck.GetTrainingRunId(), ck.GetKind())
	if err != nil {
		return "", false, err
	}
	if err := validateCheckpointName(ck.GetName()); err != nil {
		return "", false, internal("checkpoint record "+ck.GetTinkerPath()+" has a bad name", err)
	}
	for _, e := range []string{genEntry(ck.GetName(), generation(ck)), ck.GetName()} {
		d := filepath.Join(kd, e)
		if !exists(d) {
			continue
		}
		if err := f.inside(d); err != nil {
			return "", false, err
		}
		_, err := os.Stat(filepath.Join(d, completeMarker))
		return d, err == nil, nil
	}
	return "", false, nil
}

// rel shows a path relative to the checkpoint store.
func (f *checkpointFolders) rel(p string) string { return f.hideText(p) }

// hideText replaces the data dir's absolute spellings in a message with paths relative to
// the checkpoint store.
func (f *checkpointFolders) hideText(s string) string {
	for _, h := range f.hide {
		s = strings.ReplaceAll(s, h[0], h[1])
	}
	return s
}

// scrub returns err with the server's absolute paths made relative (os errors name the
// path); a connect error keeps its code.
func (f *checkpointFolders) scrub(err error) error {
	if err == nil {
		return nil
	}
	if msg := err.Error(); f.hideText(msg) == msg {
		return err
	}
	if ce := (*connect.Error)(nil); errors.As(err, &ce) {
		return connect.NewError(ce.Code(), &scrubbedError{msg: f.hideText(ce.Message()), err: ce.Unwrap()})
	}
	return &scrubbedError{msg: f.hideText(err.Error()), err: err}
}

// scrubbedError is an error whose message had absolute paths removed.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// internalFS is internal with the error's paths made relative.
func (f *checkpointFolders) internalFS(what string, err error) error {
	return internal(what, f.scrub(err))
}

// syncTree fsyncs every file and folder under dir, then dir's parent, so a completed
// generation survives a power loss before the record points at it.
func syncTree(dir string) error {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		return syncPath(p)
	})
	if err != nil {
		return err
	}
	return syncPath(filepath.Dir(dir))
}

func syncPath(p string) error {
	fh, err := os.Open(p)
	if err != nil {
		return err
	}
	err = fh.Sync()
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeMarker writes the checkpoint_complete marker into dir.
func writeMarker(dir string) error {
	return os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o644)
}

// sweepFolders runs at start-up, before anything is served: it renames back the trash of a
// delete that stopped before its record was deleted, and removes every folder under the
// checkpoint store that no record references (unfinished saves, replaced generations,
// finished deletes, temporary folders of older versions). Symbolic links are neither
// followed nor removed; a store error leaves the folder alone.
func (c *Core) sweepFolders(ctx context.Context) {
	f := c.ckpt
	wss, _ := os.ReadDir(f.root)
	for _, ws := range wss {
		if !ws.IsDir() {
			continue
		}
		runs, _ := os.ReadDir(filepath.Join(f.root, ws.Name()))
		for _, run := range runs {
			if !run.IsDir() {
				continue
			}
			for _, kind := range []loopsv1.CheckpointKind{
				loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING,
				loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER,
				loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL,
			} {
				c.sweepKind(ctx, ws.Name(), run.Name(), kind)
			}
		}
	}
}

func (c *Core) sweepKind(ctx context.Context, ws, runID string, kind loopsv1.CheckpointKind) {
	f := c.ckpt
	kd := filepath.Join(f.root, ws, runID, kindSegment(kind))
	if info, err := os.Lstat(kd); err != nil || !info.IsDir() {
		return
	}
	entries, err := os.ReadDir(kd)
	if err != nil {
		c.log.Error("reading checkpoint folder", slog.String("dir", kd), slog.Any("err", err))
		return
	}
	records := map[string]*loopsv1.Checkpoint{}
	lookup := func(name string) (*loopsv1.Checkpoint, bool) {
		if ck, ok := records[name]; ok {
			return ck, true
		}
		ck, err := c.store.GetCheckpoint(ctx, ws, runID, kindSegment(kind)+"/"+name)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Error("looking up a checkpoint while sweeping its folder", slog.String("dir", kd), slog.String("name", name), slog.Any("err", err))
			return nil, false
		}
		records[name] = ck // nil: no record
		return ck, true
	}
	// Trash first: a delete that stopped before its record went is undone.
	for _, e := range entries {
		name, gen, ok := strings.Cut(strings.TrimSuffix(e.Name(), trashSuffix), "@")
		if !ok || !strings.HasSuffix(e.Name(), trashSuffix) || !e.IsDir() {
			continue
		}
		ck, ok := lookup(name)
		if !ok || ck == nil || strconv.FormatInt(generation(ck), 10) != gen {
			continue
		}
		live := filepath.Join(kd, genEntry(name, generation(ck)))
		if exists(live) {
			continue
		}
		if err := os.Rename(filepath.Join(kd, e.Name()), live); err != nil {
			c.log.Error("restoring the folder of an interrupted checkpoint delete", slog.String("dir", live), slog.Any("err", err))
		} else {
			c.log.Warn("restored the folder of an interrupted checkpoint delete", slog.String("dir", live))
		}
	}
	entries, _ = os.ReadDir(kd)
	for _, e := range entries {
		if !e.IsDir() { // symbolic links and files are not ours to remove
			continue
		}
		name, _, _ := strings.Cut(e.Name(), "@")
		ck, ok := lookup(name)
		if !ok {
			continue
		}
		if ck != nil {
			live := genEntry(name, generation(ck))
			if e.Name() == live || e.Name() == name && !exists(filepath.Join(kd, live)) {
				continue
			}
		}
		if err := os.RemoveAll(filepath.Join(kd, e.Name())); err != nil {
			c.log.Error("removing an unreferenced checkpoint folder", slog.String("dir", filepath.Join(kd, e.Name())), slog.Any("err", err))
			continue
		}
		c.log.Info("removed an unreferenced checkpoint folder", slog.String("dir", filepath.Join(kd, e.Name())))
	}
}

// openCheckpoints prepares the checkpoint store at start-up: it resolves the folder, binds
// download links to the core's clock and sweeps folders left by a crash.
func (c *Core) openCheckpoints(ctx context.Context) error {
	f, err := newCheckpointFolders(c.opts.DataDir)
	if err != nil {
		return err
	}
	c.ckpt = f
	c.archives.now = c.now
	c.sweepFolders(ctx)
	return nil
}
