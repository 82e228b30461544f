// Package grpcurltest gives tests the real grpcurl (github.com/fullstorydev/grpcurl), built
// from its Go module at a pinned version, once per machine, into
// ~/.cache/loops/bin/grpcurl-VERSION (outside the work tree, so fresh clones and CI
// reuse it, like `make weed`; internal/cachedtool). $LOOPS_GRPCURL_BIN overrides it. When it
// cannot be built (no module proxy and no module cache), Binary skips the test with a message
// saying so, except under CI (CI=true), where it fails it: CI must never pass by skipping.
package grpcurltest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/loops-dev/loops/internal/cachedtool"
)

// Module and Version are what is built: `go install Module/cmd/grpcurl@Version`.
const (
	Module  = "github.com/fullstorydev/grpcurl"
	Version = "v1.9.4"
)

var tool = &cachedtool.Tool{
	Name: "grpcurl", Version: Version, EnvVar: "LOOPS_GRPCURL_BIN",
	Timeout: 8 * time.Minute, // a few minutes on a slow machine with a cold module cache
	Build:   build,
}

// Binary returns the path of grpcurl, building it first if it is not cached; without it
// it skips tb, or fails it under CI=true.
func Binary(tb testing.TB) string {
	tb.Helper()
	return tool.Binary(tb)
}

// build installs grpcurl into tmp.
func build(ctx context.Context, tmp string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "install", "-trimpath", "-ldflags=-s -X main.version="+Version, Module+"/cmd/grpcurl@"+Version)
	// Outside this module: its go.mod and GOFLAGS (-mod=…) do not apply to `go install pkg@version`.
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s/cmd/grpcurl@%s: %w\n%s", Module, Version, err, out)
	}
	return filepath.Join(tmp, "grpcurl"), nil
}
