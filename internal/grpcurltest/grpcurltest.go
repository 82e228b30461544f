// Package grpcurltest gives tests the real grpcurl (github.com/fullstorydev/grpcurl), built
// from its Go module at a pinned version, once per machine, into
// ~/.cache/loops/bin/grpcurl-VERSION (outside the work tree, so fresh clones and CI
// reuse it, like `make weed`). $LOOPS_GRPCURL_BIN overrides it. When it cannot be built
// (no module proxy and no module cache), Binary skips the test with a message saying so,
// except under CI (CI=true), where it fails it: CI must never pass by skipping.
package grpcurltest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Module and Version are what is built: `go install Module/cmd/grpcurl@Version`.
const (
	Module  = "github.com/fullstorydev/grpcurl"
	Version = "v1.9.4"
)

// buildTimeout bounds the build (a few minutes on a slow machine with a cold module cache).
const buildTimeout = 8 * time.Minute

var built struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of grpcurl, building it first if it is not cached; without it
// it skips tb, or fails it under CI=true.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("LOOPS_GRPCURL_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("LOOPS_GRPCURL_BIN: %v", err)
		}
		return p
	}
	built.once.Do(func() { built.path, built.err = build() })
	switch {
	case built.err == nil:
		return built.path
	case os.Getenv("CI") == "true":
		tb.Fatalf("building grpcurl: %v", built.err)
	default:
		tb.Skipf("skipping the grpcurl test: grpcurl %s could not be built from its Go module (offline?): %v; set LOOPS_GRPCURL_BIN to a grpcurl binary", Version, built.err)
	}
	return ""
}

// build installs grpcurl into the cache folder, under a temporary name first so that a
// build cut short leaves nothing that looks finished.
func build() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, ".cache", "loops", "bin")
	path := filepath.Join(dir, "grpcurl-"+Version)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".grpcurl-build-") // beside path: the rename stays on one file system
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", "-trimpath", "-ldflags=-s -X main.version="+Version, Module+"/cmd/grpcurl@"+Version)
	// Outside this module: its go.mod and GOFLAGS (-mod=…) do not apply to `go install pkg@version`.
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s/cmd/grpcurl@%s: %w\n%s", Module, Version, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "grpcurl"), path); err != nil {
		return "", err
	}
	return path, nil
}
