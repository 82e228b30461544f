package fairness

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core"
)

// sdkResult is what sdk_sampling.py prints.
type sdkResult struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
}

// TestSamplingFairnessSDK measures a light tenant's sampling latency through the real
// tinker SDK (sdk_sampling.py: 16 + 16 tokens, each sample waited for before the next)
// against a gateway with the default sampler slots, alone and while another workspace
// floods the sampler from 32 Go clients with short (16 + 64 tokens) and with long
// (512 + 64) prompts. The SDK's venv comes from scripts/pyenv.sh (the e2e suite's).
func TestSamplingFairnessSDK(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the fairness benchmark")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	out, err := exec.Command(filepath.Join(root, "scripts/pyenv.sh"), "tinker-0.38.0",
		"tinker==0.38.0", "pytest", "pytest-timeout", "numpy", "transformers").Output()
	require.NoError(t, err, "making the tinker venv")
	python := filepath.Join(strings.TrimSpace(string(out)), "bin", "python")

	url := startServer(t, []string{"tml-light", "tml-heavy"}, core.Options{})
	heavy := newTenant(url, "tml-heavy")
	heavySampler := heavy.newSampler(t)
	light := func() sdkResult {
		cmd := exec.CommandContext(t.Context(), python, "sdk_sampling.py", "--samples", "40",
			"--prompt", "16", "--max-tokens", "16")
		cmd.Env = append(os.Environ(), "TINKER_BASE_URL="+url, "TINKER_API_KEY=tml-light", "TINKER_TELEMETRY=0", "HF_HUB_OFFLINE=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "sdk_sampling.py: %s", stderr.String())
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		var r sdkResult
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &r))
		return r
	}
	t.Logf("light tenant through the tinker SDK, %d+%d tokens per sample; load average %s", lightPrompt, lightMax, loadavg())
	alone := light()
	t.Logf("  alone: p50 %.1f ms  p99 %.1f ms", alone.P50, alone.P99)
	for _, prompt := range []int{shortPrompt, longPrompt} {
		var r sdkResult
		// the SDK process starts (about a second) before its first sample: the flood
		// measured is the time the script runs
		start := time.Now()
		tps := heavy.floodWhile(t, heavySampler, heavyClients, prompt, heavyMax, func() { r = light() }, 0)
		t.Logf("  under a flood of %d clients × (%d+%d): p50 %.1f ms  p99 %.1f ms  (ratio p50 %.2f×, p99 %.2f×); heavy tenant %v meanwhile (%v); load %s",
			heavyClients, prompt, heavyMax, r.P50, r.P99, r.P50/alone.P50, r.P99/alone.P99, tps, time.Since(start).Round(time.Second), loadavg())
	}
}
