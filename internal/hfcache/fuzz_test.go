package hfcache

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzNames: whatever a tenant names as a model and revision, the files looked at stay
// inside the hub's own repository folder (its refs, its snapshots), or the name is refused.
func FuzzNames(f *testing.F) {
	for _, s := range [][2]string{{"Qwen/Qwen3-8B", "main"}, {"../x", ".."}, {"a/b", "refs/../../x"},
		{"gpt2", strings.Repeat("a", 40)}, {"org/m", "pr/1"}} {
		f.Add(s[0], s[1])
	}
	hub := f.TempDir()
	repo := filepath.Join(hub, "models--org--m")
	for _, d := range []string{"refs/pr", "snapshots/" + strings.Repeat("1", 40)} {
		if err := os.MkdirAll(filepath.Join(repo, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for _, ref := range []string{"main", "pr/1"} {
		if err := os.WriteFile(filepath.Join(repo, "refs", ref), []byte(strings.Repeat("1", 40)), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	inside := func(p, dir string) bool { return strings.HasPrefix(p, dir+string(filepath.Separator)) }
	f.Fuzz(func(t *testing.T, id, rev string) {
		if dir, err := RepoDir(hub, id); err == nil && (filepath.Dir(dir) != hub || !strings.HasPrefix(filepath.Base(dir), ModelRepoPrefix)) {
			t.Fatalf("RepoDir(%q) = %q: outside the hub %q", id, dir, hub)
		}
		if ref, err := refPath(repo, rev); err == nil && !inside(ref, filepath.Join(repo, "refs")) {
			t.Fatalf("refPath(%q) = %q: outside the refs", rev, ref)
		}
		if snap, err := Snapshot(hub, "org/m", rev); err == nil && !inside(snap, filepath.Join(repo, "snapshots")) {
			t.Fatalf("Snapshot(%q) = %q: outside the snapshots", rev, snap)
		}
	})
}
