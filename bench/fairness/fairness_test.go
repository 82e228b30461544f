package fairness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/bench/benchdata"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

type tenant struct {
	training loopsv1connect.TrainingServiceClient
	ops      loopsv1connect.OperationServiceClient
	sampling loopsv1connect.SamplingServiceClient
}

type keyTransport struct {
	key  string
	base http.RoundTripper
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", k.key)
	return k.base.RoundTrip(r)
}

func newTenant(url, key string) tenant {
	hc := &http.Client{Transport: keyTransport{key, http.DefaultTransport}}
	return tenant{loopsv1connect.NewTrainingServiceClient(hc, url), loopsv1connect.NewOperationServiceClient(hc, url), loopsv1connect.NewSamplingServiceClient(hc, url)}
}

// startServer serves a gateway with the reference backend on a loopback port for the keys
// and returns its URL; the server is closed when the test ends.
func startServer(t *testing.T, keys []string, opts core.Options) string {
	t.Helper()
	parsed, err := auth.ParseKeys(keys)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: parsed, Core: opts})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return "http://" + ln.Addr().String()
}

func datum(n int) *loopsv1.Datum { return benchdata.Datum(n) }

func (tn tenant) wait(ctx context.Context, op *loopsv1.Operation) error {
	for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
		if op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED {
			return fmt.Errorf("%s", op.GetError().GetMessage())
		}
		var err error
		op, err = tn.ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(25 * time.Second)})
		if err != nil {
			return err
		}
	}
	return nil
}

func (tn tenant) newRun(t *testing.T) string {
	op, err := tn.training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 8, TrainAttn: true, TrainMlp: true}})
	require.NoError(t, err)
	require.NoError(t, tn.wait(t.Context(), op))
	return op.GetTrainingRunId()
}

// step runs one forward_backward of n tokens and returns its latency.
func (tn tenant) step(ctx context.Context, run string, n int) (time.Duration, error) {
	start := time.Now()
	op, err := tn.training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(n)}})
	if err != nil {
		return 0, err
	}
	return time.Since(start), tn.wait(ctx, op)
}

// flood runs forward_backward steps of n tokens on each run until ctx ends; it adds the
// tokens done to *done.
func (tn tenant) flood(ctx context.Context, wg *sync.WaitGroup, runs []string, n int, done *atomic.Int64) {
	for _, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := tn.step(ctx, run, n); err == nil {
					done.Add(int64(n))
				}
			}
		}()
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func jain(x []float64) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	return sum * sum / (float64(len(x)) * sq)
}

// TestFairness measures (1) the light tenant's forward_backward latency alone and while
// another tenant floods the same base model from 8 runs, and (2) Jain's index over 4 equal
// tenants flooding together.
func TestFairness(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the fairness benchmark")
	}
	keys := []string{"tml-light", "tml-heavy", "tml-eq-0", "tml-eq-1", "tml-eq-2", "tml-eq-3"}
	url := startServer(t, keys, core.Options{})

	light, heavy := newTenant(url, "tml-light"), newTenant(url, "tml-heavy")
	lightRun := light.newRun(t)
	var heavyRuns []string
	for range 8 {
		heavyRuns = append(heavyRuns, heavy.newRun(t))
	}
	const lightTokens, heavyTokens, samples = 32, 256, 40
	measure := func() []time.Duration {
		var lat []time.Duration
		for range samples {
			d, err := light.step(t.Context(), lightRun, lightTokens)
			require.NoError(t, err)
			lat = append(lat, d)
		}
		return lat
	}
	for range 5 { // warm-up
		_, _ = light.step(t.Context(), lightRun, lightTokens)
	}
	alone := measure()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var heavyDone atomic.Int64
	heavy.flood(ctx, &wg, heavyRuns, heavyTokens, &heavyDone)
	time.Sleep(time.Second)
	flooded := measure()
	cancel()
	wg.Wait()
	t.Logf("light tenant forward_backward (%d tokens), heavy tenant flooding from %d runs × %d tokens:", lightTokens, len(heavyRuns), heavyTokens)
	t.Logf("  alone:       p50 %v  p99 %v", percentile(alone, .5), percentile(alone, .99))
	t.Logf("  under flood: p50 %v  p99 %v  (ratio p50 %.2f×, p99 %.2f×; heavy did %d tokens meanwhile)",
		percentile(flooded, .5), percentile(flooded, .99),
		float64(percentile(flooded, .5))/float64(percentile(alone, .5)), float64(percentile(flooded, .99))/float64(percentile(alone, .99)), heavyDone.Load())

	// Equal tenants: 4 workspaces, 2 runs each, flooding together for 15 s.
	done := make([]atomic.Int64, 4)
	tenants := make([]tenant, 4)
	runs := make([][]string, 4)
	for i := range tenants {
		tenants[i] = newTenant(url, keys[2+i])
		runs[i] = []string{tenants[i].newRun(t), tenants[i].newRun(t)}
	}
	ctx, cancel = context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var eq sync.WaitGroup
	for i, tn := range tenants {
		tn.flood(ctx, &eq, runs[i], 128, &done[i])
	}
	eq.Wait()
	x := make([]float64, 4)
	for i := range x {
		x[i] = float64(done[i].Load())
	}
	t.Logf("equal tenants, tokens done in 15 s: %v; Jain's index %.3f", x, jain(x))
}
