package benchdata

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Binary is the loops binary a benchmark runs: $LOOPS_BIN (one built elsewhere, such as an
// older commit for a before/after), or this tree's, built into a temporary folder.
func Binary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("LOOPS_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "loops")
	build := exec.Command("go", "build", "-o", bin, "github.com/loops-dev/loops/cmd/loops")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	return bin
}

// Server is a `loops serve` process.
type Server struct {
	URL string
	PID int
}

// Memory is a process's resident memory now (VmRSS) and at its peak (VmHWM), in bytes.
type Memory struct{ RSS, HWM int64 }

// Serve runs `bin serve` on 127.0.0.1:0 with a fresh data folder (open mode) and waits until
// it answers; the test's cleanup stops it.
func Serve(t *testing.T, bin string) Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-level", "warn")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "Loops listening on "); ok {
				urls <- strings.Fields(rest)[0]
			}
		}
	}()
	var url string
	select {
	case url = <-urls:
	case <-time.After(time.Minute):
		t.Fatal("loops serve did not start")
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond)
	return Server{URL: url, PID: cmd.Process.Pid}
}

// Memory reads the server's resident memory.
func (s Server) Memory(t *testing.T) Memory {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.PID))
	require.NoError(t, err)
	var m Memory
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "VmHWM:":
			m.HWM = kb << 10
		}
	}
	return m
}
