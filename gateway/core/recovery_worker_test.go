package core_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
)

// goWorkerEnv, set to 1, makes the test binary the Go worker (serve.Main), which the pool's
// worker_command starts.
const goWorkerEnv = "LOOPS_CORE_TEST_GO_WORKER"

func init() {
	if os.Getenv(goWorkerEnv) == "1" {
		os.Exit(serve.Main(os.Args[1:]))
	}
}

// TestKilledWorkerLosesNoStep: two runs train through a pool of two Go worker processes
// (loops worker, the CPU engine) marked preemptible. In the middle of step 1 — its
// forward_backward and optim_step calls submitted, none awaited — the process of the
// replica holding run 0 is killed with SIGKILL. The core rebuilds run 0's adapter on the
// surviving replica from its step-0 snapshot and replays the calls since; both runs' losses,
// optim_step metrics, final weights and Adam state equal those of the same script on one
// in-process engine, bit for bit, and no run is marked corrupted.
func TestKilledWorkerLosesNoStep(t *testing.T) {
	const k = 2
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	eng, err := reference.New(reference.Options{DataDir: dir, Threads: 1})
	require.NoError(t, err)
	want := trainRuns(t, dir, eng, k, nil)

	d := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(d, "models", "loops-tiny")))
	exe, err := os.Executable()
	require.NoError(t, err)
	b, err := worker.New(t.Context(), worker.Options{Command: []string{exe}, DataDir: d,
		Args:           []string{"--data-dir", d, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(d, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		Pool: &worker.PoolOptions{Provider: "local", Replicas: 2, HeartbeatTimeout: 6 * time.Second, Preemptible: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.True(t, b.Preemptible(tiny.Name))
	prov, reg := b.Pools()
	pool := worker.PoolID(tiny.Name)
	require.Eventually(t, func() bool { return len(reg.Members(pool)) == 2 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, b.WaitReady(t.Context()))

	killed := 0
	got := trainRuns(t, d, b, k, func(step int, runs []string) {
		if step != 1 {
			return
		}
		p, replica, ok := b.AdapterReplica(runs[0])
		require.True(t, ok)
		pid := prov.(*local.Provider).PID(p, replica)
		require.NotZero(t, pid)
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		killed = pid
	})
	require.NotZero(t, killed)
	for i := range k {
		require.Equal(t, want[i].losses, got[i].losses, "run %d losses", i)
		require.Equal(t, want[i].steps, got[i].steps, "run %d optim_step metrics", i)
		require.Equal(t, want[i].weights, got[i].weights, "run %d weights", i)
		require.Equal(t, want[i].optimizer, got[i].optimizer, "run %d Adam state", i)
	}
}
