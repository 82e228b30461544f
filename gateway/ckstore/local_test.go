package ckstore_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/ckstoretest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	ckstoretest.HelperMain()
	os.Exit(m.Run())
}

func TestLocalContract(t *testing.T) {
	ckstoretest.Run(t, func(t *testing.T) string { return filepath.Join(t.TempDir(), "checkpoints") })
}

// TestLocalLinkFiles: with LinkFiles the local store hard-links Put's files (the stored part
// is the source's inode: no second write), the checkpoint survives the source's removal and
// reads back verified; without it, it copies.
func TestLocalLinkFiles(t *testing.T) {
	for _, link := range []bool{true, false} {
		src := t.TempDir()
		body := bytes.Repeat([]byte("adapter"), 1000)
		require.NoError(t, os.WriteFile(filepath.Join(src, "adapter_model.safetensors"), body, 0o644))
		root := filepath.Join(t.TempDir(), "store")
		s, err := ckstore.NewLocal(root, ckstore.Options{LinkFiles: link})
		require.NoError(t, err)
		_, err = s.Put(t.Context(), "ws/r/weights/c", src)
		require.NoError(t, err)
		dir, _, err := s.(ckstore.LocalDirs).LocalDir(t.Context(), "ws/r/weights/c")
		require.NoError(t, err)
		a, err := os.Stat(filepath.Join(src, "adapter_model.safetensors"))
		require.NoError(t, err)
		b, err := os.Stat(filepath.Join(dir, "adapter_model.safetensors"))
		require.NoError(t, err)
		require.Equal(t, link, os.SameFile(a, b), "linked: %v", link)
		require.NoError(t, os.RemoveAll(src))
		out := filepath.Join(t.TempDir(), "out")
		_, err = s.Fetch(t.Context(), "ws/r/weights/c", out)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(out, "adapter_model.safetensors"))
		require.NoError(t, err)
		require.Equal(t, body, got)
	}
}
