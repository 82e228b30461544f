package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestPublishAfterCommit measures what two gateways on one database cost each operation:
// on PostgreSQL (fsync and synchronous_commit on, as in production), the same
// forward_backward + optim_step loop through loops.v1 with the outcome journal (an outcome
// is shown once in the local journal; the default of a lone gateway) and with
// PublishAfterCommit (shown once committed to PostgreSQL; what a gateway with a standby
// does, docs/two-gateways.md), alternating rounds in one process.
func TestPublishAfterCommit(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the gateway benchmarks")
	}
	pg, err := pgtest.Launch([]string{"fsync=on", "synchronous_commit=on"})
	if err != nil {
		t.Skipf("pgtest: %v", err)
	}
	defer pg.Stop()
	const rounds, perRound = 3, 100
	modes := []struct {
		name  string
		after bool
	}{{"journal (lone gateway)", false}, {"publish after commit (with a standby)", true}}
	fbs, opts := make([]stats, len(modes)), make([]stats, len(modes))
	for r := range rounds {
		for m, mode := range modes {
			fb, opt := publishRound(t, pg, mode.after, perRound)
			fbs[m].d, opts[m].d = append(fbs[m].d, fb.d...), append(opts[m].d, opt.d...)
			fbs[m].cpu, opts[m].cpu = fbs[m].cpu+fb.cpu, opts[m].cpu+opt.cpu
			t.Logf("round %d %s: optim_step p50 %s", r+1, mode.name, opt.pct(0.5))
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nPostgreSQL (fsync on), %d × %d iterations per mode, alternating; load %s", rounds, perRound, load)
	fmt.Println("| outcomes shown | forward_backward p50 | p99 | optim_step p50 | p99 | CPU/op (fb+opt) |")
	fmt.Println("|---|---|---|---|---|---|")
	for m, mode := range modes {
		n := time.Duration(len(fbs[m].d))
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", mode.name, fbs[m].pct(0.5), fbs[m].pct(0.99), opts[m].pct(0.5), opts[m].pct(0.99), (fbs[m].cpu+opts[m].cpu)/n)
	}
}

// publishRound runs perRound steps on a fresh gateway on a fresh database of pg.
func publishRound(t *testing.T, pg *pgtest.Server, after bool, perRound int) (fb, opt stats) {
	ctx := t.Context()
	url, err := pg.CreateDatabase(ctx)
	require.NoError(t, err)
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(ctx, ln, gateway.Config{DataDir: t.TempDir(), Store: st, Core: core.Options{PublishAfterCommit: after}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	defer srv.Close(context.Background())
	base := "http://" + ln.Addr().String()
	key := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", "tml-bench")
			return next(ctx, req)
		}
	}))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, base, key)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, base, key)
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
	d := datum(32)
	adam := &loopsv1.AdamParams{LearningRate: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
	for i := range perRound + 5 {
		t0, c0 := time.Now(), cpuTime()
		wait(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, Data: []*loopsv1.Datum{d}, LossFn: "cross_entropy"}))
		t1, c1 := time.Now(), cpuTime()
		wait(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: adam}))
		if i >= 5 {
			fb.add(t1.Sub(t0))
			opt.add(time.Since(t1))
			fb.cpu += c1 - c0
			opt.cpu += cpuTime() - c1
		}
	}
	return fb, opt
}
