package ckstore

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCache(t *testing.T) {
	ctx := t.Context()
	s, err := NewLocal(t.TempDir(), Options{})
	require.NoError(t, err)
	put := func(key, tag string, size int) {
		src := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(src, "w"), []byte(strings.Repeat(tag, size)), 0o644))
		_, err := s.Put(ctx, key, src)
		require.NoError(t, err)
	}
	read := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, "w"))
		require.NoError(t, err)
		return string(b)
	}
	cacheDir := filepath.Join(t.TempDir(), "cache")
	c, err := NewCache(s, cacheDir, 250)
	require.NoError(t, err)

	put("a", "1", 100)
	d1, m1, rel1, err := c.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("1", 100), read(d1))
	d1b, _, rel1b, err := c.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, d1, d1b, "the same generation is fetched once")
	rel1b()

	// An overwrite: the next Get fetches the new version; the folder in use stays.
	put("a", "2", 100)
	d2, m2, rel2, err := c.Get(ctx, "a")
	require.NoError(t, err)
	require.NotEqual(t, m1.Generation, m2.Generation)
	require.Equal(t, strings.Repeat("2", 100), read(d2))
	require.Equal(t, strings.Repeat("1", 100), read(d1), "still in use")
	rel1()
	rel1() // releasing twice is harmless
	_, err = os.Stat(d1)
	require.ErrorIs(t, err, os.ErrNotExist, "a replaced generation goes when released")
	rel2()

	// Unused copies beyond 250 bytes are evicted, least recently used first.
	put("b", "b", 100)
	put("c", "c", 100)
	for _, k := range []string{"b", "c"} {
		_, _, rel, err := c.Get(ctx, k)
		require.NoError(t, err)
		rel()
	}
	_, err = os.Stat(d2)
	require.ErrorIs(t, err, os.ErrNotExist, "a, the least recently used, was evicted")
	entries, err := os.ReadDir(cacheDir)
	require.NoError(t, err)
	require.Len(t, entries, 2)

	// Deleted checkpoints are not served.
	require.NoError(t, s.Delete(ctx, "b"))
	_, _, _, err = c.Get(ctx, "b")
	require.ErrorIs(t, err, ErrNotFound)

	// Concurrent Gets of one checkpoint share one fetch and one folder.
	put("d", "d", 100)
	var wg sync.WaitGroup
	dirs := make([]string, 8)
	for i := range dirs {
		wg.Go(func() {
			d, _, rel, err := c.Get(ctx, "d")
			if err != nil {
				t.Error(err)
				return
			}
			dirs[i] = d
			defer rel()
		})
	}
	wg.Wait()
	for _, d := range dirs {
		require.Equal(t, dirs[0], d)
	}
}
