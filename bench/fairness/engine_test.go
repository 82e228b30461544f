package fairness

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestEngineSamplingFairness is the sampling benchmark's flood without the gateway: the
// reference engine called directly, a light workspace's samples (16+16 tokens, one after
// another) alone and beside 3 closed-loop clients of another workspace (what the core's
// default 4 sampler slots let one workspace run while another samples) with short (16+64)
// and long (512+64) prompts, and the heavy workspace's generated tokens/s with the light one
// and without it.
func TestEngineSamplingFairness(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the fairness benchmark")
	}
	e, err := reference.New(reference.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	defer e.Close()
	req := func(ws string, prompt, maxTokens int) *backendv1.SampleRequest {
		p := make([]int32, prompt)
		for k := range p {
			p[k] = int32(65 + k%26)
		}
		return &backendv1.SampleRequest{BaseModel: tiny.Name, Workspace: ws, Prompt: p, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: int32(maxTokens), Temperature: 1, TopP: 1}}
	}
	light := func() []time.Duration {
		var lat []time.Duration
		for range lightSamples {
			start := time.Now()
			_, err := e.Sample(t.Context(), req("light", lightPrompt, lightMax))
			require.NoError(t, err)
			lat = append(lat, time.Since(start))
		}
		return lat
	}
	// heavy runs 3 closed-loop clients of prompt-token samples for a second, then while
	// during runs (or for d), and returns how fast they generated tokens over that time.
	heavy := func(prompt int, during func(), d time.Duration) rate {
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var done atomic.Int64
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					r, err := e.Sample(ctx, req("heavy", prompt, heavyMax))
					if err == nil && ctx.Err() == nil {
						done.Add(int64(len(r.GetResult().GetSequences()[0].GetTokens())))
					}
				}
			}()
		}
		tps := rateWhile(&done, during, d)
		cancel()
		wg.Wait()
		return tps
	}
	for range 5 { // warm-up
		_, _ = e.Sample(t.Context(), req("light", lightPrompt, lightMax))
	}
	t.Logf("reference engine, light workspace samples (%d+%d tokens); load average %s", lightPrompt, lightMax, loadavg())
	alone := light()
	t.Logf("  alone: p50 %v  p99 %v", percentile(alone, .5), percentile(alone, .99))
	for _, prompt := range []int{shortPrompt, longPrompt} {
		var lat []time.Duration
		tps := heavy(prompt, func() { lat = light() }, 0)
		without := heavy(prompt, nil, 5*time.Second)
		t.Logf("  beside 3 clients × (%d+%d) of another workspace: p50 %v  p99 %v  (ratio p50 %.2f×, p99 %.2f×); heavy %v meanwhile, %v without the light one; load %s",
			prompt, heavyMax, percentile(lat, .5), percentile(lat, .99),
			float64(percentile(lat, .5))/float64(percentile(alone, .5)), float64(percentile(lat, .99))/float64(percentile(alone, .99)), tps, without, loadavg())
	}
}
