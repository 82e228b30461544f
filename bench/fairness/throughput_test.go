package fairness

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core"
)

// TestThroughput measures forward_backward throughput on loops/tiny with 1, 8 and 64 runs
// on one base model stepping at once (each run's client sends a step and waits for it; the
// lane batches the runs' ready steps into one backend call) against the same steps sent
// one after another by one client (one run's step per backend call).
func TestThroughput(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the throughput benchmark")
	}
	url := startServer(t, []string{"tml-tput"}, core.Options{})
	tn := newTenant(url, "tml-tput")
	const tokens = 64
	var runs []string
	for range 64 {
		runs = append(runs, tn.newRun(t))
	}
	for _, r := range runs[:8] { // warm-up
		_, err := tn.step(t.Context(), r, tokens)
		require.NoError(t, err)
	}
	for _, c := range []struct{ runs, steps int }{{1, 48}, {8, 12}, {64, 3}} {
		rs := runs[:c.runs]
		work := float64(c.runs * c.steps * tokens)

		start := time.Now()
		for range c.steps {
			for _, r := range rs {
				_, err := tn.step(t.Context(), r, tokens)
				require.NoError(t, err)
			}
		}
		seq := time.Since(start)

		start = time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, c.runs)
		for _, r := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range c.steps {
					if _, err := tn.step(context.Background(), r, tokens); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		require.NoError(t, <-errs)
		conc := time.Since(start)
		t.Logf("%2d runs × %2d steps × %d tokens: one after another %7.0f tokens/s (%v), at once %7.0f tokens/s (%v): %.2f×",
			c.runs, c.steps, tokens, work/seq.Seconds(), seq.Round(time.Millisecond), work/conc.Seconds(), conc.Round(time.Millisecond), seq.Seconds()/conc.Seconds())
	}
}
