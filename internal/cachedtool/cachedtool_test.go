package cachedtool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBuildsOnceIntoTheCache: the first Binary builds into ~/.cache/loops/bin/NAME-VERSION
// (nothing else left there), a second Tool finds it without building, and the environment
// variable overrides it.
func TestBuildsOnceIntoTheCache(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	builds := 0
	build := func(_ context.Context, tmp string) (string, error) {
		builds++
		bin := filepath.Join(tmp, "tool")
		return bin, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755)
	}
	a := &Tool{Name: "tool", Version: "v1", EnvVar: "LOOPS_TEST_TOOL_BIN", Timeout: time.Minute, Build: build}
	path := a.Binary(t)
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(home, ".cache", "loops", "bin", "tool-v1"), path)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "the build folder is removed")
	require.Equal(t, path, a.Binary(t))
	b := &Tool{Name: "tool", Version: "v1", EnvVar: "LOOPS_TEST_TOOL_BIN", Timeout: time.Minute, Build: build}
	require.Equal(t, path, b.Binary(t))
	require.Equal(t, 1, builds)

	other := filepath.Join(t.TempDir(), "mine")
	require.NoError(t, os.WriteFile(other, nil, 0o755))
	t.Setenv("LOOPS_TEST_TOOL_BIN", other)
	require.Equal(t, other, b.Binary(t))
}

// TestFailedBuildSkipsOutsideCI: a build that fails leaves nothing in the cache and skips
// the test (CI=true fails it instead, which this test cannot show from inside).
func TestFailedBuildSkipsOutsideCI(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CI", "")
	tool := &Tool{Name: "broken", Version: "v1", EnvVar: "LOOPS_TEST_BROKEN_BIN", Timeout: time.Minute,
		Build: func(context.Context, string) (string, error) { return "", errors.New("offline") }}
	skipped := t.Run("uses the tool", func(t *testing.T) {
		tool.Binary(t)
		t.Error("Binary returned after a failed build")
	})
	require.True(t, skipped, "a skipped subtest counts as passed")
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	entries, err := os.ReadDir(filepath.Join(home, ".cache", "loops", "bin"))
	require.NoError(t, err)
	require.Empty(t, entries)
}
