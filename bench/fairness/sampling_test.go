package fairness

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// floodWhile runs clients closed-loop clients of samples (prompt + maxTokens tokens) on
// sampler for a second, then for as long as during() runs (or for d when during is nil),
// and returns how fast they generated tokens over that time. It returns once every client's
// last request has ended.
func (tn tenant) floodWhile(t *testing.T, sampler string, clients, prompt, maxTokens int, during func(), d time.Duration) rate {
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var done atomic.Int64
	tn.sampleFlood(ctx, &wg, sampler, clients, prompt, maxTokens, &done)
	tps := rateWhile(&done, during, d)
	cancel()
	wg.Wait()
	return tps
}

// rate is how fast a flood generated tokens: per second, and per second of this process's
// CPU time (engine, gateway and clients), which moves much less than the first when other
// work on the machine takes the CPUs.
type rate struct{ perSecond, perCPUSecond float64 }

func (r rate) String() string {
	return fmt.Sprintf("%.0f tokens/s (%.0f per CPU-second)", r.perSecond, r.perCPUSecond)
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rateWhile waits a second for a flood to settle, then returns how fast *done grew while
// during ran (or for d when during is nil).
func rateWhile(done *atomic.Int64, during func(), d time.Duration) rate {
	time.Sleep(time.Second)
	n0, start, cpu0 := done.Load(), time.Now(), cpuTime()
	if during != nil {
		during()
	} else {
		time.Sleep(d)
	}
	n := float64(done.Load() - n0)
	return rate{n / time.Since(start).Seconds(), n / (cpuTime() - cpu0).Seconds()}
}

// TestSamplingFairness measures, with the default 4 sampler slots and with 1: (1) a light
// tenant's sampling latency alone, beside slots − 1 heavy clients, and while another tenant
// floods the sampler from 32 clients with short prompts and with long ones (the heavy
// tenant's tokens/s during that flood, and during the same flood without the light tenant);
// (2) Jain's index over 4 equal tenants flooding together; (3) Jain's index over 4 tenants
// with unequal demand (1, 4, 16 and 64 clients), which a FIFO would serve in proportion to
// their clients. LOOPS_BENCH_SLOTS picks other slot counts, LOOPS_BENCH_PARTS some of the
// parts (benchParts; for before/after comparisons: compare.sh).
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
		t.Run(fmt.Sprintf("slots=%d", n), func(t *testing.T) { samplingFairness(t, n, benchParts()) })
	}
}

// The sampling benchmark's shapes: the light tenant's sample, and the heavy tenant's
// samples with a short and with a long prompt, from heavyClients closed-loop clients.
const (
	lightPrompt, lightMax             = 16, 16
	shortPrompt, longPrompt, heavyMax = 16, 512, 64
	heavyClients, lightSamples        = 32, 40
)

// benchParts is the parts of the sampling benchmark to run (LOOPS_BENCH_PARTS, a comma list
// of beside, short, long, heavy and share; all by default). The light tenant alone is
// always measured.
func benchParts() map[string]bool {
	parts := map[string]bool{"beside": true, "short": true, "long": true, "heavy": true, "share": true}
	if v := os.Getenv("LOOPS_BENCH_PARTS"); v != "" {
		parts = map[string]bool{}
		for _, p := range strings.Split(v, ",") {
			parts[strings.TrimSpace(p)] = true
		}
	}
	return parts
}

func samplingFairness(t *testing.T, slots int, parts map[string]bool) {
	keys := []string{"tml-light", "tml-heavy", "tml-eq-0", "tml-eq-1", "tml-eq-2", "tml-eq-3", "tml-un-0", "tml-un-1", "tml-un-2", "tml-un-3"}
	url := startServer(t, keys, core.Options{SamplingConcurrency: slots})
	light, heavy := newTenant(url, "tml-light"), newTenant(url, "tml-heavy")
	lightSampler, heavySampler := light.newSampler(t), heavy.newSampler(t)
	measure := func() []time.Duration {
		var lat []time.Duration
		for range lightSamples {
			d, _, err := light.sample(t.Context(), lightSampler, lightPrompt, lightMax)
			require.NoError(t, err)
			lat = append(lat, d)
		}
		return lat
	}
	flood := func(clients, prompt int, during func(), d time.Duration) rate {
		return heavy.floodWhile(t, heavySampler, clients, prompt, heavyMax, during, d)
	}
	ratio := func(a, b []time.Duration, p float64) float64 {
		return float64(percentile(a, p)) / float64(percentile(b, p))
	}
	for range 5 { // warm-up
		_, _, _ = light.sample(t.Context(), lightSampler, lightPrompt, lightMax)
	}
	t.Logf("%d sampler slots; light tenant samples (%d+%d tokens); load average %s", slots, lightPrompt, lightMax, loadavg())
	alone := measure()
	t.Logf("  alone:       p50 %v  p99 %v", percentile(alone, .5), percentile(alone, .99))
	if parts["beside"] && slots > 1 {
		// Beside slots-1 heavy clients the light tenant always finds a free slot: what is
		// left is the cost of sharing the engine, not of waiting.
		var shared []time.Duration
		flood(slots-1, shortPrompt, func() { shared = measure() }, 0)
		t.Logf("  beside %d heavy clients × (%d+%d) (a slot always free): p50 %v  p99 %v  (ratio p50 %.2f×, p99 %.2f×)", slots-1, shortPrompt, heavyMax,
			percentile(shared, .5), percentile(shared, .99), ratio(shared, alone, .5), ratio(shared, alone, .99))
	}
	for _, prompt := range []int{shortPrompt, longPrompt} {
		if !parts[map[int]string{shortPrompt: "short", longPrompt: "long"}[prompt]] {
			continue
		}
		var flooded []time.Duration
		tps := flood(heavyClients, prompt, func() { flooded = measure() }, 0)
		t.Logf("  under a flood of %d clients × (%d+%d): p50 %v  p99 %v  (ratio p50 %.2f×, p99 %.2f×); heavy tenant %v meanwhile; load %s",
			heavyClients, prompt, heavyMax, percentile(flooded, .5), percentile(flooded, .99), ratio(flooded, alone, .5), ratio(flooded, alone, .99), tps, loadavg())
	}
	if parts["heavy"] {
		for _, prompt := range []int{shortPrompt, longPrompt} {
			tps := flood(heavyClients, prompt, nil, 10*time.Second)
			t.Logf("  the %d-client flood × (%d+%d) without the light tenant: heavy tenant %v; load %s", heavyClients, prompt, heavyMax, tps, loadavg())
		}
	}
	if !parts["share"] {
		return
	}

	share := func(label string, tenantKeys []string, clients []int) {
		done := make([]atomic.Int64, len(tenantKeys))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var all sync.WaitGroup
		for i, key := range tenantKeys {
			tn := newTenant(url, key)
			tn.sampleFlood(ctx, &all, tn.newSampler(t), clients[i], shortPrompt, 32, &done[i])
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

// loadavg is the machine's load average (1, 5 and 15 minutes).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
