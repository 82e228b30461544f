package grpcurltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBinary builds grpcurl (or finds it cached) and runs it: `make grpcurl` runs this
// test, so that the build happens once before the Go tests that use it start.
func TestBinary(t *testing.T) {
	bin := Binary(t)
	out, err := exec.Command(bin, "-version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	if os.Getenv("LOOPS_GRPCURL_BIN") == "" {
		require.Equal(t, filepath.Base(bin)+" "+Version, strings.TrimSpace(string(out)))
	}
}
