package workerdrop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/pools/poolstest"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/bench/benchdata"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
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

// workerEnv is the environment of the Go workers: the test binary runs as loops worker.
func workerEnv(dir string) []string {
	return []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=ERROR"}
}

// startWorker starts a Go worker by hand with credentials of the gateway whose data dir is
// dir, and returns its address and process.
func startWorker(t *testing.T, dir string) (string, *exec.Cmd) {
	a, err := mtls.Open(filepath.Join(dir, "pools", "tls"))
	require.NoError(t, err)
	creds, err := a.Issue(worker.PoolID(tiny.Name), 0)
	require.NoError(t, err)
	files, err := creds.Write(filepath.Join(t.TempDir(), "creds"))
	require.NoError(t, err)
	return poolstest.StartWorkerProcess(t, workerEnv(dir), os.Args[0], append([]string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--threads", "1"}, files.Args()...)...)
}

// pair is a backend with two workers, an adapter on each, and how to kill the second.
type pair struct {
	b                            *worker.Backend
	healthy, doomed              string // adapter ids
	kill                         func()
	req, healthyOnly, doomedOnly *backendv1.ForwardBackwardRequest
}

// items is a batch of n sequences of seqLen tokens for each adapter (benchdata.Datum).
func items(ids []string, n, seqLen int) *backendv1.ForwardBackwardRequest {
	req := &backendv1.ForwardBackwardRequest{}
	for _, id := range ids {
		var data []*loopsv1.Datum
		for range n {
			data = append(data, benchdata.Datum(seqLen))
		}
		req.Items = append(req.Items, &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: "cross_entropy", Data: data})
	}
	return req
}

// newPair starts a backend on two workers: remote ones at fixed addresses, or the local
// provider's; each holds one adapter.
func newPair(t *testing.T, mode string, n, seqLen int) *pair {
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	o := worker.Options{DataDir: dir} // the default health checks: every 5s, 3 failures
	var procs []*exec.Cmd
	switch mode {
	case "remote": // the static provider: replica i at the i-th address
		for range 2 {
			addr, cmd := startWorker(t, dir)
			o.Workers = append(o.Workers, addr)
			procs = append(procs, cmd)
		}
		o.Pool = &worker.PoolOptions{Provider: "static"}
	case "local":
		o.Command, o.Args, o.Env = []string{os.Args[0]}, []string{"--data-dir", dir, "--threads", "1"}, workerEnv(dir)
		o.Pool = &worker.PoolOptions{Provider: "local", Replicas: 2}
	}
	b, err := worker.New(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.Eventually(t, func() bool { // both replicas attached: an adapter goes to each
		as, err := b.Allocations(t.Context(), "")
		require.NoError(t, err)
		n := 0
		for _, a := range as {
			if a.State == backends.AllocationAttached {
				n++
			}
		}
		return n == 2
	}, time.Minute, 20*time.Millisecond)
	p := &pair{b: b, healthy: "healthy", doomed: "doomed"}
	lora := &loopsv1.LoraConfig{Rank: 8, Seed: 1, TrainAttn: true, TrainMlp: true}
	for _, id := range []string{p.healthy, p.doomed} {
		_, err := b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: tiny.Name, Lora: lora})
		require.NoError(t, err)
	}
	hp, hr, _ := b.AdapterReplica(p.healthy)
	dp, dr, ok := b.AdapterReplica(p.doomed)
	require.True(t, ok)
	require.False(t, hp == dp && hr == dr, "one adapter on each replica")
	p.kill = func() {
		if mode == "remote" {
			_ = procs[dr].Process.Signal(syscall.SIGKILL)
			_, _ = procs[dr].Process.Wait()
			return
		}
		prov, _ := b.Pools()
		require.NoError(t, syscall.Kill(prov.(*local.Provider).PID(dp, dr), syscall.SIGKILL))
	}
	p.req = items([]string{p.healthy, p.doomed}, n, seqLen)
	p.healthyOnly = items([]string{p.healthy}, n, seqLen)
	p.doomedOnly = items([]string{p.doomed}, n, seqLen)
	return p
}

// timed runs one forward_backward batch and returns how long it took, and whether its
// first item succeeded (a call that failed whole is the first item's failure).
func timed(t *testing.T, p *pair, req *backendv1.ForwardBackwardRequest) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	resp, err := p.b.Trainer().ForwardBackward(ctx, req)
	took := time.Since(start)
	return took, err == nil && resp.GetResults()[0].GetResult() != nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestKilledWorkerDelay: per round, a fresh pair of workers (an adapter on each); the
// baseline is the healthy worker's items alone (median of 3). Then one worker is killed
// (SIGKILL) and one batch runs:
//   - "dead alone": only the killed worker's items, right after the kill: how long its
//     call takes to answer (Unavailable), which is what holds a batch that has both;
//   - "killed before": the batch with both workers' items, right after the kill (the dead
//     worker's connection is refused);
//   - "killed during": the same batch, the worker killed a third of the way through it
//     (its connection reset mid-call).
//
// The delay to the healthy worker's items is the batch's time less their own (baseline).
//
//	LOOPS_BENCH=1 go test -count=1 -v -run TestKilledWorkerDelay ./bench/workerdrop/
//	  LOOPS_BENCH_ROUNDS=5 LOOPS_BENCH_BATCH=4 LOOPS_BENCH_SEQ=64
func TestKilledWorkerDelay(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") != "1" {
		t.Skip("set LOOPS_BENCH=1 to run the benchmark")
	}
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	rounds, n, seqLen := env("LOOPS_BENCH_ROUNDS", 5), env("LOOPS_BENCH_BATCH", 4), env("LOOPS_BENCH_SEQ", 64)
	for _, mode := range []string{"remote", "local"} {
		for _, scenario := range []string{"dead alone", "killed before", "killed during"} {
			var alone, took, delay []time.Duration
			for range rounds {
				p := newPair(t, mode, n, seqLen)
				var a []time.Duration
				for range 3 {
					d, ok := timed(t, p, p.healthyOnly)
					require.True(t, ok)
					a = append(a, d)
				}
				base := median(a)
				var d time.Duration
				switch scenario {
				case "dead alone":
					p.kill()
					d, _ = timed(t, p, p.doomedOnly)
				case "killed before":
					p.kill()
					var ok bool
					d, ok = timed(t, p, p.req)
					require.True(t, ok, "the healthy worker's items succeed")
				case "killed during":
					go func() { time.Sleep(base / 3); p.kill() }()
					var ok bool
					d, ok = timed(t, p, p.req)
					require.True(t, ok, "the healthy worker's items succeed")
				}
				alone, took = append(alone, base), append(took, d)
				delay = append(delay, max(d-base, 0))
			}
			t.Logf("FIGURE %s workers, %s (%d rounds, %d×%d tokens per item): healthy items alone %v; this batch %v (max %v); delay to the healthy items median %v, max %v",
				mode, scenario, rounds, n, seqLen, median(alone).Round(time.Millisecond), median(took).Round(time.Millisecond),
				slices.Max(took).Round(time.Millisecond), median(delay).Round(time.Millisecond), slices.Max(delay).Round(time.Millisecond))
		}
	}
}
