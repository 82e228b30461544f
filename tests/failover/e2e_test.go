//go:build failover

package failover

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tinkerVenv returns the cached tinker venv of tests/e2e (same name and requirements, so
// the cache is shared).
func tinkerVenv(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(root, "scripts", "pyenv.sh"), "tinker-0.38.0",
		"tinker==0.38.0", "pytest", "pytest-timeout", "numpy", "transformers").Output()
	require.NoError(t, err, "scripts/pyenv.sh")
	return strings.TrimSpace(string(out))
}

type event struct {
	Event     string  `json:"event"`
	Step      int     `json:"step"`
	Steps     int     `json:"steps"`
	Loss      float64 `json:"loss"`
	Path      string  `json:"path"`
	Error     string  `json:"error"`
	Seconds   float64 `json:"seconds"`
	Failovers int     `json:"failovers"`
}

// TestTinkerScriptSurvivesLeaderKill: a tinker SDK script trains through HAProxy in front
// of two gateways; the leader is killed with SIGKILL mid-training; the standby takes over
// and the script carries on to the end, reloading its last checkpoint when an operation
// fails over.
func TestTinkerScriptSurvivesLeaderKill(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()
	bin := os.Getenv("LOOPS_FAILOVER_BIN") // a loops binary built beforehand, else built here
	if bin == "" {
		bin = filepath.Join(dir, "loops")
		build := exec.Command("go", "build", "-o", bin, "./cmd/loops")
		build.Dir = root
		out, err := build.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	venv := tinkerVenv(t, root)

	const key = "tml-failover-e2e-key"
	ctx := t.Context()
	c, err := Start(ctx, Options{Dir: dir, Bin: bin, LeaseTTL: 3 * time.Second, APIKey: key})
	require.NoError(t, err)
	defer c.Close()
	t.Logf("front %s, gateways %s (leader) and %s", c.FrontURL, c.Gateways[0].URL, c.Gateways[1].URL)

	const steps, killAt = 24, 8
	cmd := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), filepath.Join(root, "tests", "failover", "train.py"))
	cmd.Env = append(os.Environ(), "TINKER_BASE_URL="+c.FrontURL, "TINKER_API_KEY="+key, "HF_HUB_OFFLINE=1",
		"STEPS=24", "SAVE_EVERY=3")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())

	var events []event
	killed, killedAt := -1, time.Time{}
	var savedBeforeKill []string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		events = append(events, e)
		t.Logf("script: %s", sc.Text())
		if e.Event == "saved" && killed < 0 {
			savedBeforeKill = append(savedBeforeKill, e.Path)
		}
		if e.Event == "step" && e.Step >= killAt && killed < 0 {
			killed = c.Leader(context.Background())
			require.GreaterOrEqual(t, killed, 0)
			killedAt = c.Kill(killed)
			t.Logf("killed the leader %s with SIGKILL after step %d", c.Gateways[killed].Name, e.Step)
		}
	}
	err = cmd.Wait()
	require.NoError(t, err, "the script failed; gateway logs: %s, %s", c.LogPath(0), c.LogPath(1))
	require.GreaterOrEqual(t, killed, 0, "the script ended before the kill")
	last := events[len(events)-1]
	require.Equal(t, "done", last.Event)
	require.Equal(t, steps, last.Steps)

	// The other gateway leads now, having taken over once.
	other := 1 - killed
	h, err := c.Health(ctx, other)
	require.NoError(t, err)
	require.Equal(t, "leader", h.Role)
	require.Equal(t, 1, h.Lease.Takeovers)
	tk, err := c.Takeovers(other)
	require.NoError(t, err)
	require.Len(t, tk, 1)
	t.Logf("takeover: lease lapse → lease %s, → ready %s (core start %s); kill → script done %s",
		tk[0].LapseToLease, tk[0].LapseToReady, tk[0].CoreStart, time.Since(killedAt).Round(time.Millisecond))

	// What the script saw: each failed operation says the gateway failed over (or that the
	// operation is unknown to the new leader, for one whose creation the dead leader never
	// committed), and each resume loaded a checkpoint saved before the kill.
	require.GreaterOrEqual(t, last.Failovers, 1, "the script was told of the failover")
	sawFailover := false
	for _, e := range events {
		switch e.Event {
		case "error":
			t.Logf("the script saw: %s (after %.1f s)", e.Error, e.Seconds)
			// An operation whose creation the dead leader never committed is unknown to
			// the new one (410, "…restarted before recording it; resubmit").
			sawFailover = sawFailover || strings.Contains(e.Error, "failed over") || strings.Contains(e.Error, "before recording it")
		case "resumed":
			if e.Path != "" {
				require.Contains(t, savedBeforeKill, e.Path, "resumed from a checkpoint saved before the kill")
			}
		}
	}
	require.True(t, sawFailover, "an error said the gateway failed over (or that the operation was never recorded)")
}
