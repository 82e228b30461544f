package prefix

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
)

// sdkResult is what sdk_episode.py prints.
type sdkResult struct {
	Samples      int     `json:"samples"`
	PromptTokens int     `json:"prompt_tokens"`
	MeanMillis   float64 `json:"mean_ms"`
}

func startServer(t *testing.T, opts map[string]string) string {
	t.Helper()
	keys, err := auth.ParseKeys([]string{"tml-bench"})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys, BackendConfig: backends.Config{Options: opts}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return "http://" + ln.Addr().String()
}

// tokens reads loops_tokens_total{kind} from the gateway's /metrics.
func tokens(t *testing.T, url, kind string) float64 {
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	want := `loops_tokens_total{kind="` + kind + `"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return 0
}

// TestPrefixCacheSDK runs sdk_episode.py (multi-turn tool-calling episodes through the real
// tinker SDK over HTTP) against a gateway with the reference engine's prefix cache and one
// without, and logs the share of prompt tokens cached (from /metrics) and the sample
// latencies. The SDK's venv comes from scripts/pyenv.sh (the e2e suite's).
func TestPrefixCacheSDK(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the prefix cache benchmark through the tinker SDK")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	out, err := exec.Command(filepath.Join(root, "scripts/pyenv.sh"), "tinker-0.38.0",
		"tinker==0.38.0", "pytest", "pytest-timeout", "numpy", "transformers").Output()
	require.NoError(t, err, "making the tinker venv")
	python := filepath.Join(strings.TrimSpace(string(out)), "bin", "python")
	run := func(url string) sdkResult {
		cmd := exec.CommandContext(t.Context(), python, "sdk_episode.py")
		cmd.Env = append(os.Environ(), "TINKER_BASE_URL="+url, "TINKER_API_KEY=tml-bench", "TINKER_TELEMETRY=0", "HF_HUB_OFFLINE=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "sdk_episode.py: %s", stderr.String())
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		var r sdkResult
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &r))
		return r
	}
	on, off := startServer(t, nil), startServer(t, map[string]string{"prefix_cache_bytes": "0"})
	rOff := run(off)
	rOn := run(on)
	share := tokens(t, on, "sample_prompt_cached") / tokens(t, on, "sample_prompt")
	require.Zero(t, tokens(t, off, "sample_prompt_cached"))
	t.Logf("%d samples, %d prompt tokens; cache on: %.1f%% of prompt tokens cached, mean latency %.1f ms; cache off: %.1f ms; on/off %.2f",
		rOn.Samples, rOn.PromptTokens, 100*share, rOn.MeanMillis, rOff.MeanMillis, rOn.MeanMillis/rOff.MeanMillis)
}
