package recovery

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

const goWorkerEnv = "LOOPS_BENCH_GO_WORKER"

func init() {
	if os.Getenv(goWorkerEnv) == "1" {
		os.Exit(serve.Main(os.Args[1:]))
	}
}

func env(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// trainer is one core and one run on it.
type trainer struct {
	t   *testing.T
	ctx context.Context
	svc core.Services
	run string
	reg *prometheus.Registry
}

func newTrainer(t *testing.T, b *worker.Backend, recover bool, rank int) *trainer {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	c, err := core.New(t.Context(), st, b, core.Options{DataDir: dir, RecoverSteps: recover, Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(); _ = st.Close() })
	tr := &trainer{t: t, ctx: auth.WithWorkspace(t.Context(), "ws"), svc: c.Services(), reg: reg}
	tr.run = tr.wait(tr.svc.Training.CreateTrainingRun(tr.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: int32(rank), Seed: 1, TrainAttn: true, TrainMlp: true}})).GetTrainingRunId()
	return tr
}

func (tr *trainer) wait(op *loopsv1.Operation, err error) *loopsv1.Operation {
	tr.t.Helper()
	require.NoError(tr.t, err)
	got, err := tr.svc.Operations.WaitOperation(tr.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(5 * time.Minute)})
	require.NoError(tr.t, err)
	require.Equal(tr.t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
	return got
}

// batch is n sequences of seqLen tokens for cross_entropy.
func batch(n, seqLen, salt int) []*loopsv1.Datum {
	var out []*loopsv1.Datum
	for i := range n {
		d := &loopsv1.Datum{LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64}, "weights": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32}}}
		for j := range seqLen {
			d.Tokens = append(d.Tokens, int32(65+(i*7+salt*3+j)%26))
			d.LossFnInputs["target_tokens"].Int64Data = append(d.LossFnInputs["target_tokens"].Int64Data, int64(65+(i*7+salt*3+j+1)%26))
			d.LossFnInputs["weights"].Float32Data = append(d.LossFnInputs["weights"].Float32Data, 1)
		}
		out = append(out, d)
	}
	return out
}

func (tr *trainer) fb(data []*loopsv1.Datum) (*loopsv1.Operation, error) {
	return tr.svc.Training.ForwardBackward(tr.ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: tr.run, LossFn: "cross_entropy", Data: data})
}

func (tr *trainer) optim() (*loopsv1.Operation, error) {
	return tr.svc.Training.OptimStep(tr.ctx, &loopsv1.OptimStepRequest{TrainingRunId: tr.run, Adam: &loopsv1.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}})
}

// step submits fbs forward_backward calls and an optim_step, as a pipelining script does,
// then waits for all of them.
func (tr *trainer) step(fbs int, data []*loopsv1.Datum) {
	var ops []*loopsv1.Operation
	for range fbs {
		op, err := tr.fb(data)
		require.NoError(tr.t, err)
		ops = append(ops, op)
	}
	op, err := tr.optim()
	require.NoError(tr.t, err)
	for _, o := range append(ops, op) {
		tr.wait(o, nil)
	}
}

// histogram returns a histogram's sample count and sum from the trainer's registry.
func (tr *trainer) histogram(name string) (uint64, float64) {
	mfs, err := tr.reg.Gather()
	require.NoError(tr.t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			var h *dto.Histogram = mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestStepRecoveryOverhead trains one run on a core without step recovery and one on a core
// with it, over the same pool of two Go workers, alternating rounds of LOOPS_BENCH_STEPS
// steps (LOOPS_BENCH_FBS forward_backward calls of LOOPS_BENCH_BATCH sequences of 64 tokens,
// then an optim_step, submitted together). It reports the median step time of each and
// their ratio, and the snapshot time. Then it kills the worker holding the recovering run
// after 0..LOOPS_BENCH_FBS of a step's calls finished and reports the time of the call that
// met the loss (rebuild and replay included) against an ordinary call.
//
//	LOOPS_BENCH=1 go test -count=1 -v -run TestStepRecoveryOverhead ./bench/recovery/
//	  LOOPS_BENCH_ROUNDS=5 LOOPS_BENCH_STEPS=5 LOOPS_BENCH_FBS=4 LOOPS_BENCH_BATCH=8 LOOPS_BENCH_RANK=16
func TestStepRecoveryOverhead(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") != "1" {
		t.Skip("set LOOPS_BENCH=1 to run the benchmark")
	}
	rounds, steps := env("LOOPS_BENCH_ROUNDS", 5), env("LOOPS_BENCH_STEPS", 5)
	fbs, bsz, rank := env("LOOPS_BENCH_FBS", 4), env("LOOPS_BENCH_BATCH", 8), env("LOOPS_BENCH_RANK", 16)
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	exe, err := os.Executable()
	require.NoError(t, err)
	b, err := worker.New(t.Context(), worker.Options{Command: []string{exe}, DataDir: dir,
		AllowDirs:      []string{os.TempDir()}, // each trainer's core has a data dir of its own
		Args:           []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: time.Minute,
		Pool: &worker.PoolOptions{Provider: "local", Replicas: 2, HeartbeatTimeout: 6 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	prov, reg := b.Pools()
	pool := worker.PoolID(tiny.Name)
	both := func() {
		require.Eventually(t, func() bool { return len(reg.Members(pool)) == 2 }, time.Minute, 20*time.Millisecond)
		require.NoError(t, b.WaitReady(t.Context()))
	}
	both()
	plain, rec := newTrainer(t, b, false, rank), newTrainer(t, b, true, rank)
	data := batch(bsz, 64, 1)
	plain.step(fbs, data) // warm-up
	rec.step(fbs, data)
	var tp, tr []float64
	for round := range rounds {
		for _, x := range []struct {
			tr  *trainer
			out *[]float64
		}{{plain, &tp}, {rec, &tr}} {
			start := time.Now()
			for range steps {
				x.tr.step(fbs, data)
			}
			*x.out = append(*x.out, time.Since(start).Seconds()/float64(steps))
		}
		t.Logf("round %d: step %.1f ms without step recovery, %.1f ms with it", round, 1000*tp[round], 1000*tr[round])
	}
	n, sum := rec.histogram("loops_step_snapshot_seconds")
	t.Logf("FIGURE step time (median of %d rounds of %d steps; %d forward_backward × %d×64 tokens + optim_step, rank %d, loops/tiny): %.1f ms without, %.1f ms with step recovery: %.3f×; %d snapshots, mean %.1f ms each",
		rounds, steps, fbs, bsz, rank, 1000*median(tp), 1000*median(tr), median(tr)/median(tp), n, 1000*sum/float64(max(n, 1)))

	// A loss after m of a step's calls: the call that meets it waits for the rebuild.
	var ordinary []float64
	for m := 0; m <= fbs; m++ {
		both()
		for range fbs { // an undisturbed step, its calls timed one by one
			start := time.Now()
			rec.wait(rec.fb(data))
			ordinary = append(ordinary, time.Since(start).Seconds())
		}
		rec.wait(rec.optim())
		for range m {
			rec.wait(rec.fb(data))
		}
		p, replica, ok := b.AdapterReplica(rec.run)
		require.True(t, ok)
		pid := prov.(*local.Provider).PID(p, replica)
		require.NotZero(t, pid)
		n0, s0 := rec.histogram("loops_step_rebuild_seconds")
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		start := time.Now()
		if m < fbs {
			rec.wait(rec.fb(data))
		} else {
			rec.wait(rec.optim())
		}
		hit := time.Since(start).Seconds()
		n1, s1 := rec.histogram("loops_step_rebuild_seconds")
		require.Equal(t, n0+1, n1, "one rebuild")
		t.Logf("FIGURE loss after %d of a step's %d forward_backward calls: the next call took %.0f ms (rebuild %.0f ms) vs %.0f ms for an ordinary call",
			m, fbs, 1000*hit, 1000*(s1-s0), 1000*median(ordinary))
		for range fbs - m - 1 {
			rec.wait(rec.fb(data))
		}
		if m < fbs {
			rec.wait(rec.optim())
		}
	}
}
