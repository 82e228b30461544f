// Package promtooltest gives tests the real promtool (Prometheus's rule checker, from the
// github.com/prometheus/prometheus module), built at a pinned version once per machine
// into ~/.cache/loops/bin/promtool-VERSION (outside the work tree, so fresh clones and CI
// reuse it, like `make weed` and `make grpcurl`; internal/cachedtool). $LOOPS_PROMTOOL_BIN overrides it. When
// it cannot be built (no module proxy and no module cache), Binary skips the test with a
// message saying so, except under CI (CI=true), where it fails it: CI must never pass by
// skipping.
//
// The module's go.mod has replace directives, so `go install module/cmd/promtool@version`
// refuses it: the module is downloaded (go mod download) and built in its own folder with
// its own go.sum, as `make weed` builds SeaweedFS.
package promtooltest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/loops-dev/loops/internal/cachedtool"
)

// Module and Version are what is built: Module's ./cmd/promtool at Version (Prometheus
// 3.15.1's tag in Go's module numbering). It is the version of the promql parser this
// module's go.mod requires, so the CI check and promtool read PromQL alike.
const (
	Module  = "github.com/prometheus/prometheus"
	Version = "v0.315.1"
)

var tool = &cachedtool.Tool{
	Name: "promtool", Version: Version, EnvVar: "LOOPS_PROMTOOL_BIN",
	// Several minutes with a cold module and build cache; what a build cut short compiled
	// stays in Go's build cache for the next.
	Timeout: 30 * time.Minute,
	Build:   build,
}

// Binary returns the path of promtool, building it first if it is not cached; without it
// it skips tb, or fails it under CI=true.
func Binary(tb testing.TB) string {
	tb.Helper()
	return tool.Binary(tb)
}

// build downloads the module and builds promtool into tmp.
func build(ctx context.Context, tmp string) (string, error) {
	// Outside this module (from /): its go.mod and GOFLAGS do not apply.
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", Module+"@"+Version)
	dl.Dir = "/"
	dl.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	var out, errOut bytes.Buffer
	dl.Stdout, dl.Stderr = &out, &errOut
	if err := dl.Run(); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w\n%s%s", Module, Version, err, out.Bytes(), errOut.Bytes())
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out.Bytes(), &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s gave no folder: %v\n%s", Module, Version, err, out.Bytes())
	}
	bin := filepath.Join(tmp, "promtool")
	// remove_all_sd: without the cloud service discoveries (Prometheus's own build tag),
	// which the rule commands do not use and which are most of the build.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "remove_all_sd", "-ldflags=-s", "-o", bin, "./cmd/promtool")
	cmd.Dir = mod.Dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s/cmd/promtool@%s: %w\n%s", Module, Version, err, b)
	}
	return bin, nil
}
