package ckstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Cache keeps local copies of committed checkpoints for the readers that need a folder
// (a sampler or trainer loading an adapter), fetched once per checkpoint generation and
// removed, least recently used first, when the copies not in use exceed MaxBytes.
type Cache struct {
	store    Store
	dir      string
	maxBytes int64
	log      *slog.Logger

	mu      sync.Mutex
	entries map[string]*cacheEntry // by key
	stale   []*cacheEntry          // replaced generations still in use
	total   int64
}

type cacheEntry struct {
	key   string
	gen   string
	dir   string
	size  int64
	refs  int
	used  time.Time
	ready chan struct{} // closed when the fetch ended
	err   error         // the fetch's error, once ready is closed
	m     *Manifest
}

// NewCache returns a cache of the checkpoints of s in the folder dir, which it empties
// (its content is disposable). maxBytes bounds the copies not in use; copies in use are
// never removed.
func NewCache(s Store, dir string, maxBytes int64) (*Cache, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("ckstore: emptying cache folder: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ckstore: creating cache folder: %w", err)
	}
	return &Cache{store: s, dir: dir, maxBytes: maxBytes, log: slog.Default().With(slog.String("checkpoint_cache", dir)), entries: map[string]*cacheEntry{}}, nil
}

// Get returns a local folder holding the current version of the checkpoint key, and its
// manifest. The folder stays as it is, even if the checkpoint is overwritten or deleted,
// until release is called; the caller must not modify it. A later Get after an overwrite
// fetches the new version.
func (c *Cache) Get(ctx context.Context, key string) (dir string, m *Manifest, release func(), err error) {
	cur, err := c.store.Stat(ctx, key)
	if err != nil {
		return "", nil, nil, err
	}
	for range fetchAttempts {
		c.mu.Lock()
		e := c.entries[key]
		if e != nil && e.gen != cur.Generation {
			select {
			case <-e.ready:
				c.retireLocked(e)
				e = nil
			default:
				// Another Get is fetching: wait for it, then look again.
			}
		}
		if e == nil {
			e = &cacheEntry{key: key, gen: cur.Generation, ready: make(chan struct{})}
			e.dir = filepath.Join(c.dir, folderName(key, cur.Generation))
			e.refs = 1
			c.entries[key] = e
			c.mu.Unlock()
			c.fetch(ctx, e)
			if e.err != nil {
				return "", nil, nil, e.err
			}
			return e.dir, e.m, c.releaser(e), nil
		}
		e.refs++
		c.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			c.release(e)
			return "", nil, nil, ctx.Err()
		}
		if e.err != nil {
			c.release(e)
			if errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.DeadlineExceeded) {
				continue // the fetching caller gave up; try ourselves
			}
			return "", nil, nil, e.err
		}
		if e.gen != cur.Generation {
			// That fetch found a newer version than our Stat, or ours is newer still.
			c.release(e)
			if cur, err = c.store.Stat(ctx, key); err != nil {
				return "", nil, nil, err
			}
			continue
		}
		return e.dir, e.m, c.releaser(e), nil
	}
	return "", nil, nil, fmt.Errorf("ckstore: caching %q: overwritten %d times while reading: retry", key, fetchAttempts)
}

// fetch downloads e and records the outcome.
func (c *Cache) fetch(ctx context.Context, e *cacheEntry) {
	m, err := c.store.Fetch(ctx, e.key, e.dir)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer close(e.ready)
	if err == nil && m.Generation != e.gen {
		// Overwritten between Stat and Fetch: the copy is newer; name it for what it is.
		newDir := filepath.Join(c.dir, folderName(e.key, m.Generation))
		if err = os.Rename(e.dir, newDir); err == nil {
			e.dir, e.gen = newDir, m.Generation
		}
	}
	if err != nil {
		e.err = err
		e.refs--
		if c.entries[e.key] == e {
			delete(c.entries, e.key)
		}
		_ = os.RemoveAll(e.dir)
		return
	}
	e.m, e.size, e.used = m, m.Size(), time.Now()
	c.total += e.size
	c.evictLocked()
}

func (c *Cache) releaser(e *cacheEntry) func() {
	var once sync.Once
	return func() { once.Do(func() { c.release(e) }) }
}

func (c *Cache) release(e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	e.used = time.Now()
	if e.refs == 0 && c.entries[e.key] != e {
		c.removeLocked(e)
	}
	c.evictLocked()
}

// retireLocked replaces e, a finished entry of an older generation.
func (c *Cache) retireLocked(e *cacheEntry) {
	delete(c.entries, e.key)
	if e.err != nil {
		return
	}
	if e.refs == 0 {
		c.removeLocked(e)
		return
	}
	c.stale = append(c.stale, e)
}

func (c *Cache) removeLocked(e *cacheEntry) {
	if err := os.RemoveAll(e.dir); err != nil {
		c.log.Warn("removing a cached checkpoint", slog.String("dir", e.dir), slog.Any("err", err))
	}
	c.total -= e.size
	for i, s := range c.stale {
		if s == e {
			c.stale = append(c.stale[:i], c.stale[i+1:]...)
			break
		}
	}
}

// evictLocked removes unused copies, least recently used first, while the unused ones
// exceed maxBytes.
func (c *Cache) evictLocked() {
	for {
		var unused int64
		var oldest *cacheEntry
		for _, e := range c.entries {
			if e.refs == 0 && e.m != nil {
				unused += e.size
				if oldest == nil || e.used.Before(oldest.used) {
					oldest = e
				}
			}
		}
		if unused <= c.maxBytes || oldest == nil {
			return
		}
		delete(c.entries, oldest.key)
		c.removeLocked(oldest)
	}
}

// folderName is a checkpoint generation's folder in the cache: a hash of the key (keys
// nest, folders must not) and the generation.
func folderName(key, gen string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:12]) + "-" + gen
}
