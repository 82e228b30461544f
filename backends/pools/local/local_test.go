package local

import (
	"os"
	"path/filepath"
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
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "s3cret", HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: time.Second})
	srv, err := pools.Serve(reg, "127.0.0.1:0")
	require.NoError(t, err)
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, []byte("s3cret\n"), 0o600))
	p, err := New(Options{Registry: reg, RegistryURL: srv.URL(), JoinTokenFile: tok, Command: []string{os.Args[0]},
		Env: []string{poolstest.FakeWorkerEnv + "=1"}, GPUs: []string{"0", "1", "2", "3"}, Backoff: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		reg.Close()
		_ = srv.Close()
	})
	h := &poolstest.Harness{Provider: p, Registry: reg, MaxReplicas: 4,
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
