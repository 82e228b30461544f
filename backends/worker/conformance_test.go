package worker

import (
	"path/filepath"
	"testing"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/conformance/backendtest"
)

// sharedHandle hands the shared backend to a case; Close does nothing (cases clean up their
// own adapters).
type sharedHandle struct{ *Backend }

func (sharedHandle) Close() error { return nil }

// TestConformance runs the backend contract suite through the Go worker client against one
// local CPU worker (fp32) serving the built-in tiny model. Opt-in: LOOPS_TEST_TORCH=1.
func TestConformance(t *testing.T) {
	b := sharedBackend(t)
	backendtest.Run(t, func(t *testing.T) backends.Backend { return sharedHandle{b} }, backendtest.Options{
		ModelName:    tiny.Name,
		ModelDir:     filepath.Join(sharedDir, "models", "loops-tiny"),
		KnownFailing: "testdata/known_failing.txt",
	})
}
