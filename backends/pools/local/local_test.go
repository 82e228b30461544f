package local

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/poolstest"
)

func TestMain(m *testing.M) {
	poolstest.FakeWorkerMain()
	os.Exit(m.Run())
}

func newHarness(t *testing.T) (*poolstest.Harness, *Provider) {
	a := poolstest.Authority(t)
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "s3cret", HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: time.Second})
	srv, err := pools.Serve(reg, "127.0.0.1:0", a.RegistryConfig())
	require.NoError(t, err)
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, []byte("s3cret\n"), 0o600))
	p, err := New(Options{Registry: reg, RegistryURL: srv.URL(), JoinTokenFile: tok, Authority: a, Command: []string{os.Args[0]},
		Env: []string{poolstest.FakeWorkerEnv + "=1"}, GPUs: []string{"0", "1", "2", "3"}, Backoff: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		reg.Close()
		_ = srv.Close()
	})
	h := &poolstest.Harness{Provider: p, Registry: reg, Authority: a, MaxReplicas: 4,
		Spec: func(id string) pools.Spec {
			return pools.Spec{ID: id, Role: pools.RoleTrainer, BaseModel: "loops/tiny", GPUsPerReplica: 1}
		},
		Kill: func(t *testing.T, pool string, i int) {
			pid := p.PID(pool, i)
			require.NotZero(t, pid)
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		}}
	return h, p
}

func TestContract(t *testing.T) {
	poolstest.Run(t, func(t *testing.T) *poolstest.Harness { h, _ := newHarness(t); return h })
}

// Each replica gets its own GPUs through CUDA_VISIBLE_DEVICES; GPUs come back when a pool
// shrinks or goes, and a pool asking for more than are free is refused.
func TestGPUAssignment(t *testing.T) {
	h, p := newHarness(t)
	ctx := t.Context()
	spec := pools.Spec{ID: "g", Role: pools.RoleSampler, BaseModel: "m", Replicas: 2, GPUsPerReplica: 2}
	require.NoError(t, p.EnsurePool(ctx, spec))
	ch, err := p.Watch(ctx, "g")
	require.NoError(t, err)
	for range 2 {
		ev := <-ch
		require.Equal(t, pools.Up, ev.Kind)
	}
	var seen []string
	for _, m := range h.Registry.Members("g") {
		seen = append(seen, m.Capabilities.GetImplementation())
	}
	require.ElementsMatch(t, []string{"fake cuda=0,1", "fake cuda=2,3"}, seen)
	err = p.EnsurePool(ctx, pools.Spec{ID: "h", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1, GPUsPerReplica: 1})
	require.ErrorContains(t, err, "needs 1 GPUs")
	require.Error(t, p.ScalePool(ctx, "g", 3), "a third replica has no GPUs")
	require.NoError(t, p.ScalePool(ctx, "g", 1))
	require.NoError(t, p.EnsurePool(ctx, pools.Spec{ID: "h", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 2, GPUsPerReplica: 1}))
	require.Error(t, p.EnsurePool(ctx, pools.Spec{ID: "h", Role: pools.RoleTrainer, BaseModel: "other", Replicas: 2, GPUsPerReplica: 1}), "another shape under the same id")
}

// A trainer replica of N > 1 GPUs is started as N ranks (--world-size N), a sampler
// replica of N > 1 GPUs as one process whose vLLM is tensor-parallel over them; one GPU or
// a CPU replica gets neither.
func TestRankArgs(t *testing.T) {
	require.Equal(t, []string{"--world-size", "4"}, rankArgs(pools.Spec{Role: pools.RoleTrainer, GPUsPerReplica: 4}))
	require.Empty(t, rankArgs(pools.Spec{Role: pools.RoleTrainer, GPUsPerReplica: 1}))
	require.Empty(t, rankArgs(pools.Spec{Role: pools.RoleTrainer}))
	require.Equal(t, []string{"--vllm-tensor-parallel-size", "2"}, rankArgs(pools.Spec{Role: pools.RoleSampler, GPUsPerReplica: 2}))
	require.Empty(t, rankArgs(pools.Spec{Role: pools.RoleSampler, GPUsPerReplica: 1}))
}

// TestWorkerSecretsStayPrivate: a worker process gets its join token and TLS key by files
// only others cannot read (a folder of mode 0700, files of 0600), never on its command
// line or in its environment (both readable by other users through /proc); its
// credentials go when the pool does.
func TestWorkerSecretsStayPrivate(t *testing.T) {
	h, p := newHarness(t)
	ctx := t.Context()
	require.NoError(t, p.EnsurePool(ctx, pools.Spec{ID: "s", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1}))
	require.Eventually(t, func() bool { return len(h.Registry.Members("s")) == 1 }, 20*time.Second, 20*time.Millisecond)
	pid := p.PID("s", 0)
	require.NotZero(t, pid)
	for _, f := range []string{"cmdline", "environ"} {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), f))
		require.NoError(t, err)
		require.NotContains(t, string(b), "s3cret", "the join token")
		require.NotContains(t, string(b), "PRIVATE KEY", "the TLS key")
	}
	dir := filepath.Join(h.Authority.Dir(), "local", "s-0")
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	fi, err = os.Stat(filepath.Join(dir, "key.pem"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NoError(t, p.DeletePool(ctx, "s"))
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "removed with its process")
}

// TestCleanExitIsRestarted: a worker that exits with status 0 and prints nothing (a drained
// worker) is an exit like any other: reported and started again, never a crash of the
// gateway (it was a nil error dereference).
func TestCleanExitIsRestarted(t *testing.T) {
	a := poolstest.Authority(t)
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "s3cret"})
	t.Cleanup(reg.Close)
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, []byte("s3cret\n"), 0o600))
	exits := make(chan string, 16)
	p, err := New(Options{Registry: reg, RegistryURL: "https://127.0.0.1:1", JoinTokenFile: tok, Authority: a,
		Command: []string{"true"}, Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		OnExit: func(_ string, _ int, why string) {
			select {
			case exits <- why:
			default:
			}
		}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	require.NoError(t, p.EnsurePool(t.Context(), pools.Spec{ID: "c", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1}))
	for range 2 {
		select {
		case why := <-exits:
			require.Contains(t, why, "status 0")
		case <-time.After(20 * time.Second):
			t.Fatal("the worker was not started again after a clean exit")
		}
	}
}
