package gateway

import (
	"context"
	"net"
	"net/http"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/bench/benchdata"
	"github.com/loops-dev/loops/gateway"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

const iterations = 200

func datum(n int) *loopsv1.Datum { return benchdata.Datum(n) }

// stats holds one path's latencies and the process CPU time its loop took.
type stats struct {
	d   []time.Duration
	cpu time.Duration
}

func (s *stats) add(d time.Duration) { s.d = append(s.d, d) }
func (s *stats) pct(p float64) time.Duration {
	x := slices.Clone(s.d)
	slices.Sort(x)
	return x[min(len(x)-1, int(p*float64(len(x))))]
}

func TestOverhead(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the gateway overhead benchmark")
	}
	ctx := t.Context()
	dir := t.TempDir()
	// LOOPS_BENCH_THREADS sets the reference engine's kernel goroutines (default: one per
	// core), for the baseline and the gateway alike. With all cores, the engine in this
	// process starves the gateway and the HTTP client while it computes; with fewer, the
	// figures show the gateway's own cost rather than that contention.
	var beOpts map[string]string
	if n := os.Getenv("LOOPS_BENCH_THREADS"); n != "" {
		beOpts = map[string]string{"threads": n}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(ctx, ln, gateway.Config{DataDir: dir, BackendConfig: backends.Config{Options: beOpts}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	defer srv.Close(context.Background())
	url := "http://" + ln.Addr().String()

	// The baseline: the same engine, called directly, in this process.
	be, err := backends.Open(ctx, "reference", backends.Config{DataDir: t.TempDir(), Options: beOpts})
	require.NoError(t, err)
	defer be.Close()
	_, err = be.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "direct", BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 8, TrainAttn: true, TrainMlp: true}})
	require.NoError(t, err)
	d := datum(32)
	adam := &loopsv1.AdamParams{LearningRate: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
	var directFB, directOpt stats
	for i := range iterations + 10 {
		t0, c0 := time.Now(), cpuTime()
		_, err := be.Trainer().ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "direct", Data: []*loopsv1.Datum{d}, LossFn: "cross_entropy"}}})
		require.NoError(t, err)
		t1, c1 := time.Now(), cpuTime()
		_, err = be.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "direct", Adam: adam})
		require.NoError(t, err)
		if i >= 10 {
			directFB.add(t1.Sub(t0))
			directOpt.add(time.Since(t1))
			directFB.cpu += c1 - c0
			directOpt.cpu += cpuTime() - c1
		}
	}

	// Through loops.v1 over Connect: submit, then long-poll the operation.
	key := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", "tml-bench")
			return next(ctx, req)
		}
	}))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, key)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, key)
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		require.NoError(t, err)
		for op.GetDoneTime() == nil {
			op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
			require.NoError(t, err)
		}
		require.Nil(t, op.GetError())
		return op
	}
	run := wait(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 8, TrainAttn: true, TrainMlp: true}})).GetTrainingRunId()
	var connectFB, connectOpt stats
	for i := range iterations + 10 {
		t0, c0 := time.Now(), cpuTime()
		wait(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, Data: []*loopsv1.Datum{d}, LossFn: "cross_entropy"}))
		t1, c1 := time.Now(), cpuTime()
		wait(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: adam}))
		if i >= 10 {
			connectFB.add(t1.Sub(t0))
			connectOpt.add(time.Since(t1))
			connectFB.cpu += c1 - c0
			connectOpt.cpu += cpuTime() - c1
		}
	}

	// Through Tinker's routes, as the SDK sends them: protobuf forward_backward, JSON
	// optim_step, retrieve_future long-polls.
	tc := newTinkerClient(t, url, d, nil)
	var tinkerFB, tinkerOpt stats
	for i := range iterations + 10 {
		t0, c0 := time.Now(), cpuTime()
		tc.forwardBackward()
		t1, c1 := time.Now(), cpuTime()
		tc.optimStep()
		if i >= 10 {
			tinkerFB.add(t1.Sub(t0))
			tinkerOpt.add(time.Since(t1))
			tinkerFB.cpu += c1 - c0
			tinkerOpt.cpu += cpuTime() - c1
		}
	}

	// CPU: the whole process's per operation (the engine, the gateway and the HTTP client in
	// it); over the baseline, it is what the gateway and the client add, which on a machine
	// with few cores turns into latency.
	row := func(name string, s, base *stats) {
		n := time.Duration(len(s.d))
		t.Logf("%-34s p50 %8.3f ms  p99 %8.3f ms  overhead p50 %+7.3f ms  CPU/op %6.3f ms (%+6.3f)", name,
			ms(s.pct(0.5)), ms(s.pct(0.99)), ms(s.pct(0.5))-ms(base.pct(0.5)), ms(s.cpu/n), ms(s.cpu/n)-ms(base.cpu/n))
	}
	t.Logf("%d iterations, 1 datum x 32 tokens, loops/tiny, LoRA rank 8 (attn+mlp)", iterations)
	row("forward_backward, backend direct", &directFB, &directFB)
	row("forward_backward, loops.v1 Connect", &connectFB, &directFB)
	row("forward_backward, Tinker HTTP", &tinkerFB, &directFB)
	row("optim_step, backend direct", &directOpt, &directOpt)
	row("optim_step, loops.v1 Connect", &connectOpt, &directOpt)
	row("optim_step, Tinker HTTP", &tinkerOpt, &directOpt)
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
