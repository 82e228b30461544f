package fairness

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func (tn tenant) newSampler(t *testing.T) string {
	s, err := tn.sampling.CreateSampler(t.Context(), &loopsv1.CreateSamplerRequest{BaseModel: "loops/tiny"})
	require.NoError(t, err)
	return s.GetId()
}

// sample runs one sampling request (a prompt of prompt tokens, maxTokens generated) to the
// end and returns its latency and the tokens it generated.
func (tn tenant) sample(ctx context.Context, sampler string, prompt, maxTokens int) (time.Duration, int, error) {
	p := make([]int32, prompt)
	for i := range p {
		p[i] = int32(65 + i%26)
	}
	start := time.Now()
	op, err := tn.sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: sampler, Prompt: p,
		Params: &loopsv1.SamplingParams{MaxTokens: int32(maxTokens), Temperature: 1, TopP: 1}})
	if err != nil {
		return 0, 0, err
	}
	for !isDone(op) {
		if op, err = tn.ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId()}); err != nil {
			return 0, 0, err
		}
	}
	if op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
		return 0, 0, fmt.Errorf("%s", op.GetError().GetMessage())
	}
	n := 0
	for _, s := range op.GetSample().GetSequences() {
		n += len(s.GetTokens())
	}
	return time.Since(start), n, nil
}

func isDone(op *loopsv1.Operation) bool {
	return op.GetState() == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED || op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED
}

// sampleFlood runs clients closed loops of sampling requests until stop ends, adding the
// tokens of the samples finished before then to *done. Each client waits for its last
// request, so no flood leaves work queued behind it for the next measurement.
func (tn tenant) sampleFlood(stop context.Context, wg *sync.WaitGroup, sampler string, clients, prompt, maxTokens int, done *atomic.Int64) {
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for stop.Err() == nil {
				if _, n, err := tn.sample(context.Background(), sampler, prompt, maxTokens); err == nil && stop.Err() == nil {
					done.Add(int64(n))
				}
			}
		}()
	}
}

// TestSamplingFairness measures, with the default 4 sampler slots and with 1: (1) a light
// tenant's sampling latency alone and while another tenant floods the sampler from 32
// clients; (2) Jain's index over 4 equal tenants flooding together; (3) Jain's index over 4
// tenants with unequal demand (1, 4, 16 and 64 clients), which a FIFO would serve in
// proportion to their clients.
func TestSamplingFairness(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the fairness benchmark")
	}
	slots := []int{4, 1}                              // the default, and one
	if v := os.Getenv("LOOPS_BENCH_SLOTS"); v != "" { // e.g. "4,8,16"
		slots = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			slots = append(slots, n)
		}
	}
	for _, n := range slots {
		t.Run(fmt.Sprintf("slots=%d", n), func(t *testing.T) { samplingFairness(t, n) })
	}
}

func samplingFairness(t *testing.T, slots int) {
	keys := []string{"tml-light", "tml-heavy", "tml-eq-0", "tml-eq-1", "tml-eq-2", "tml-eq-3", "tml-un-0", "tml-un-1", "tml-un-2", "tml-un-3"}
	url := startServer(t, keys, core.Options{SamplingConcurrency: slots})
	light, heavy := newTenant(url, "tml-light"), newTenant(url, "tml-heavy")
	lightSampler, heavySampler := light.newSampler(t), heavy.newSampler(t)
	const prompt, lightMax, heavyMax, heavyClients, samples = 16, 16, 64, 32, 40
	measure := func() []time.Duration {
		var lat []time.Duration
		for range samples {
			d, _, err := light.sample(t.Context(), lightSampler, prompt, lightMax)
			require.NoError(t, err)
			lat = append(lat, d)
		}
		return lat
	}
	for range 5 { // warm-up
		_, _, _ = light.sample(t.Context(), lightSampler, prompt, lightMax)
	}
	alone := measure()
	// Beside slots-1 heavy clients the light tenant always finds a free slot: what is left
	// is the cost of sharing the CPU, not of waiting.
	var shared []time.Duration
	if slots > 1 {
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var n atomic.Int64
		heavy.sampleFlood(ctx, &wg, heavySampler, slots-1, prompt, heavyMax, &n)
		time.Sleep(time.Second)
		shared = measure()
		cancel()
		wg.Wait()
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var heavyDone atomic.Int64
	heavy.sampleFlood(ctx, &wg, heavySampler, heavyClients, prompt, heavyMax, &heavyDone)
	time.Sleep(time.Second)
	flooded := measure()
	cancel()
	wg.Wait()
	t.Logf("%d sampler slots; light tenant samples (%d+%d tokens), heavy tenant flooding from %d clients × (%d+%d tokens):", slots, prompt, lightMax, heavyClients, prompt, heavyMax)
	t.Logf("  alone:       p50 %v  p99 %v", percentile(alone, .5), percentile(alone, .99))
	if shared != nil {
		t.Logf("  beside %d heavy clients (a slot always free): p50 %v  p99 %v  (ratio p50 %.2f×, p99 %.2f×)", slots-1,
			percentile(shared, .5), percentile(shared, .99),
			float64(percentile(shared, .5))/float64(percentile(alone, .5)), float64(percentile(shared, .99))/float64(percentile(alone, .99)))
	}
	t.Logf("  under flood: p50 %v  p99 %v  (ratio p50 %.2f×, p99 %.2f×; heavy generated %d tokens meanwhile)",
		percentile(flooded, .5), percentile(flooded, .99),
		float64(percentile(flooded, .5))/float64(percentile(alone, .5)), float64(percentile(flooded, .99))/float64(percentile(alone, .99)), heavyDone.Load())

	share := func(label string, tenantKeys []string, clients []int) {
		done := make([]atomic.Int64, len(tenantKeys))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var all sync.WaitGroup
		for i, key := range tenantKeys {
			tn := newTenant(url, key)
			tn.sampleFlood(ctx, &all, tn.newSampler(t), clients[i], prompt, 32, &done[i])
		}
		all.Wait()
		x := make([]float64, len(done))
		for i := range x {
			x[i] = float64(done[i].Load())
		}
		t.Logf("%s, clients %v, tokens generated in 10 s: %v; Jain's index %.3f", label, clients, x, jain(x))
	}
	share("equal tenants", keys[2:6], []int{8, 8, 8, 8})
	share("unequal demand", keys[6:10], []int{1, 4, 16, 64})
}
