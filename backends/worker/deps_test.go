package worker

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoEngineDependency checks that the worker client does not link the CPU engine: it
// may write the built-in model (backends/tiny) and read adapter folders (backends/peft),
// but backends/reference, whose init registers another backend, stays out of its imports.
func TestNoEngineDependency(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.CommandContext(t.Context(), goBin, "list", "-deps", ".").Output()
	require.NoError(t, err)
	const engine = "github.com/loops-dev/loops/backends/reference"
	require.Falsef(t, slices.Contains(strings.Fields(string(out)), engine),
		"backends/worker depends on %s; take what it needs from backends/tiny or backends/peft", engine)
}
