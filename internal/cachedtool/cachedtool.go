// Package cachedtool gives tests real command-line tools built from Go modules at pinned
// versions, once per machine, into ~/.cache/loops/bin/NAME-VERSION (outside the work tree,
// so fresh clones and CI reuse them, like `make weed`). An environment variable per tool
// names a binary to use instead. When a tool cannot be built (no module proxy and no module
// cache), Binary skips the test with a message saying so, except under CI (CI=true), where
// it fails it: CI must never pass by skipping. internal/grpcurltest and
// internal/promtooltest are its tools.
package cachedtool

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Tool is a program built from a Go module into the cache folder.
type Tool struct {
	// Name is the binary's name; the cache holds it as Name-Version.
	Name, Version string
	// EnvVar names the environment variable that gives a binary to use instead.
	EnvVar string
	// Timeout bounds the build (download included).
	Timeout time.Duration
	// Build writes the binary into the empty folder tmp (beside the cache folder, so that
	// moving it into place stays on one file system) and returns its path.
	Build func(ctx context.Context, tmp string) (string, error)

	once sync.Once
	path string
	err  error
}

// Binary returns the path of the tool, building it first if it is not cached; without it
// it skips tb, or fails it under CI=true.
func (t *Tool) Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(t.EnvVar); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("%s: %v", t.EnvVar, err)
		}
		return p
	}
	t.once.Do(func() { t.path, t.err = t.build() })
	switch {
	case t.err == nil:
		return t.path
	case os.Getenv("CI") == "true":
		tb.Fatalf("building %s: %v", t.Name, t.err)
	default:
		tb.Skipf("skipping the %s test: %s %s could not be built from its Go module (offline?): %v; set %s to a %s binary", t.Name, t.Name, t.Version, t.err, t.EnvVar, t.Name)
	}
	return ""
}

// build builds the tool into the cache folder, under a temporary name first so that a
// build cut short leaves nothing that looks finished.
func (t *Tool) build() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, ".cache", "loops", "bin")
	path := filepath.Join(dir, t.Name+"-"+t.Version)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "."+t.Name+"-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), t.Timeout)
	defer cancel()
	bin, err := t.Build(ctx, tmp)
	if err != nil {
		return "", err
	}
	if err := os.Rename(bin, path); err != nil {
		return "", err
	}
	return path, nil
}
