package ckfiles

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/apierr"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Folders in the data dir.
const (
	// LocalStoreFolder is the default (local) checkpoint store.
	LocalStoreFolder = "checkpoint-store"
	// StagingFolder holds saves being written by the backend; emptied at start-up.
	StagingFolder = "checkpoint-staging"
	// CacheFolder holds the S3 store's cached copies; emptied at start-up.
	CacheFolder = "checkpoint-cache"
	// LegacyFolder is where versions before the checkpoint store kept checkpoints.
	LegacyFolder = "checkpoints"
)

// CompleteMarker is written last into a checkpoint folder; the tinker CLI checks for it.
const CompleteMarker = "checkpoint_complete"

// URLTTL is how long the URLs of a backend request stay valid: past the longest wait of a
// request in the queues.
const URLTTL = 2 * time.Hour

// Config configures Files.
type Config struct {
	// DataDir holds the staging folder, the S3 store's cache, the local store unless Store
	// is set, and the folders of the old layout (Migrate).
	DataDir string
	// Store is the checkpoint store; nil: a local store in DataDir/checkpoint-store.
	Store ckstore.Store
	// CacheBytes bounds the local copies of an S3 store's checkpoints.
	CacheBytes int64
	// SweepGrace is how old an unreferenced key must be before Sweep deletes it.
	SweepGrace time.Duration
	// Log receives the sweep's and the migration's reports; nil: slog.Default().
	Log *slog.Logger
}

// Files keeps checkpoint files in the checkpoint store. Its methods are safe for concurrent
// use.
type Files struct {
	st ckstore.Store
	// local is st when it is the local store (readers use its folders in place), else nil.
	local ckstore.LocalDirs
	// localRoot is the local store's folder, symbolic links resolved ("" for S3).
	localRoot string
	// cache keeps local copies of an S3 store's checkpoints (nil for the local store).
	cache *ckstore.Cache
	// urls is st when the backend takes checkpoints as presigned URLs (UseURLs). Set before
	// the Files is shared, then only read.
	urls    ckstore.Uploads
	dataDir string
	// staging is DataDir/checkpoint-staging.
	staging string
	grace   time.Duration
	log     *slog.Logger

	// hide maps the absolute spellings of the data dir, longest first, to what error
	// messages show instead.
	hide [][2]string

	// locks serialise changes to one checkpoint's record and the keys it points at (Lock).
	locks keyLocks
	// genMu guards lastGen, the last generation this process issued.
	genMu   sync.Mutex
	lastGen int64

	// sweepMu makes sweeps one at a time; lastSweep is when the last one started.
	sweepMu   sync.Mutex
	lastSweep time.Time
}

// New opens the checkpoint store of cfg (a local one in the data dir unless cfg.Store is
// set), with an emptied staging folder.
func New(cfg Config) (*Files, error) {
	dataDir := cfg.DataDir
	f := &Files{st: cfg.Store, dataDir: dataDir, staging: filepath.Join(dataDir, StagingFolder), grace: cfg.SweepGrace, log: cfg.Log}
	if f.log == nil {
		f.log = slog.Default()
	}
	var err error
	if f.st == nil {
		// The staging folder is on the same file system: saves are linked, not copied.
		if f.st, err = ckstore.NewLocal(filepath.Join(dataDir, LocalStoreFolder), ckstore.Options{LinkFiles: true}); err != nil {
			return nil, fmt.Errorf("core: opening the checkpoint store: %w", err)
		}
	}
	if l, ok := f.st.(ckstore.LocalDirs); ok {
		f.local = l
		f.localRoot = f.st.String()
	} else if f.cache, err = ckstore.NewCache(f.st, filepath.Join(dataDir, CacheFolder), cfg.CacheBytes); err != nil {
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

// Store is the checkpoint store.
func (f *Files) Store() ckstore.Store { return f.st }

// UseURLs has backend requests name checkpoints by presigned URLs of the store, which then
// must hand them out (ckstore.Uploads; ok is false otherwise): the backend reads and writes
// the store itself, with nothing on the gateway's disk. Call it before the Files is used.
func (f *Files) UseURLs() (ok bool) {
	f.urls, ok = f.st.(ckstore.Uploads)
	return ok
}

// URLs is the store's presigned URLs when backends take them (UseURLs), else nil.
func (f *Files) URLs() ckstore.Uploads { return f.urls }

// Staging is the folder backends write saves into (DataDir/checkpoint-staging), emptied
// at start-up: make a folder of one's own in it.
func (f *Files) Staging() string { return f.staging }

// Inside checks, for the local store, that the folder of key, with its deepest existing
// ancestor's symbolic links resolved, is inside the store's folder.
func (f *Files) Inside(key string) error {
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
				return connect.NewError(connect.CodeInternal, fmt.Errorf("checkpoint folder %s resolves outside the checkpoint store (a symbolic link?); refused", f.Rel(p)))
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return f.Internal("resolving checkpoint folder "+f.Rel(p), err)
		}
		parent := filepath.Dir(q)
		if parent == q || len(parent) < len(f.localRoot) {
			return f.Internal("resolving checkpoint folder "+f.Rel(p), err)
		}
		q = parent
	}
}

// NextGeneration picks the generation of a new save at now of the checkpoint whose record
// is prev (nil: none): its time, but always after the previous generation and every
// generation this process issued.
func (f *Files) NextGeneration(now time.Time, prev *loopsv1.Checkpoint) int64 {
	g := now.UnixNano()
	if prev != nil {
		g = max(g, Generation(prev)+1)
	}
	f.genMu.Lock()
	defer f.genMu.Unlock()
	g = max(g, f.lastGen+1)
	f.lastGen = g
	return g
}

// Lock takes the lock of one checkpoint (workspace, run, checkpoint id), held across the
// read-check-write of its record and the changes to its keys; call the returned func to
// release it.
func (f *Files) Lock(ws, runID, id string) (unlock func()) {
	return f.locks.lock(ws + "\x00" + runID + "\x00" + id)
}

// Ref is a local folder holding one checkpoint generation's files, kept while held: Release
// it when done. Hold adds a holder (a sampling request of a sampler that holds it). For a
// backend that takes URLs, a Ref from Adapter has no folder but the generation's manifest,
// from which Source presigns the files' URLs.
type Ref struct {
	dir string
	key string
	m   *ckstore.Manifest
	mu  sync.Mutex
	n   int
	// free lets the folder go (the cache may evict it); nil for the local store.
	free func()
}

// Dir is the local folder holding the files ("" for a Ref of presigned files).
func (r *Ref) Dir() string { return r.dir }

// Key is the store key of the generation r holds.
func (r *Ref) Key() string { return r.key }

// Hold adds a holder and returns r.
func (r *Ref) Hold() *Ref {
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	return r
}

// Release drops a holder; the last one lets the folder go. A nil Ref is none.
func (r *Ref) Release() {
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

// Open returns a local folder with the files of the checkpoint generation key: the local
// store's own folder, or a cached copy of an S3 one. ok is false when the store has no such
// checkpoint.
func (f *Files) Open(ctx context.Context, key string) (*Ref, bool, error) {
	if err := f.Inside(key); err != nil {
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
		return nil, false, f.Internal("reading checkpoint "+key, err)
	}
	return &Ref{dir: dir, key: key, n: 1, free: free}, true, nil
}

// Adapter returns what the backend reads the checkpoint generation key from: a Ref with a
// local folder (Open), or, when the backend takes URLs, one with the manifest. ok is false
// when the store has no such checkpoint.
func (f *Files) Adapter(ctx context.Context, key string) (*Ref, bool, error) {
	if f.urls == nil {
		return f.Open(ctx, key)
	}
	m, err := f.st.Stat(ctx, key)
	switch {
	case errors.Is(err, ckstore.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, f.Internal("reading checkpoint "+key, err)
	}
	return &Ref{key: key, m: m, n: 1}, true, nil
}

// Source returns the folder (dir) or presigned files (files) a backend request names for
// the checkpoint ref holds; a nil ref is no adapter.
func (f *Files) Source(ctx context.Context, ref *Ref) (dir string, files []*backendv1.FileURL, err error) {
	if ref == nil {
		return "", nil, nil
	}
	if ref.m == nil {
		return ref.dir, nil, nil
	}
	urls, err := f.urls.DownloadURLs(ctx, ref.key, ref.m, URLTTL)
	if err != nil {
		return "", nil, f.Internal("presigning checkpoint "+ref.key, err)
	}
	for _, file := range ref.m.Files {
		files = append(files, &backendv1.FileURL{Name: file.Name, Url: urls[file.Name], Size: file.Size, Sha256: file.SHA256})
	}
	return "", files, nil
}

// Rel shows a path relative to the data dir.
func (f *Files) Rel(p string) string { return f.hideText(p) }

// hideText replaces the data dir's absolute spellings in a message with relative paths.
func (f *Files) hideText(s string) string {
	for _, h := range f.hide {
		s = strings.ReplaceAll(s, h[0], h[1])
	}
	return s
}

// Scrub returns err with the server's absolute paths made relative (os errors name the
// path); a connect error keeps its code.
func (f *Files) Scrub(err error) error {
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

// Internal is apierr.Internal with the error's paths made relative.
func (f *Files) Internal(what string, err error) error {
	return apierr.Internal(what, f.Scrub(err))
}

// WriteMarker writes the checkpoint_complete marker into dir.
func WriteMarker(dir string) error {
	return os.WriteFile(filepath.Join(dir, CompleteMarker), nil, 0o644)
}
