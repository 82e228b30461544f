package fairness

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestDecodeThroughput measures the reference engine's decode tokens/s on loops/tiny with
// 1, 8 and 32 sampling requests in flight at once (each of 16 prompt + 64 generated
// tokens, one sample), against the same requests one after another. It calls the engine
// directly (no gateway): with continuous batching the requests in flight decode together.
func TestDecodeThroughput(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the decode benchmark")
	}
	e, err := reference.New(reference.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	defer e.Close()
	const prompt, maxTokens = 16, 64
	req := func(i int) *backendv1.SampleRequest {
		p := make([]int32, prompt)
		for k := range p {
			p[k] = int32(65 + (i+k)%26)
		}
		seed := uint64(i)
		return &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: p, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: maxTokens, Temperature: 1, TopP: 1, Seed: &seed, StopTokens: nil}}
	}
	// run sends n requests, conc at a time, and returns the tokens generated per second.
	run := func(n, conc int) float64 {
		start := time.Now()
		var tokens int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, conc)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				r, err := e.Sample(context.Background(), req(i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, s := range r.GetResult().GetSequences() {
					tokens += int64(len(s.GetTokens()))
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		return float64(tokens) / time.Since(start).Seconds()
	}
	run(8, 8) // warm-up
	for _, conc := range []int{1, 8, 32} {
		n := max(2*conc, 16)
		seq := run(n, 1)
		par := run(n, conc)
		t.Logf("%2d requests in flight (%d requests × %d+%d tokens): one at a time %6.0f tokens/s, at once %6.0f tokens/s: %.2f×",
			conc, n, prompt, maxTokens, seq, par, par/seq)
	}
}
