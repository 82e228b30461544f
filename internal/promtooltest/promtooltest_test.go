package promtooltest

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBinary builds promtool (or finds it cached) and runs it: `make promtool` runs this
// test, so that the build happens once before the Go tests that use it start.
func TestBinary(t *testing.T) {
	bin := Binary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "promtool, version")
}
