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
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/validate"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Checkpoint files
//
// A checkpoint's files live in the checkpoint store (package ckstore: a local folder, by
// default DataDir/checkpoint-store, or an S3-compatible bucket) under the key
// <workspace>/<run>/<kind>/<name>@<generation>, where the generation is the checkpoint's
// create_time in Unix nanoseconds (kept increasing: see nextGeneration). The store record is
// the commit point. A save has the backend write a staging folder
// (DataDir/checkpoint-staging/…), puts it into the checkpoint store as the new generation's
// key (its manifest written last, so the key is whole or absent), then replaces the record,
// then deletes the previous generation's key; a delete deletes the record, then the key. So a
// crash at any step leaves either the old or the new checkpoint, complete and listed. Keys
// that no record references (a generation put but never recorded, one replaced or deleted by
// a process that died before deleting it) are removed by sweepStore, at start-up and every
// checkpointSweepEvery, once older than Options.CheckpointSweepGrace, which also lets another
// gateway's save in progress be.
//
// Readers need a local folder (the backends load adapters from folders): the store's own
// folder for the local store (ckstore.LocalDirs, no copy), or a verified copy in the cache
// (DataDir/checkpoint-cache, ckstore.Cache, bounded by Options.CheckpointCacheBytes) for
// S3, held while in use (see ckRef).
//
// Data dirs written before the checkpoint store existed kept generation folders under
// DataDir/checkpoints; migrateFolders moves the ones that records reference into the store at
// start-up and removes the rest (see its comment).

// ckStep names a step of a checkpoint save or delete (see checkpointFiles.step).
type ckStep string

// The steps of saves and deletes, in order.
const (
	stepSaveMkdir   ckStep = "save: create the staging folder"
	stepSaveWrite   ckStep = "save: backend writes the staging folder"
	stepSaveMarker  ckStep = "save: write the checkpoint_complete marker"
	stepSavePut     ckStep = "save: put the files into the checkpoint store"
	stepSaveRecord  ckStep = "save: replace the store record"
	stepSaveRemove  ckStep = "save: delete the previous generation"
	stepSaveCleanup ckStep = "save: delete the unrecorded generation"
	stepDelRecord   ckStep = "delete: delete the store record"
	stepDelRemove   ckStep = "delete: delete the files"
)

// Folders in the data dir.
const (
	// localStoreFolder is the default (local) checkpoint store.
	localStoreFolder = "checkpoint-store"
	// stagingFolder holds saves being written by the backend; emptied at start-up.
	stagingFolder = "checkpoint-staging"
	// cacheFolder holds the S3 store's cached copies; emptied at start-up.
	cacheFolder = "checkpoint-cache"
	// legacyFolder is where versions before the checkpoint store kept checkpoints.
	legacyFolder = "checkpoints"
)

// Defaults of the checkpoint options.
const (
	// DefaultCheckpointCacheBytes is Options.CheckpointCacheBytes when unset.
	DefaultCheckpointCacheBytes int64 = 20 << 30
	// DefaultCheckpointSweepGrace is Options.CheckpointSweepGrace when unset.
	DefaultCheckpointSweepGrace = time.Hour
	// checkpointSweepEvery is how often the janitor sweeps the checkpoint store.
	checkpointSweepEvery = time.Hour
)

// checkpointFiles keeps checkpoint files in the checkpoint store.
type checkpointFiles struct {
	st ckstore.Store
	// local is st when it is the local store (readers use its folders in place), else nil.
	local ckstore.LocalDirs
	// localRoot is the local store's folder, symbolic links resolved ("" for S3).
	localRoot string
	// cache keeps local copies of an S3 store's checkpoints (nil for the local store).
	cache *ckstore.Cache
	// urls is st when the backend takes checkpoints as presigned URLs
	// (checkpoint_urls) and the store hands them out (ckstore.Uploads): the backend then
	// reads and writes the store itself, with nothing on the gateway's disk. Else nil.
	urls ckstore.Uploads
	// staging is DataDir/checkpoint-staging.
	staging string
	// grace is Options.CheckpointSweepGrace.
	grace time.Duration

	// hide maps the absolute spellings of the data dir, longest first, to what error
	// messages show instead.
	hide [][2]string

	// locks serialise changes to one checkpoint's record and the keys it points at, one
	// lock per checkpoint, so that one workspace's slow save or delete never waits on
	// another's (see lock).
	locks keyLocks
	// genMu guards lastGen, the last generation this process issued.
	genMu   sync.Mutex
	lastGen int64

	// sweepMu makes sweeps one at a time; lastSweep is when the last one started; swept
	// is closed when the start-up sweep is done.
	sweepMu   sync.Mutex
	lastSweep time.Time
	swept     chan struct{}

	// fault, when set (tests only), runs before each step; an error makes the step fail
	// without doing anything.
	fault func(ckStep) error
}

func newCheckpointFiles(opts Options) (*checkpointFiles, error) {
	dataDir := opts.DataDir
	f := &checkpointFiles{st: opts.CheckpointStore, staging: filepath.Join(dataDir, stagingFolder), grace: opts.CheckpointSweepGrace}
	var err error
	if f.st == nil {
		// The staging folder is on the same file system: saves are linked, not copied.
		if f.st, err = ckstore.NewLocal(filepath.Join(dataDir, localStoreFolder), ckstore.Options{LinkFiles: true}); err != nil {
			return nil, fmt.Errorf("core: opening the checkpoint store: %w", err)
		}
	}
	if l, ok := f.st.(ckstore.LocalDirs); ok {
		f.local = l
		f.localRoot = f.st.String()
	} else if f.cache, err = ckstore.NewCache(f.st, filepath.Join(dataDir, cacheFolder), opts.CheckpointCacheBytes); err != nil {
		return nil, fmt.Errorf("core: %w", err)
	}
	if err := os.RemoveAll(f.staging); err != nil {
		return nil, fmt.Errorf("core: emptying the checkpoint staging folder: %w", err)
	}
	if err := os.MkdirAll(f.staging, 0o755); err != nil {
		return nil, fmt.Errorf("core: creating the checkpoint staging folder: %w", err)
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("core: data dir: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("core: data dir: %w", err)
	}
	// Only absolute spellings: a relative one could match inside other words.
	for _, p := range []string{real, abs} {
		f.hide = append(f.hide, [2]string{p + string(filepath.Separator), ""}, [2]string{p, "."})
	}
	if f.localRoot != "" && !strings.HasPrefix(f.localRoot, real) && !strings.HasPrefix(f.localRoot, abs) {
		f.hide = append(f.hide, [2]string{f.localRoot + string(filepath.Separator), ""}, [2]string{f.localRoot, "."})
	}
	slices.SortStableFunc(f.hide, func(a, b [2]string) int { return len(b[0]) - len(a[0]) })
	return f, nil
}

// step runs the test hook of a step.
func (f *checkpointFiles) step(s ckStep) error {
	if f.fault != nil {
		return f.fault(s)
	}
	return nil
}

// generation is a checkpoint's generation: its create_time in Unix nanoseconds.
func generation(ck *loopsv1.Checkpoint) int64 { return ck.GetCreateTime().AsTime().UnixNano() }

func genEntry(name string, gen int64) string { return name + "@" + strconv.FormatInt(gen, 10) }

// runPrefix is the key prefix of a run's checkpoints; it refuses workspace and run ids that
// are not plain names.
func runPrefix(ws, runID string) (string, error) {
	for _, e := range []string{ws, runID} {
		if e == "" || e == "." || e == ".." || strings.ContainsAny(e, `/\@`) || strings.ContainsRune(e, 0) {
			return "", connect.NewError(connect.CodeInternal, fmt.Errorf("checkpoint key element %q is not a plain name; refused", e))
		}
	}
	return ws + "/" + runID, nil
}

// key is the store key of one generation of a checkpoint.
func (f *checkpointFiles) key(ws, runID string, kind loopsv1.CheckpointKind, name string, gen int64) (string, error) {
	p, err := runPrefix(ws, runID)
	if err != nil {
		return "", err
	}
	k := p + "/" + kindSegment(kind) + "/" + genEntry(name, gen)
	if err := ckstore.ValidKey(k); err != nil {
		return "", internal("checkpoint key", err)
	}
	return k, nil
}

// recordKey is the store key of the generation a record points at.
func (f *checkpointFiles) recordKey(ws string, ck *loopsv1.Checkpoint) (string, error) {
	if err := validate.CheckpointName(ck.GetName()); err != nil {
		return "", internal("checkpoint record "+ck.GetTinkerPath()+" has a bad name", err)
	}
	return f.key(ws, ck.GetTrainingRunId(), ck.GetKind(), ck.GetName(), generation(ck))
}

// inside checks, for the local store, that the folder of key, with its deepest existing
// ancestor's symbolic links resolved, is inside the store's folder.
func (f *checkpointFiles) inside(key string) error {
	if f.localRoot == "" {
		return nil
	}
	p := filepath.Join(f.localRoot, filepath.FromSlash(key))
	q := p
	for {
		real, err := filepath.EvalSymlinks(q)
		if err == nil {
			rel, err := filepath.Rel(f.localRoot, real)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("checkpoint folder %s resolves outside the checkpoint store (a symbolic link?); refused", f.rel(p)))
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return f.internalFS("resolving checkpoint folder "+f.rel(p), err)
		}
		parent := filepath.Dir(q)
		if parent == q || len(parent) < len(f.localRoot) {
			return f.internalFS("resolving checkpoint folder "+f.rel(p), err)
		}
		q = parent
	}
}

// nextGeneration picks the generation of a new save: its time, but always after the
// previous generation and every generation this process issued.
func (f *checkpointFiles) nextGeneration(now time.Time, prev *loopsv1.Checkpoint) int64 {
	g := now.UnixNano()
	if prev != nil {
		g = max(g, generation(prev)+1)
	}
	f.genMu.Lock()
	defer f.genMu.Unlock()
	g = max(g, f.lastGen+1)
	f.lastGen = g
	return g
}

// lock takes the lock of one checkpoint (workspace, run, checkpoint id), held across the
// read-check-write of its record and the changes to its keys; call the returned func to
// release it.
func (f *checkpointFiles) lock(ws, runID, id string) (unlock func()) {
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

// ckRef is a local folder holding one checkpoint generation's files, kept while held:
// release it when done. hold adds a holder (a sampling request of a sampler that holds it).
// For a backend that takes URLs (checkpointFiles.urls), a ckRef from adapter has no folder
// but the generation's manifest, from which source presigns the files' URLs.
type ckRef struct {
	dir string
	key string
	m   *ckstore.Manifest
	mu  sync.Mutex
	n   int
	// free lets the folder go (the cache may evict it); nil for the local store.
	free func()
}

func (r *ckRef) hold() *ckRef {
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	return r
}

func (r *ckRef) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.n--
	last := r.n == 0
	r.mu.Unlock()
	if last && r.free != nil {
		r.free()
	}
}

// open returns a local folder with the files of the checkpoint generation key: the local
// store's own folder, or a cached copy of an S3 one. ok is false when the store has no such
// checkpoint.
func (f *checkpointFiles) open(ctx context.Context, key string) (*ckRef, bool, error) {
	if err := f.inside(key); err != nil {
		return nil, false, err
	}
	var (
		dir  string
		free func()
		err  error
	)
	if f.local != nil {
		dir, _, err = f.local.LocalDir(ctx, key)
	} else {
		dir, _, free, err = f.cache.Get(ctx, key)
	}
	switch {
	case errors.Is(err, ckstore.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, f.internalFS("reading checkpoint "+key, err)
	}
	return &ckRef{dir: dir, key: key, n: 1, free: free}, true, nil
}

// adapter returns what the backend reads the checkpoint generation key from: a ckRef with
// a local folder (open), or, when the backend takes URLs, one with the manifest. ok is
// false when the store has no such checkpoint.
func (f *checkpointFiles) adapter(ctx context.Context, key string) (*ckRef, bool, error) {
	if f.urls == nil {
		return f.open(ctx, key)
	}
	m, err := f.st.Stat(ctx, key)
	switch {
	case errors.Is(err, ckstore.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, f.internalFS("reading checkpoint "+key, err)
	}
	return &ckRef{key: key, m: m, n: 1}, true, nil
}

// checkpointURLTTL is how long the URLs of a backend request stay valid: past the longest
// wait of a request in the queues.
const checkpointURLTTL = 2 * time.Hour

// source returns the folder (dir) or presigned files (files) a backend request names for
// the checkpoint ref holds; a nil ref is no adapter.
func (f *checkpointFiles) source(ctx context.Context, ref *ckRef) (dir string, files []*backendv1.FileURL, err error) {
	if ref == nil {
		return "", nil, nil
	}
	if ref.m == nil {
		return ref.dir, nil, nil
	}
	urls, err := f.urls.DownloadURLs(ctx, ref.key, ref.m, checkpointURLTTL)
	if err != nil {
		return "", nil, f.internalFS("presigning checkpoint "+ref.key, err)
	}
	for _, file := range ref.m.Files {
		files = append(files, &backendv1.FileURL{Name: file.Name, Url: urls[file.Name], Size: file.Size, Sha256: file.SHA256})
	}
	return "", files, nil
}

// rel shows a path relative to the data dir.
func (f *checkpointFiles) rel(p string) string { return f.hideText(p) }

// hideText replaces the data dir's absolute spellings in a message with relative paths.
func (f *checkpointFiles) hideText(s string) string {
	for _, h := range f.hide {
		s = strings.ReplaceAll(s, h[0], h[1])
	}
	return s
}

// scrub returns err with the server's absolute paths made relative (os errors name the
// path); a connect error keeps its code.
func (f *checkpointFiles) scrub(err error) error {
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
func (f *checkpointFiles) internalFS(what string, err error) error {
	return internal(what, f.scrub(err))
}

// writeMarker writes the checkpoint_complete marker into dir.
func writeMarker(dir string) error {
	return os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o644)
}

// parseKey splits a store key written by this package into its parts; ok is false for
// any other key.
func parseKey(key string) (ws, runID string, kind loopsv1.CheckpointKind, name string, gen int64, ok bool) {
	parts := strings.Split(key, "/")
	if len(parts) != 4 {
		return "", "", 0, "", 0, false
	}
	switch parts[2] {
	case "weights":
		kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING
	case "sampler_weights":
		kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER
	case "external_weights":
		kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL
	default:
		return "", "", 0, "", 0, false
	}
	name, g, found := strings.Cut(parts[3], "@")
	gen, err := strconv.ParseInt(g, 10, 64)
	if !found || err != nil || strconv.FormatInt(gen, 10) != g { // only the spelling genEntry writes
		return "", "", 0, "", 0, false
	}
	return parts[0], parts[1], kind, name, gen, true
}

// sweepStore deletes the checkpoint keys that no record references and whose generation is
// older than the grace (a save of this or another gateway may still be about to record it),
// then has the store remove its own leftovers (ckstore Store.Sweep: parts of killed
// uploads) older than the grace. A store error leaves the key alone.
func (c *Core) sweepStore(ctx context.Context) {
	f := c.ckpt
	f.sweepMu.Lock()
	defer f.sweepMu.Unlock()
	f.lastSweep = c.now()
	keys, err := f.st.List(ctx, "")
	if err != nil {
		c.log.Error("listing the checkpoint store to sweep it", slog.Any("err", err))
		return
	}
	cutoff := c.now().Add(-f.grace).UnixNano()
	for _, key := range keys {
		if gen, ok := isSnapshotKey(key); ok {
			// A step snapshot no live run holds as its recovery point (one replaced, or
			// left by a gateway that died) is garbage once past the grace.
			if _, live := c.liveSnapshots.Load(key); !live && gen < cutoff {
				if err := f.st.Delete(ctx, key); err != nil {
					c.log.Error("deleting a stale step snapshot", slog.String("key", key), slog.Any("err", err))
				}
			}
			continue
		}
		ws, runID, kind, name, gen, ok := parseKey(key)
		if !ok || gen >= cutoff {
			continue
		}
		id := kindSegment(kind) + "/" + name
		gone := func() bool {
			defer f.lock(ws, runID, id)()
			ck, err := c.store.GetCheckpoint(ctx, ws, runID, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				c.log.Error("looking up a checkpoint while sweeping the checkpoint store", slog.String("key", key), slog.Any("err", err))
				return false
			case generation(ck) == gen:
				return false
			}
			if err := f.st.Delete(ctx, key); err != nil {
				c.log.Error("deleting an unreferenced checkpoint", slog.String("key", key), slog.Any("err", err))
				return false
			}
			return true
		}()
		if gone {
			c.log.Info("deleted an unreferenced checkpoint from the checkpoint store", slog.String("key", key))
		}
	}
	if n, err := f.st.Sweep(ctx, "", f.grace); err != nil {
		c.log.Error("sweeping the checkpoint store", slog.Any("err", err))
	} else if n > 0 {
		c.log.Info("removed leftovers of unfinished checkpoint saves", slog.Int("objects", n))
	}
}

// migrateFolders moves the checkpoints of the folder layout that versions before the
// checkpoint store used (DataDir/checkpoints/<ws>/<run>/<kind>/<name>@<gen>, or <name> for
// checkpoints older still, each with a checkpoint_complete marker; <name>@<gen>@trash for a
// delete under way) into the store, then removes the folders. A folder is moved when a
// record references it: its generation's folder, the plain <name> folder when no generation
// folder exists, or the trash of a delete that stopped before its record went. The store
// key is put before the folder is removed, so a crash during the migration leaves either
// (and the next start-up finishes it). Folders no record references were garbage already
// and are removed. Symbolic links and files are left alone.
func (c *Core) migrateFolders(ctx context.Context) error {
	f := c.ckpt
	root := filepath.Join(c.opts.DataDir, legacyFolder)
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
				n, err := c.migrateKind(ctx, filepath.Join(root, ws.Name(), run.Name(), kindSegment(kind)), ws.Name(), run.Name(), kind)
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
		c.log.Info("moved checkpoints of the old folder layout into the checkpoint store", slog.Int("count", moved), slog.String("checkpoint_store", f.st.String()))
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

func (c *Core) migrateKind(ctx context.Context, kd, ws, runID string, kind loopsv1.CheckpointKind) (int, error) {
	f := c.ckpt
	if info, err := os.Lstat(kd); err != nil || !info.IsDir() {
		return 0, nil
	}
	entries, err := os.ReadDir(kd)
	if err != nil {
		return 0, fmt.Errorf("core: reading old checkpoint folder: %w", f.scrub(err))
	}
	records := map[string]*loopsv1.Checkpoint{}
	lookup := func(name string) (*loopsv1.Checkpoint, error) {
		if ck, ok := records[name]; ok {
			return ck, nil
		}
		ck, err := c.store.GetCheckpoint(ctx, ws, runID, kindSegment(kind)+"/"+name)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("core: looking up a checkpoint of the old folder layout: %w", err)
		}
		records[name] = ck // nil: no record
		return ck, nil
	}
	// Which folder holds each record's files: the generation folder, else its trash, else
	// the plain folder.
	rank := func(entry, name string, ck *loopsv1.Checkpoint) int {
		switch entry {
		case genEntry(name, generation(ck)):
			return 3
		case genEntry(name, generation(ck)) + "@trash":
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
		if ck == nil || !exists(filepath.Join(kd, e.Name(), completeMarker)) {
			continue
		}
		if r := rank(e.Name(), name, ck); r > 0 && r > rank(best[name], name, ck) {
			best[name] = e.Name()
		}
	}
	moved := 0
	for name, entry := range best {
		ck := records[name]
		key, err := f.recordKey(ws, ck)
		if err != nil {
			return moved, err
		}
		if _, err := f.st.Stat(ctx, key); errors.Is(err, ckstore.ErrNotFound) {
			if _, err := f.st.Put(ctx, key, filepath.Join(kd, entry)); err != nil {
				return moved, fmt.Errorf("core: moving checkpoint %s into the checkpoint store: %w", ck.GetTinkerPath(), f.scrub(err))
			}
		} else if err != nil {
			return moved, fmt.Errorf("core: moving checkpoint %s into the checkpoint store: %w", ck.GetTinkerPath(), f.scrub(err))
		}
		moved++
	}
	for _, e := range entries {
		if !e.IsDir() { // symbolic links and files are not ours to remove
			continue
		}
		if err := os.RemoveAll(filepath.Join(kd, e.Name())); err != nil {
			c.log.Error("removing a checkpoint folder of the old layout", slog.String("dir", f.rel(filepath.Join(kd, e.Name()))), slog.Any("err", err))
		}
	}
	_ = os.Remove(kd)
	return moved, nil
}

// openCheckpoints prepares the checkpoint store at start-up: it opens it, binds download
// links to the core's clock, moves checkpoints of the old folder layout into it, and starts
// sweeping what a crash left in the background (listing a large bucket takes a while, and a
// gateway taking over from another must start serving at once); storeSwept is closed when
// that sweep is done.
func (c *Core) openCheckpoints(ctx context.Context) error {
	f, err := newCheckpointFiles(c.opts)
	if err != nil {
		return err
	}
	c.ckpt = f
	c.archives.now = c.now
	if err := c.migrateFolders(ctx); err != nil {
		return err
	}
	f.swept = make(chan struct{})
	return c.life.Go("checkpoint store sweep", func(ctx context.Context) {
		defer close(f.swept)
		c.sweepStore(ctx)
	})
}

// CheckpointStore returns the checkpoint store in use.
func (c *Core) CheckpointStore() ckstore.Store { return c.ckpt.st }

// maybeSweepStore runs sweepStore when the last one is checkpointSweepEvery old.
func (c *Core) maybeSweepStore(ctx context.Context, now time.Time) {
	f := c.ckpt
	f.sweepMu.Lock()
	due := now.Sub(f.lastSweep) >= checkpointSweepEvery
	f.sweepMu.Unlock()
	if due {
		c.sweepStore(ctx)
	}
}
