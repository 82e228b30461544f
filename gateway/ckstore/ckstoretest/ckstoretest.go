package ckstoretest

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/stretchr/testify/require"
)

// Environment of the helper process (see HelperMain).
const (
	envHelper   = "LOOPS_CKSTORETEST_HELPER"
	envLocation = "LOOPS_CKSTORETEST_LOCATION"
	envKey      = "LOOPS_CKSTORETEST_KEY"
	envDir      = "LOOPS_CKSTORETEST_DIR"
)

// BigBytes is the size of the large round trip: about a LoRA adapter of a 0.6B model
// with its optimizer state.
const BigBytes = 150 << 20

// HelperMain, called first in TestMain, runs the helper process of the killed-save case
// and exits when the test binary was started as one; otherwise it returns at once.
func HelperMain() {
	if os.Getenv(envHelper) != "put" {
		return
	}
	ctx := context.Background()
	// After its first file the helper waits to be killed, so that the kill lands between
	// the parts and before the manifest every time.
	opts := ckstore.Options{Progress: func(key, file string) {
		fmt.Printf("uploaded %s\n", file)
		time.Sleep(time.Minute)
	}}
	s, err := ckstore.Open(ctx, os.Getenv(envLocation), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := s.Put(ctx, os.Getenv(envKey), os.Getenv(envDir)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("committed")
	os.Exit(0)
}

// Run runs the contract cases; newLocation returns a fresh, empty location per case.
func Run(t *testing.T, newLocation func(t *testing.T) string) {
	cases := []struct {
		name string
		f    func(t *testing.T, loc string)
	}{
		{"RoundTrip", roundTrip},
		{"List", list},
		{"Overwrite", overwrite},
		{"Delete", deleteCase},
		{"Invalid", invalid},
		{"URL", urlCase},
		{"SecondReader", secondReader},
		{"ReadDuringOverwrites", readDuringOverwrites},
		{"KilledSave", killedSave},
		{"Big", big},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.f(t, newLocation(t)) })
	}
}

func open(t *testing.T, loc string) ckstore.Store {
	t.Helper()
	s, err := ckstore.Open(t.Context(), loc, ckstore.Options{})
	require.NoError(t, err)
	return s
}

// writeDir makes a checkpoint folder with the given files.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	return dir
}

// readDir returns the files under dir.
func readDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return nil
	}))
	return out
}

func adapter(tag string) map[string]string {
	return map[string]string{
		"adapter_config.json":       `{"r": 8, "tag": "` + tag + `"}`,
		"adapter_model.safetensors": strings.Repeat("w"+tag, 1000),
		"optimizer/state.bin":       "adam " + tag,
		"empty":                     "",
	}
}

func roundTrip(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	files := adapter("1")
	m, err := s.Put(ctx, "ws/run-1/weights/step-1", writeDir(t, files))
	require.NoError(t, err)
	require.Len(t, m.Files, len(files))
	require.Equal(t, int64(len(files["adapter_config.json"])+len(files["adapter_model.safetensors"])+len(files["optimizer/state.bin"])), m.Size())

	st, err := s.Stat(ctx, "ws/run-1/weights/step-1")
	require.NoError(t, err)
	require.Equal(t, m.Generation, st.Generation)
	require.Equal(t, m.Files, st.Files)

	dst := filepath.Join(t.TempDir(), "a", "b", "ck")
	got, err := s.Fetch(ctx, "ws/run-1/weights/step-1", dst)
	require.NoError(t, err)
	require.Equal(t, m.Generation, got.Generation)
	require.Equal(t, files, readDir(t, dst))
	// Nothing is left beside the destination.
	entries, err := os.ReadDir(filepath.Dir(dst))
	require.NoError(t, err)
	require.Len(t, entries, 1)

	_, err = s.Fetch(ctx, "ws/run-1/weights/step-1", dst)
	require.ErrorIs(t, err, ckstore.ErrInvalid, "the destination exists")

	rc, f, err := s.Open(ctx, "ws/run-1/weights/step-1", "optimizer/state.bin")
	require.NoError(t, err)
	body, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	require.Equal(t, files["optimizer/state.bin"], string(body))
	require.Equal(t, int64(len(body)), f.Size)

	_, _, err = s.Open(ctx, "ws/run-1/weights/step-1", "nope")
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	_, err = s.Stat(ctx, "ws/run-1/weights/other")
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	_, err = s.Fetch(ctx, "ws/run-1/weights/other", filepath.Join(t.TempDir(), "x"))
	require.ErrorIs(t, err, ckstore.ErrNotFound)
}

func list(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Empty(t, keys)
	dir := writeDir(t, adapter("l"))
	for _, k := range []string{"w1/r1/weights/a", "w1/r1/weights/b", "w1/r1/sampler_weights/a", "w1/r10/weights/a", "w2/r1/weights/a", "w1/r1/weights/a/nested"} {
		_, err := s.Put(ctx, k, dir)
		require.NoError(t, err)
	}
	keys, err = s.List(ctx, "w1/r1")
	require.NoError(t, err)
	require.Equal(t, []string{"w1/r1/sampler_weights/a", "w1/r1/weights/a", "w1/r1/weights/a/nested", "w1/r1/weights/b"}, keys, "a prefix matches whole segments")
	keys, err = s.List(ctx, "w1/r1/weights/a")
	require.NoError(t, err)
	require.Equal(t, []string{"w1/r1/weights/a", "w1/r1/weights/a/nested"}, keys)
	keys, err = s.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, keys, 6)
	keys, err = s.List(ctx, "w3")
	require.NoError(t, err)
	require.Empty(t, keys)
}

func overwrite(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	m1, err := s.Put(ctx, "k/ck", writeDir(t, adapter("1")))
	require.NoError(t, err)
	v2 := map[string]string{"adapter_config.json": "{}", "adapter_model.safetensors": "v2"}
	m2, err := s.Put(ctx, "k/ck", writeDir(t, v2))
	require.NoError(t, err)
	require.NotEqual(t, m1.Generation, m2.Generation)
	dst := filepath.Join(t.TempDir(), "ck")
	_, err = s.Fetch(ctx, "k/ck", dst)
	require.NoError(t, err)
	require.Equal(t, v2, readDir(t, dst), "the new files only")
	// The replaced generation's parts are gone already: nothing for Sweep.
	n, err := s.Sweep(ctx, "", -time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []string{"k/ck"}, keys)
}

func deleteCase(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	dir := writeDir(t, adapter("d"))
	for _, k := range []string{"ws/r/weights/a", "ws/r/weights/a/inner", "ws/r/weights/b"} {
		_, err := s.Put(ctx, k, dir)
		require.NoError(t, err)
	}
	require.NoError(t, s.Delete(ctx, "ws/r/weights/a"))
	_, err := s.Stat(ctx, "ws/r/weights/a")
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	_, err = s.Fetch(ctx, "ws/r/weights/a", filepath.Join(t.TempDir(), "x"))
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	keys, err := s.List(ctx, "ws")
	require.NoError(t, err)
	require.Equal(t, []string{"ws/r/weights/a/inner", "ws/r/weights/b"}, keys, "a nested key survives its parent's delete")
	require.NoError(t, s.Delete(ctx, "ws/r/weights/a"), "deleting again is not an error")
	require.NoError(t, s.Delete(ctx, "ws/never"))
	// Delete removed the parts too: nothing for Sweep.
	n, err := s.Sweep(ctx, "", -time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	dst := filepath.Join(t.TempDir(), "inner")
	_, err = s.Fetch(ctx, "ws/r/weights/a/inner", dst)
	require.NoError(t, err)
	require.Equal(t, adapter("d"), readDir(t, dst))
}

func invalid(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	dir := writeDir(t, adapter("i"))
	for _, k := range []string{"", "/a", "a/", "a//b", "a/../b", "./a", "a/@parts", "@x", "a\\b", "a/\x00", strings.Repeat("x", 600)} {
		_, err := s.Put(ctx, k, dir)
		require.ErrorIs(t, err, ckstore.ErrInvalid, "key %q", k)
		_, err = s.Stat(ctx, k)
		require.ErrorIs(t, err, ckstore.ErrInvalid, "key %q", k)
	}
	_, err := s.Put(ctx, "ok", t.TempDir())
	require.ErrorIs(t, err, ckstore.ErrInvalid, "an empty folder")
	withLink := writeDir(t, adapter("i"))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(withLink, "link")))
	_, err = s.Put(ctx, "ok", withLink)
	require.ErrorIs(t, err, ckstore.ErrInvalid, "a symbolic link")
	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Empty(t, keys)
}

func urlCase(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	files := adapter("u")
	_, err := s.Put(ctx, "ws/r/sampler_weights/s", writeDir(t, files))
	require.NoError(t, err)
	u, err := s.URL(ctx, "ws/r/sampler_weights/s", "adapter_config.json", time.Minute)
	require.NoError(t, err)
	require.Equal(t, files["adapter_config.json"], getURL(t, u))
	_, err = s.URL(ctx, "ws/r/sampler_weights/s", "missing", time.Minute)
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	_, err = s.URL(ctx, "ws/r/sampler_weights/none", "adapter_config.json", time.Minute)
	require.ErrorIs(t, err, ckstore.ErrNotFound)
}

func secondReader(t *testing.T, loc string) {
	ctx := t.Context()
	a, b := open(t, loc), open(t, loc)
	files := adapter("2")
	_, err := a.Put(ctx, "ws/r/weights/shared", writeDir(t, files))
	require.NoError(t, err)
	keys, err := b.List(ctx, "ws")
	require.NoError(t, err)
	require.Equal(t, []string{"ws/r/weights/shared"}, keys)
	dst := filepath.Join(t.TempDir(), "ck")
	_, err = b.Fetch(ctx, "ws/r/weights/shared", dst)
	require.NoError(t, err)
	require.Equal(t, files, readDir(t, dst))
	// The second instance overwrites; the first sees the new version.
	v2 := adapter("3")
	_, err = b.Put(ctx, "ws/r/weights/shared", writeDir(t, v2))
	require.NoError(t, err)
	dst2 := filepath.Join(t.TempDir(), "ck")
	_, err = a.Fetch(ctx, "ws/r/weights/shared", dst2)
	require.NoError(t, err)
	require.Equal(t, v2, readDir(t, dst2))
	require.NoError(t, a.Delete(ctx, "ws/r/weights/shared"))
	_, err = b.Stat(ctx, "ws/r/weights/shared")
	require.ErrorIs(t, err, ckstore.ErrNotFound)
}

// readDuringOverwrites fetches through one store instance while another overwrites the
// checkpoint again and again: every Fetch gets one whole version (a Fetch whose
// generation is removed under it starts again), or, at worst, asks to be retried.
func readDuringOverwrites(t *testing.T, loc string) {
	ctx := t.Context()
	w, r := open(t, loc), open(t, loc)
	srcs := make([]string, 2)
	for i := range srcs {
		files := map[string]string{}
		for _, name := range []string{"a", "b", "c"} {
			files[name] = strings.Repeat(fmt.Sprint(i), 256<<10)
		}
		srcs[i] = writeDir(t, files)
	}
	_, err := w.Put(ctx, "ws/r/weights/hot", srcs[0])
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 40 {
			if _, err := w.Put(ctx, "ws/r/weights/hot", srcs[i%2]); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	fetched := 0
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		dst := filepath.Join(t.TempDir(), "ck")
		if _, err := r.Fetch(ctx, "ws/r/weights/hot", dst); err != nil {
			require.ErrorContains(t, err, "retry", "the only acceptable failure is being overwritten too often")
			continue
		}
		fetched++
		got := readDir(t, dst)
		require.Len(t, got, 3)
		require.True(t, got["a"] == got["b"] && got["b"] == got["c"], "files of one fetch come from one version")
	}
	require.Positive(t, fetched)
}

// killedSave starts a save in a helper process and kills it (SIGKILL) after its first
// file is uploaded, before the large second one: nothing becomes visible, and a checkpoint
// that the save was overwriting stays whole.
func killedSave(t *testing.T, loc string) {
	ctx := t.Context()
	s := open(t, loc)
	v1 := adapter("old")
	_, err := s.Put(ctx, "ws/r/weights/over", writeDir(t, v1))
	require.NoError(t, err)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte("{}"), 0o644))
	writeRandom(t, filepath.Join(dir, "adapter_model.safetensors"), 64<<20)

	for _, key := range []string{"ws/r/weights/new", "ws/r/weights/over"} {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envHelper+"=put", envLocation+"="+loc, envKey+"="+key, envDir+"="+dir)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "uploaded adapter_config.json\n", line)
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
	}

	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []string{"ws/r/weights/over"}, keys, "the killed new checkpoint is not listed")
	_, err = s.Stat(ctx, "ws/r/weights/new")
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	_, err = s.Fetch(ctx, "ws/r/weights/new", filepath.Join(t.TempDir(), "x"))
	require.ErrorIs(t, err, ckstore.ErrNotFound)
	dst := filepath.Join(t.TempDir(), "over")
	_, err = s.Fetch(ctx, "ws/r/weights/over", dst)
	require.NoError(t, err)
	require.Equal(t, v1, readDir(t, dst), "the overwritten checkpoint is whole")

	// Sweep keeps recent leftovers (a save may still be running), then removes them.
	n, err := s.Sweep(ctx, "", time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = s.Sweep(ctx, "", -time.Hour)
	require.NoError(t, err)
	require.Positive(t, n, "the killed saves' parts")
	n, err = s.Sweep(ctx, "", -time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	dst2 := filepath.Join(t.TempDir(), "over")
	_, err = s.Fetch(ctx, "ws/r/weights/over", dst2)
	require.NoError(t, err)
	require.Equal(t, v1, readDir(t, dst2), "Sweep left the committed checkpoint alone")
}

// big round-trips a checkpoint of BigBytes random bytes and logs the times.
func big(t *testing.T, loc string) {
	if testing.Short() {
		t.Skip("-short: skipping the 150 MiB round trip")
	}
	ctx := t.Context()
	s := open(t, loc)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"r": 32}`), 0o644))
	writeRandom(t, filepath.Join(dir, "adapter_model.safetensors"), BigBytes/3)
	writeRandom(t, filepath.Join(dir, "optimizer.pt"), BigBytes-BigBytes/3)
	start := time.Now()
	m, err := s.Put(ctx, "ws/r/weights/big", dir)
	require.NoError(t, err)
	put := time.Since(start)
	require.Equal(t, int64(BigBytes+len(`{"r": 32}`)), m.Size())
	start = time.Now()
	dst := filepath.Join(t.TempDir(), "big")
	_, err = s.Fetch(ctx, "ws/r/weights/big", dst)
	require.NoError(t, err)
	fetch := time.Since(start)
	for _, name := range []string{"adapter_model.safetensors", "optimizer.pt", "adapter_config.json"} {
		requireSameFile(t, filepath.Join(dir, name), filepath.Join(dst, name))
	}
	t.Logf("%s: %d MiB: Put %v, Fetch %v", s, m.Size()>>20, put.Round(time.Millisecond), fetch.Round(time.Millisecond))
	require.NoError(t, s.Delete(ctx, "ws/r/weights/big"))
}

// getURL reads a URL that Store.URL returned.
func getURL(t *testing.T, u string) string {
	t.Helper()
	if p, ok := strings.CutPrefix(u, "file://"); ok {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return string(b)
	}
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	return string(b)
}

func writeRandom(t *testing.T, p string, n int64) {
	t.Helper()
	f, err := os.Create(p)
	require.NoError(t, err)
	_, err = io.CopyN(f, rand.Reader, n)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

func requireSameFile(t *testing.T, a, b string) {
	t.Helper()
	fa, err := os.Open(a)
	require.NoError(t, err)
	defer fa.Close()
	fb, err := os.Open(b)
	require.NoError(t, err)
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, erra := io.ReadFull(fa, ba)
		nb, errb := io.ReadFull(fb, bb)
		require.Equal(t, na, nb, "%s and %s differ in size", a, b)
		require.Equal(t, ba[:na], bb[:nb], "%s and %s differ", a, b)
		if errors.Is(erra, io.EOF) || errors.Is(erra, io.ErrUnexpectedEOF) {
			require.True(t, errors.Is(errb, io.EOF) || errors.Is(errb, io.ErrUnexpectedEOF))
			return
		}
		require.NoError(t, erra)
		require.NoError(t, errb)
	}
}
