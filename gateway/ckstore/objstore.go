package ckstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// objects is the object layer that both implementations provide: flat names with forward
// slashes, each object written whole or not at all.
type objects interface {
	// put writes the object name from r (size bytes); a reader sees no object or the
	// previous one until it is complete.
	put(ctx context.Context, name string, r io.Reader, size int64) error
	// putFile writes the object name from the local file src of size bytes.
	putFile(ctx context.Context, name, src string, size int64) error
	// get opens the object name; an error wraps ErrNotFound when it does not exist.
	get(ctx context.Context, name string) (io.ReadCloser, error)
	// list calls fn for every object whose name starts with prefix, in any order.
	list(ctx context.Context, prefix string, fn func(name string, mod time.Time) error) error
	// remove deletes the objects; a missing one is not an error.
	remove(ctx context.Context, names ...string) error
	// url returns a URL that reads the object with a plain GET for at least ttl.
	url(ctx context.Context, name string, ttl time.Duration) (string, error)
	// String says where the objects are.
	String() string
}

// objStore implements Store on objects.
type objStore struct {
	o    objects
	opts Options
	log  *slog.Logger
}

func newObjStore(o objects, opts Options) *objStore {
	opts = opts.withDefaults()
	return &objStore{o: o, opts: opts, log: slog.Default().With(slog.String("checkpoint_store", o.String()))}
}

func (s *objStore) String() string { return s.o.String() }

func manifestObject(key string) string        { return keyPath(key, manifestName) }
func partsObject(key, gen string) string      { return keyPath(key, partsDir, gen) }
func partObject(key, gen, name string) string { return keyPath(key, partsDir, gen, name) }

// Put implements Store.
func (s *objStore) Put(ctx context.Context, key, dir string) (*Manifest, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	files, err := scanDir(dir, s.opts.MaxCheckpointBytes)
	if err != nil {
		return nil, fmt.Errorf("ckstore: saving %q: %w", key, err)
	}
	m := &Manifest{Version: 1, Generation: newGeneration(s.opts.Now()), Files: files}
	for i := range m.Files {
		f := &m.Files[i]
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if f.SHA256, err = hashFile(p, f.Size); err != nil {
			return nil, fmt.Errorf("ckstore: saving %q: %w", key, err)
		}
	}
	for _, f := range m.Files {
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if err := s.o.putFile(ctx, partObject(key, m.Generation, f.Name), p, f.Size); err != nil {
			s.removeGeneration(key, m.Generation)
			return nil, fmt.Errorf("ckstore: saving %q: uploading %s: %w", key, f.Name, err)
		}
		if s.opts.Progress != nil {
			s.opts.Progress(key, f.Name)
		}
	}
	return s.commit(ctx, key, m)
}

// commit writes the manifest m of key, whose generation's parts are all uploaded, and then
// removes the generation it replaced. On failure it removes m's parts.
func (s *objStore) commit(ctx context.Context, key string, m *Manifest) (*Manifest, error) {
	old, err := s.Stat(ctx, key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		// An unreadable previous manifest is replaced; its parts are left to Sweep.
		s.log.Warn("replacing an unreadable checkpoint manifest", slog.String("key", key), slog.Any("err", err))
		old = nil
	}
	m.Created = s.opts.Now().UTC()
	data, err := encodeManifest(m)
	if err != nil {
		return nil, err
	}
	if err := s.o.put(ctx, manifestObject(key), strings.NewReader(string(data)), int64(len(data))); err != nil {
		s.removeGeneration(key, m.Generation)
		return nil, fmt.Errorf("ckstore: saving %q: writing the manifest: %w", key, err)
	}
	if old != nil && old.Generation != m.Generation {
		s.removeGeneration(key, old.Generation)
	}
	return m, nil
}

// removeGeneration removes a generation's parts, logging failures: what it leaves is
// garbage for Sweep. It runs even when the caller's context is cancelled.
func (s *objStore) removeGeneration(key, gen string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.removeUnder(ctx, partsObject(key, gen)+"/"); err != nil {
		s.log.Warn("removing checkpoint parts (Sweep removes them later)", slog.String("key", key), slog.String("generation", gen), slog.Any("err", err))
	}
}

func (s *objStore) removeUnder(ctx context.Context, prefix string) error {
	var names []string
	if err := s.o.list(ctx, prefix, func(name string, _ time.Time) error {
		names = append(names, name)
		return nil
	}); err != nil {
		return err
	}
	return s.o.remove(ctx, names...)
}

// Stat implements Store.
func (s *objStore) Stat(ctx context.Context, key string) (*Manifest, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	rc, err := s.o.get(ctx, manifestObject(key))
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("ckstore: checkpoint %q: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("ckstore: reading the manifest of %q: %w", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("ckstore: reading the manifest of %q: %w", key, err)
	}
	return decodeManifest(key, data, s.opts.MaxCheckpointBytes)
}

// Fetch implements Store.
func (s *objStore) Fetch(ctx context.Context, key, dir string) (*Manifest, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("%w: fetching %q: %s already exists", ErrInvalid, key, dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("ckstore: fetching %q: %w", key, err)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("ckstore: fetching %q: %w", key, err)
	}
	var lastGen string
	for range fetchAttempts {
		m, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		if m.Generation == lastGen {
			return nil, fmt.Errorf("%w: %q: generation %s lacks parts its manifest lists", ErrCorrupt, key, m.Generation)
		}
		lastGen = m.Generation
		tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".fetch-")
		if err != nil {
			return nil, fmt.Errorf("ckstore: fetching %q: %w", key, err)
		}
		err = s.fetchInto(ctx, key, m, tmp)
		if err == nil {
			err = syncDir(tmp)
		}
		if err == nil {
			if err = os.Rename(tmp, dir); err == nil {
				_ = syncDir(parent)
				return m, nil
			}
		}
		_ = os.RemoveAll(tmp)
		if !errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("ckstore: fetching %q: %w", key, err)
		}
		// A part is gone: an overwrite or delete removed this generation. Look again.
	}
	return nil, fmt.Errorf("ckstore: fetching %q: overwritten %d times while reading: retry", key, fetchAttempts)
}

func (s *objStore) fetchInto(ctx context.Context, key string, m *Manifest, tmp string) error {
	for _, f := range m.Files {
		p := filepath.Join(tmp, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		rc, err := s.o.get(ctx, partObject(key, m.Generation, f.Name))
		if err != nil {
			return err
		}
		err = copyToFile(p, newVerifyReader(key, f, rc))
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func copyToFile(p string, r io.Reader) error {
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Open implements Store.
func (s *objStore) Open(ctx context.Context, key, file string) (io.ReadCloser, File, error) {
	if err := validName(file); err != nil {
		return nil, File{}, err
	}
	var lastGen string
	for range fetchAttempts {
		m, err := s.Stat(ctx, key)
		if err != nil {
			return nil, File{}, err
		}
		if m.Generation == lastGen {
			return nil, File{}, fmt.Errorf("%w: %q: generation %s lacks %s", ErrCorrupt, key, m.Generation, file)
		}
		lastGen = m.Generation
		f, ok := m.File(file)
		if !ok {
			return nil, File{}, fmt.Errorf("ckstore: checkpoint %q has no file %q: %w", key, file, ErrNotFound)
		}
		rc, err := s.o.get(ctx, partObject(key, m.Generation, f.Name))
		if err == nil {
			return newVerifyReader(key, f, rc), f, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, File{}, fmt.Errorf("ckstore: opening %s of %q: %w", file, key, err)
		}
	}
	return nil, File{}, fmt.Errorf("ckstore: opening %s of %q: overwritten %d times while reading: retry", file, key, fetchAttempts)
}

// List implements Store.
func (s *objStore) List(ctx context.Context, prefix string) ([]string, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	var keys []string
	err := s.o.list(ctx, listPrefix(prefix), func(name string, _ time.Time) error {
		if key, ok := strings.CutSuffix(name, "/"+manifestName); ok && ValidKey(key) == nil {
			keys = append(keys, key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ckstore: listing %q: %w", prefix, err)
	}
	slices.Sort(keys)
	return keys, nil
}

func listPrefix(prefix string) string {
	if prefix == "" {
		return ""
	}
	return prefix + "/"
}

// Delete implements Store.
func (s *objStore) Delete(ctx context.Context, key string) error {
	m, err := s.Stat(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil
	case errors.Is(err, ErrCorrupt):
		m = nil // its parts are left to Sweep
	case err != nil:
		return err
	}
	if err := s.o.remove(ctx, manifestObject(key)); err != nil {
		return fmt.Errorf("ckstore: deleting %q: %w", key, err)
	}
	if m != nil {
		if err := s.removeUnder(ctx, partsObject(key, m.Generation)+"/"); err != nil {
			// The checkpoint is already invisible: what is left is garbage for Sweep.
			s.log.Warn("removing deleted checkpoint parts (Sweep removes them later)", slog.String("key", key), slog.Any("err", err))
		}
	}
	return nil
}

// URL implements Store.
func (s *objStore) URL(ctx context.Context, key, file string, ttl time.Duration) (string, error) {
	if err := validName(file); err != nil {
		return "", err
	}
	m, err := s.Stat(ctx, key)
	if err != nil {
		return "", err
	}
	if _, ok := m.File(file); !ok {
		return "", fmt.Errorf("ckstore: checkpoint %q has no file %q: %w", key, file, ErrNotFound)
	}
	u, err := s.o.url(ctx, partObject(key, m.Generation, file), ttl)
	if err != nil {
		return "", fmt.Errorf("ckstore: URL for %s of %q: %w", file, key, err)
	}
	return u, nil
}

// Sweep implements Store.
func (s *objStore) Sweep(ctx context.Context, prefix string, olderThan time.Duration) (int, error) {
	if err := validPrefix(prefix); err != nil {
		return 0, err
	}
	type group struct {
		key, gen string
		names    []string
		newest   time.Time
	}
	groups := map[string]*group{}
	committed := map[string]bool{}
	err := s.o.list(ctx, listPrefix(prefix), func(name string, mod time.Time) error {
		if key, ok := strings.CutSuffix(name, "/"+manifestName); ok {
			committed[key] = true
			return nil
		}
		g := &group{key: "", gen: ""}
		id := name // an unfinished local write is a group of its own
		if key, rest, ok := strings.Cut(name, "/"+partsDir+"/"); ok {
			gen, _, _ := strings.Cut(rest, "/")
			id = key + "\x00" + gen
			g.key, g.gen = key, gen
		} else if !strings.Contains(path.Base(name), "@manifest.json"+tmpMarker) {
			return nil // not ours: left alone
		}
		if have, ok := groups[id]; ok {
			g = have
		} else {
			groups[id] = g
		}
		g.names = append(g.names, name)
		if mod.After(g.newest) {
			g.newest = mod
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("ckstore: sweeping %q: %w", prefix, err)
	}
	cutoff := s.opts.Now().Add(-olderThan)
	current := map[string]string{}
	removed := 0
	for _, g := range groups {
		if !g.newest.Before(cutoff) {
			continue
		}
		if g.key != "" && committed[g.key] {
			cur, ok := current[g.key]
			if !ok {
				m, err := s.Stat(ctx, g.key)
				switch {
				case err == nil:
					cur = m.Generation
				case errors.Is(err, ErrNotFound):
				default:
					continue // unreadable now: keep everything of this key
				}
				current[g.key] = cur
			}
			if cur == g.gen {
				continue
			}
		}
		if err := s.o.remove(ctx, g.names...); err != nil {
			return removed, fmt.Errorf("ckstore: sweeping %q: %w", prefix, err)
		}
		removed += len(g.names)
	}
	return removed, nil
}

func encodeManifest(m *Manifest) ([]byte, error) {
	data, err := jsonMarshalIndent(m)
	if err != nil {
		return nil, fmt.Errorf("ckstore: encoding manifest: %w", err)
	}
	if len(data) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: manifest over %d bytes: fewer or shorter file names", ErrInvalid, MaxManifestBytes)
	}
	return data, nil
}
