package ckstore

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// localWith saves a two-file checkpoint at key in a fresh local store and returns the
// store, its root and the manifest.
func localWith(t *testing.T, key string, opts Options) (Store, string, *Manifest) {
	t.Helper()
	root := t.TempDir()
	s, err := NewLocal(root, opts)
	require.NoError(t, err)
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "a.json"), []byte(`{"a":1}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "b.bin"), []byte(strings.Repeat("b", 4096)), 0o644))
	m, err := s.Put(t.Context(), key, src)
	require.NoError(t, err)
	return s, root, m
}

func TestFetchRefusesCorruptParts(t *testing.T) {
	for name, damage := range map[string]func(p string){
		"same size, other bytes": func(p string) { require.NoError(t, os.WriteFile(p, []byte(strings.Repeat("c", 4096)), 0o644)) },
		"shorter":                func(p string) { require.NoError(t, os.Truncate(p, 100)) },
		"longer":                 func(p string) { require.NoError(t, os.WriteFile(p, []byte(strings.Repeat("b", 5000)), 0o644)) },
	} {
		t.Run(name, func(t *testing.T) {
			s, root, m := localWith(t, "k", Options{})
			damage(filepath.Join(root, "k", partsDir, m.Generation, "b.bin"))
			dst := filepath.Join(t.TempDir(), "ck")
			_, err := s.Fetch(t.Context(), "k", dst)
			require.ErrorIs(t, err, ErrCorrupt)
			_, err = os.Stat(dst)
			require.ErrorIs(t, err, os.ErrNotExist, "a failed fetch leaves no folder")
			entries, err := os.ReadDir(filepath.Dir(dst))
			require.NoError(t, err)
			require.Empty(t, entries, "nor a temporary one")

			rc, _, err := s.Open(t.Context(), "k", "b.bin")
			require.NoError(t, err)
			_, err = io.ReadAll(rc)
			require.ErrorIs(t, err, ErrCorrupt)
			require.NoError(t, rc.Close())
		})
	}
}

func TestManifestLimits(t *testing.T) {
	s, root, m := localWith(t, "k", Options{MaxCheckpointBytes: 1 << 20})
	mp := filepath.Join(root, "k", manifestName)
	write := func(m any) {
		b, err := json.Marshal(m)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(mp, b, 0o644))
	}
	fetch := func() error {
		_, err := s.Fetch(t.Context(), "k", filepath.Join(t.TempDir(), "ck"))
		return err
	}

	huge := *m
	huge.Files = append([]File(nil), m.Files...)
	huge.Files[1].Size = 1 << 40
	write(huge)
	require.ErrorIs(t, fetch(), ErrCorrupt, "a size over MaxCheckpointBytes is refused before any download")

	many := *m
	many.Files = nil
	for i := range MaxFiles + 1 {
		many.Files = append(many.Files, File{Name: strings.Repeat("f", 5) + string(rune('a'+i%26)) + strings.Repeat("x", i/26), Size: 1, SHA256: m.Files[0].SHA256})
	}
	write(many)
	require.ErrorIs(t, fetch(), ErrCorrupt)

	require.NoError(t, os.WriteFile(mp, []byte(`{"version":1,"generation":"`+m.Generation+`","files":[`+strings.Repeat(" ", MaxManifestBytes)+`]}`), 0o644))
	require.ErrorIs(t, fetch(), ErrCorrupt, "a manifest over MaxManifestBytes")

	escape := *m
	escape.Files = []File{{Name: "../../etc/passwd", Size: 1, SHA256: m.Files[0].SHA256}}
	write(escape)
	require.ErrorIs(t, fetch(), ErrCorrupt, "a file name leaving the folder")

	badGen := *m
	badGen.Generation = "../x"
	write(badGen)
	require.ErrorIs(t, fetch(), ErrCorrupt)

	write(*m)
	require.NoError(t, fetch(), "the original manifest still works")
}

func TestOpenLocation(t *testing.T) {
	ctx := t.Context()
	_, err := Open(ctx, "", Options{})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = Open(ctx, "gs://bucket", Options{})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = Open(ctx, "s3://", Options{})
	require.ErrorIs(t, err, ErrInvalid)
	dir := filepath.Join(t.TempDir(), "cks")
	s, err := Open(ctx, "file://"+dir, Options{})
	require.NoError(t, err)
	require.Equal(t, dir, s.String())
	t.Setenv("AWS_ENDPOINT_URL_S3", "ftp://x")
	_, err = Open(ctx, "s3://bucket/p", Options{})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestLocalDir(t *testing.T) {
	s, _, m := localWith(t, "ws/r/weights/k", Options{})
	ld, ok := s.(LocalDirs)
	require.True(t, ok)
	dir, got, err := ld.LocalDir(t.Context(), "ws/r/weights/k")
	require.NoError(t, err)
	require.Equal(t, m.Generation, got.Generation)
	b, err := os.ReadFile(filepath.Join(dir, "a.json"))
	require.NoError(t, err)
	require.JSONEq(t, `{"a":1}`, string(b))
	_, _, err = ld.LocalDir(t.Context(), "ws/r/weights/none")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestSweepLeavesForeignObjects(t *testing.T) {
	s, root, _ := localWith(t, "ws/k", Options{})
	foreign := filepath.Join(root, "ws", "notes.txt")
	require.NoError(t, os.WriteFile(foreign, []byte("mine"), 0o644))
	stray := filepath.Join(root, "ws", "k2", manifestName+tmpMarker+"123")
	require.NoError(t, os.MkdirAll(filepath.Dir(stray), 0o755))
	require.NoError(t, os.WriteFile(stray, []byte("{"), 0o644))
	n, err := s.Sweep(t.Context(), "", -time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the unfinished manifest write only")
	_, err = os.Stat(foreign)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Dir(stray))
	require.ErrorIs(t, err, os.ErrNotExist, "its emptied folder went too")
	_, err = s.Fetch(t.Context(), "ws/k", filepath.Join(t.TempDir(), "ck"))
	require.NoError(t, err)
}
