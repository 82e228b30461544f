package ckstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// NewLocal returns the store in the local folder root (created if missing). Objects are
// files under root; each is written to a temporary sibling, synced and renamed into place,
// so a manifest appears whole or not at all and only after its parts are on disk.
func NewLocal(root string, opts Options) (Store, error) {
	if root == "" {
		return nil, fmt.Errorf("%w: empty checkpoint folder", ErrInvalid)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("ckstore: checkpoint folder: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("ckstore: creating checkpoint folder: %w", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, fmt.Errorf("ckstore: checkpoint folder: %w", err)
	}
	return localStore{newObjStore(&localObjects{root: abs, link: opts.LinkFiles}, opts)}, nil
}

// localStore is the local folder's Store; it also implements LocalDirs.
type localStore struct{ *objStore }

// localObjects keeps objects as files under root; with link, putFile hard-links its source
// when it can (Options.LinkFiles).
type localObjects struct {
	root string
	link bool
}

// tmpMarker is in the names of files being written; they are never listed as objects.
const tmpMarker = ".tmp-"

func (l *localObjects) String() string { return l.root }

func (l *localObjects) path(name string) string {
	return filepath.Join(l.root, filepath.FromSlash(name))
}

func (l *localObjects) put(_ context.Context, name string, r io.Reader, size int64) error {
	p := l.path(name)
	dir := filepath.Dir(p)
	var f *os.File
	var err error
	// Retried: a concurrent remove may prune the folders just made while they are empty.
	for range 3 {
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if f, err = os.CreateTemp(dir, filepath.Base(p)+tmpMarker+"*"); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		_ = os.Remove(tmp)
		return err
	}
	n, err := io.Copy(f, r)
	if err != nil {
		return fail(err)
	}
	if n != size {
		return fail(fmt.Errorf("%w: %s: wrote %d bytes, expected %d", ErrInvalid, name, n, size))
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

func (l *localObjects) putFile(ctx context.Context, name, src string, size int64) error {
	if l.link {
		if ok, err := l.linkFile(name, src, size); ok || err != nil {
			return err
		}
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return l.put(ctx, name, f, size)
}

// linkFile puts the object name as a hard link to src (size bytes): linked to a temporary
// name, synced (the source's data may not be on disk yet), renamed into place. ok is false,
// with nothing done, when src cannot be linked (another file system, no hard links).
func (l *localObjects) linkFile(name, src string, size int64) (ok bool, err error) {
	p := l.path(name)
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp := p + tmpMarker + "link-" + newGeneration(time.Now())
	if err := os.Link(src, tmp); err != nil {
		return false, nil
	}
	fail := func(err error) (bool, error) {
		_ = os.Remove(tmp)
		return true, err
	}
	f, err := os.Open(tmp)
	if err != nil {
		return fail(err)
	}
	info, err := f.Stat()
	if err == nil && (!info.Mode().IsRegular() || info.Size() != size) {
		err = fmt.Errorf("%w: %s: %d bytes, expected %d", ErrInvalid, name, info.Size(), size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fail(err)
	}
	return true, syncDir(dir)
}

func (l *localObjects) get(_ context.Context, name string) (io.ReadCloser, error) {
	f, err := os.Open(l.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	return f, err
}

func (l *localObjects) list(_ context.Context, prefix string, fn func(string, time.Time) error) error {
	// Walk the deepest folder that the prefix names whole, then filter by the prefix.
	start := l.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = l.path(prefix[:i])
	}
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(l.root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return fn(name, info.ModTime())
	})
	return err
}

func (l *localObjects) remove(_ context.Context, names ...string) error {
	for _, name := range names {
		p := l.path(name)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		// Remove the folders this left empty, up to the root.
		for dir := filepath.Dir(p); dir != l.root && strings.HasPrefix(dir, l.root); dir = filepath.Dir(dir) {
			if os.Remove(dir) != nil {
				break
			}
		}
	}
	return nil
}

func (l *localObjects) url(_ context.Context, name string, _ time.Duration) (string, error) {
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(l.path(name))}).String(), nil
}

// LocalDirs is implemented by the stores whose checkpoints are local folders (NewLocal),
// so that a reader on the same host can use a checkpoint in place instead of fetching a
// copy.
type LocalDirs interface {
	// LocalDir returns the folder holding the files of the committed checkpoint key and
	// its manifest. The folder is removed when the checkpoint is overwritten or deleted;
	// callers must not modify it.
	LocalDir(ctx context.Context, key string) (string, *Manifest, error)
}

// LocalDir implements LocalDirs.
func (s localStore) LocalDir(ctx context.Context, key string) (string, *Manifest, error) {
	l := s.o.(*localObjects)
	m, err := s.Stat(ctx, key)
	if err != nil {
		return "", nil, err
	}
	return l.path(partsObject(key, m.Generation)), m, nil
}

// Space is implemented by the stores that can tell how full their storage is (the local
// folder: its file system), for the checkpoint store's capacity metrics and alerts.
type Space interface {
	// Space returns the size of the storage holding the checkpoints and the bytes of it
	// still available to the gateway, in bytes.
	Space() (total, available uint64, err error)
}

var _ Space = localStore{}

// Space implements Space: the file system of the folder (statfs).
func (s localStore) Space() (total, available uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.o.(*localObjects).root, &st); err != nil {
		return 0, 0, fmt.Errorf("ckstore: statfs of the checkpoint folder: %w", err)
	}
	bs := uint64(st.Bsize) //nolint:gosec // a block size is positive
	return st.Blocks * bs, st.Bavail * bs, nil
}
