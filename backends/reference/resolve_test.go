package reference

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResolveModelDirUsesTheHubHuggingFaceHubUses: a model id is looked up in the one hub
// cache huggingface_hub (and so the torch worker and transformers) would use, here found
// through XDG_CACHE_HOME, at the snapshot refs/main names; a cache huggingface_hub would
// not read is not searched either.
func TestResolveModelDirUsesTheHubHuggingFaceHubUses(t *testing.T) {
	home, xdg := t.TempDir(), t.TempDir()
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", home)
	t.Setenv("XDG_CACHE_HOME", xdg)
	const old, cur = "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222"
	put := func(hub, commit string) string {
		snap := filepath.Join(hub, "models--org--m", "snapshots", commit)
		require.NoError(t, os.MkdirAll(snap, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(snap, "config.json"), []byte("{}"), 0o644))
		return snap
	}
	hub := filepath.Join(xdg, "huggingface", "hub")
	put(hub, old)
	want := put(hub, cur)
	require.NoError(t, os.MkdirAll(filepath.Join(hub, "models--org--m", "refs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(hub, "models--org--m", "refs", "main"), []byte(cur), 0o644))

	dir, tok, err := ResolveModelDir("org/m")
	require.NoError(t, err)
	require.Equal(t, want, dir)
	require.Equal(t, "org/m", tok)

	// ~/.cache/huggingface/hub is not where huggingface_hub looks while XDG_CACHE_HOME is set.
	put(filepath.Join(home, ".cache", "huggingface", "hub"), old)
	t.Setenv("XDG_CACHE_HOME", "")
	dir, _, err = ResolveModelDir("org/m")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(home, ".cache", "huggingface", "hub", "models--org--m", "snapshots", old), dir)
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	_, _, err = ResolveModelDir("org/m")
	require.ErrorContains(t, err, "neither a folder with config.json nor a model in the local Hugging Face cache")

	_, _, err = ResolveModelDir("../../etc")
	require.Error(t, err)
}
