package static

import (
	"sync"
	"testing"
	"time"

	"connectrpc.com/grpchealth"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/pools/poolstest"
)

func TestContract(t *testing.T) {
	poolstest.Run(t, func(t *testing.T) *poolstest.Harness {
		reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "t"})
		a := poolstest.Authority(t)
		cfg := map[string][]string{}
		var mu sync.Mutex
		workers := map[string][]*poolstest.FakeWorker{}
		for _, id := range []string{"pool-a", "pool-s", "pool-k", "pool-d", "pool-i"} {
			for range 3 {
				w, err := poolstest.StartFakeWorker("127.0.0.1:0", []string{"m"}, poolstest.Credentials(t, a, id))
				require.NoError(t, err)
				cfg[id] = append(cfg[id], w.Addr)
				workers[id] = append(workers[id], w)
			}
		}
		p, err := New(Options{Registry: reg, Authority: a, Pools: cfg, ProbeInterval: 50 * time.Millisecond, ProbeTimeout: time.Second})
		require.NoError(t, err)
		t.Cleanup(func() {
			require.NoError(t, p.Close())
			mu.Lock()
			defer mu.Unlock()
			for _, ws := range workers {
				for _, w := range ws {
					w.Close()
				}
			}
		})
		return &poolstest.Harness{Provider: p, Registry: reg, Authority: a, MaxReplicas: 3,
			Spec: func(id string) pools.Spec { return pools.Spec{ID: id, Role: pools.RoleSampler, BaseModel: "m"} },
			Kill: func(t *testing.T, pool string, i int) {
				mu.Lock()
				w := workers[pool][i]
				mu.Unlock()
				w.Close()
				go func() { // an operator restarts it at the same address
					time.Sleep(300 * time.Millisecond)
					w2, err := poolstest.StartFakeWorker(w.Addr, []string{"m"}, poolstest.Credentials(t, a, pool))
					if err == nil {
						mu.Lock()
						workers[pool][i] = w2
						mu.Unlock()
					}
				}()
			}}
	})
}

func TestUnconfiguredPool(t *testing.T) {
	p, err := New(Options{Registry: pools.NewRegistry(pools.RegistryOptions{}), Authority: poolstest.Authority(t)})
	require.NoError(t, err)
	err = p.EnsurePool(t.Context(), pools.Spec{ID: "x", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1})
	require.ErrorContains(t, err, "0 addresses are configured")
}

// TestOnlyThePoolsWorkersAreAnnounced: an address whose worker holds a certificate of
// another pool, or of another gateway, is never announced (the gateway sends it nothing);
// the pool's own worker is.
func TestOnlyThePoolsWorkersAreAnnounced(t *testing.T) {
	a := poolstest.Authority(t)
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "t"})
	var addrs []string
	for _, c := range []*mtls.Credentials{poolstest.Credentials(t, a, "other"), poolstest.Credentials(t, poolstest.Authority(t), "p"), poolstest.Credentials(t, a, "p")} {
		w, err := poolstest.StartFakeWorker("127.0.0.1:0", []string{"m"}, c)
		require.NoError(t, err)
		t.Cleanup(w.Close)
		addrs = append(addrs, w.Addr)
	}
	p, err := New(Options{Registry: reg, Authority: a, Pools: map[string][]string{"p": addrs}, ProbeInterval: 20 * time.Millisecond, ProbeTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	require.NoError(t, p.EnsurePool(t.Context(), pools.Spec{ID: "p", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 3}))
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 1 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // ten more probes of the other two
	ms := reg.Members("p")
	require.Len(t, ms, 1)
	require.Equal(t, 2, ms[0].Replica, "only the worker of this gateway's pool")
}

// TestNotServingWorkerIsLost: a worker that answers NOT_SERVING on its grpc.health.v1
// service (shutting down, or its engine broke) is lost after ProbeFailures probes, and
// announced again, as a new incarnation, once it serves.
func TestNotServingWorkerIsLost(t *testing.T) {
	a := poolstest.Authority(t)
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "t"})
	w, err := poolstest.StartFakeWorker("127.0.0.1:0", []string{"m"}, poolstest.Credentials(t, a, "p"))
	require.NoError(t, err)
	t.Cleanup(w.Close)
	p, err := New(Options{Registry: reg, Authority: a, Pools: map[string][]string{"p": {w.Addr}}, ProbeInterval: 20 * time.Millisecond, ProbeTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	require.NoError(t, p.EnsurePool(t.Context(), pools.Spec{ID: "p", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1}))
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 1 }, 5*time.Second, 10*time.Millisecond)
	first := reg.Members("p")[0].Incarnation
	w.Health.SetStatus("", grpchealth.StatusNotServing)
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 0 }, 5*time.Second, 10*time.Millisecond)
	w.Health.SetStatus("", grpchealth.StatusServing)
	require.Eventually(t, func() bool { m := reg.Members("p"); return len(m) == 1 && m[0].Incarnation != first }, 5*time.Second, 10*time.Millisecond)
}
