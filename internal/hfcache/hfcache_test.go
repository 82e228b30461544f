package hfcache

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clearEnv unsets every variable the hub's location depends on, and sets HOME to home.
func clearEnv(t *testing.T, home string) {
	t.Helper()
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", home)
}

// TestHubDirPrecedence: huggingface_hub's order, each variable shadowing the ones before
// it in this list (set in turn).
func TestHubDirPrecedence(t *testing.T) {
	home := t.TempDir()
	clearEnv(t, home)
	for _, step := range []struct{ env, value, hub, home string }{
		{"", "", filepath.Join(home, ".cache", "huggingface", "hub"), filepath.Join(home, ".cache", "huggingface")},
		{"XDG_CACHE_HOME", "/xdg", "/xdg/huggingface/hub", "/xdg/huggingface"},
		{"HF_HOME", "/hf", "/hf/hub", "/hf"},
		{"HUGGINGFACE_HUB_CACHE", "/legacy", "/legacy", "/hf"},
		{"HF_HUB_CACHE", "/hub", "/hub", "/hf"}, // the hub moves, not the home
	} {
		if step.env != "" {
			t.Setenv(step.env, step.value)
		}
		hub, err := HubDir()
		require.NoError(t, err)
		require.Equal(t, step.hub, hub, "with %s set", step.env)
		h, err := Home()
		require.NoError(t, err)
		require.Equal(t, step.home, h, "with %s set", step.env)
	}
}

// TestHubDirExpands: "~" and variables expand as huggingface_hub expands them; a relative
// folder is made absolute; a variable that is not set stays as written.
func TestHubDirExpands(t *testing.T) {
	home := t.TempDir()
	clearEnv(t, home)
	t.Setenv("SCRATCH", "/scratch")
	t.Setenv("HF_HOME", "~/hf")
	h, err := Home()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(home, "hf"), h)

	t.Setenv("HF_HUB_CACHE", "$SCRATCH/hub/${SCRATCH}")
	hub, err := HubDir()
	require.NoError(t, err)
	require.Equal(t, "/scratch/hub/scratch", hub)

	t.Setenv("HF_HUB_CACHE", "/a/$LOOPS_SURELY_UNSET/b")
	hub, _ = HubDir()
	require.Equal(t, "/a/$LOOPS_SURELY_UNSET/b", hub)

	t.Setenv("HF_HUB_CACHE", "rel/hub")
	hub, _ = HubDir()
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(wd, "rel", "hub"), hub)
}

func TestRepoDir(t *testing.T) {
	for id, want := range map[string]string{
		"Qwen/Qwen3-8B":                    "models--Qwen--Qwen3-8B",
		"meta-llama/Llama-3.1-8B-Instruct": "models--meta-llama--Llama-3.1-8B-Instruct",
		"gpt2":                             "models--gpt2",
		"loops/tiny":                       "models--loops--tiny",
	} {
		got, err := RepoDir("/hub", id)
		require.NoError(t, err, id)
		require.Equal(t, "/hub/"+want, got)
	}
	for _, id := range []string{"", "/", "a/", "/a", "a/b/c", "..", "../etc", "a/..", "a/.b", "a--b/c", "a/b--c",
		"a\\b", "a b", "a/b\x00", "-a/b", "a/b.", strings.Repeat("a", 97), "~/x", "a/b;c"} {
		_, err := RepoDir("/hub", id)
		require.ErrorIs(t, err, ErrInvalid, "%q", id)
	}
}

// writeSnapshot makes a snapshot of org/m in hub holding files.
func writeSnapshot(t *testing.T, hub, commit string, files ...string) string {
	t.Helper()
	dir := filepath.Join(hub, "models--org--m", "snapshots", commit)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, f := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644))
	}
	return dir
}

func writeRef(t *testing.T, hub, name, content string) {
	t.Helper()
	p := filepath.Join(hub, "models--org--m", "refs", name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
}

const (
	c1 = "1111111111111111111111111111111111111111"
	c2 = "2222222222222222222222222222222222222222"
)

// TestSnapshotFollowsRefs: refs/<revision> names the commit whose snapshot is the answer; a
// commit id names its snapshot; nothing outside the repository is reachable.
func TestSnapshotFollowsRefs(t *testing.T) {
	hub := t.TempDir()
	s1 := writeSnapshot(t, hub, c1, "config.json")
	s2 := writeSnapshot(t, hub, c2, "config.json")
	writeRef(t, hub, "main", c1+"\n")
	writeRef(t, hub, "pr/7", c2)

	got, err := Snapshot(hub, "org/m", "")
	require.NoError(t, err)
	require.Equal(t, s1, got, "no revision is main")
	got, err = Snapshot(hub, "org/m", "main")
	require.NoError(t, err)
	require.Equal(t, s1, got)
	got, err = Snapshot(hub, "org/m", "pr/7")
	require.NoError(t, err)
	require.Equal(t, s2, got)
	got, err = Snapshot(hub, "org/m", c2)
	require.NoError(t, err)
	require.Equal(t, s2, got)

	_, err = Snapshot(hub, "org/m", "dev")
	require.ErrorIs(t, err, ErrNotCached)
	_, err = Snapshot(hub, "org/m", strings.Repeat("3", 40))
	require.ErrorIs(t, err, ErrNotCached)
	_, err = Snapshot(hub, "org/other", "main")
	require.ErrorIs(t, err, ErrNotCached)

	// Path escapes, through the revision or through a ref's content.
	require.NoError(t, os.MkdirAll(filepath.Join(hub, "secret"), 0o755))
	for _, rev := range []string{"..", "../../secret", "main/../../refs/main", "/etc/passwd", "a//b", "x y"} {
		_, err = Snapshot(hub, "org/m", rev)
		require.ErrorIs(t, err, ErrInvalid, "%q", rev)
	}
	writeRef(t, hub, "evil", "../../../secret")
	_, err = Snapshot(hub, "org/m", "evil")
	require.ErrorIs(t, err, ErrNotCached, "a ref that is not a commit id is not followed")
	writeRef(t, hub, "long", strings.Repeat(c1, 1000))
	_, err = Snapshot(hub, "org/m", "long")
	require.ErrorIs(t, err, ErrNotCached)
}

// TestFind: main's snapshot when it holds the file; else the most recently modified
// snapshot that does; else ErrNotCached.
func TestFind(t *testing.T) {
	hub := t.TempDir()
	clearEnv(t, t.TempDir())
	t.Setenv("HF_HUB_CACHE", hub)

	_, err := Find("org/m", "config.json")
	require.ErrorIs(t, err, ErrNotCached)

	old := writeSnapshot(t, hub, c1, "config.json", "tokenizer.json")
	require.NoError(t, os.Chtimes(old, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)))
	got, err := Find("org/m", "config.json")
	require.NoError(t, err)
	require.Equal(t, old, got, "no main ref: the one snapshot")

	newer := writeSnapshot(t, hub, c2, "config.json")
	got, err = Find("org/m", "config.json")
	require.NoError(t, err)
	require.Equal(t, newer, got, "no main ref: the most recent snapshot")

	writeRef(t, hub, "main", c1)
	got, err = Find("org/m", "config.json")
	require.NoError(t, err)
	require.Equal(t, old, got, "main's snapshot")

	writeRef(t, hub, "main", c2)
	got, err = Find("org/m", "tokenizer.json")
	require.NoError(t, err)
	require.Equal(t, old, got, "main's snapshot lacks the file: the one that has it")

	_, err = Find("org/m", "weights.bin")
	require.ErrorIs(t, err, ErrNotCached)
	_, err = Find("org/m", "../refs/main")
	require.ErrorIs(t, err, ErrInvalid)
	_, err = Find("../m", "config.json")
	require.ErrorIs(t, err, ErrInvalid)
}

// TestAddIsFound: what Add writes is what Snapshot and Find read.
func TestAddIsFound(t *testing.T) {
	hub := t.TempDir()
	clearEnv(t, t.TempDir())
	t.Setenv("HF_HUB_CACHE", hub)
	snap, err := Add(hub, "loops/tiny", c1, map[string][]byte{"config.json": []byte(`{"a":1}`), "tokenizer.json": []byte("{}")})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(hub, "models--loops--tiny", "snapshots", c1), snap)
	ref, err := os.ReadFile(filepath.Join(hub, "models--loops--tiny", "refs", "main"))
	require.NoError(t, err)
	require.Equal(t, c1, string(ref))
	got, err := Find("loops/tiny", "tokenizer.json")
	require.NoError(t, err)
	require.Equal(t, snap, got)

	_, err = Add(hub, "loops/tiny", "main", nil)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = Add(hub, "loops/tiny", c1, map[string][]byte{"../../refs/main": nil})
	require.ErrorIs(t, err, ErrInvalid)
}

// A reader never sees a half-written snapshot file while another process's start writes
// the same snapshot again (a tinker client's get_tokenizer read an empty tokenizer.json
// that way while a second loops serve started).
func TestAddRewritesAtomically(t *testing.T) {
	hub := t.TempDir()
	a, b := bytes.Repeat([]byte("a"), 1<<20), bytes.Repeat([]byte("b"), 1<<20)
	snap, err := Add(hub, "loops/tiny", c1, map[string][]byte{"tokenizer.json": a})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			content := a
			if i%2 == 0 {
				content = b
			}
			if _, err := Add(hub, "loops/tiny", c1, map[string][]byte{"tokenizer.json": content}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for reads := 0; ; reads++ {
		select {
		case <-done:
			entries, err := os.ReadDir(snap)
			require.NoError(t, err)
			require.Len(t, entries, 1, "no temporary file is left behind")
			return
		default:
		}
		got, err := os.ReadFile(filepath.Join(snap, "tokenizer.json"))
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, a) || bytes.Equal(got, b), "read %d: %d bytes, neither whole version", reads, len(got))
	}
}
