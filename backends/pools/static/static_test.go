package static

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/poolstest"
)

func TestContract(t *testing.T) {
	poolstest.Run(t, func(t *testing.T) *poolstest.Harness {
		reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "t"})
		cfg := map[string][]string{}
		var mu sync.Mutex
		workers := map[string][]*poolstest.FakeWorker{}
		for _, id := range []string{"pool-a", "pool-s", "pool-k", "pool-d", "pool-i"} {
			for range 3 {
				w, err := poolstest.StartFakeWorker("127.0.0.1:0", []string{"m"})
				require.NoError(t, err)
				cfg[id] = append(cfg[id], w.Addr)
				workers[id] = append(workers[id], w)
			}
		}
		p, err := New(Options{Registry: reg, Pools: cfg, ProbeInterval: 50 * time.Millisecond, ProbeTimeout: time.Second})
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
		return &poolstest.Harness{Provider: p, Registry: reg, MaxReplicas: 3,
			Spec: func(id string) pools.Spec { return pools.Spec{ID: id, Role: pools.RoleSampler, BaseModel: "m"} },
			Kill: func(t *testing.T, pool string, i int) {
				mu.Lock()
				w := workers[pool][i]
				mu.Unlock()
				w.Close()
				go func() { // an operator restarts it at the same address
					time.Sleep(300 * time.Millisecond)
					w2, err := poolstest.StartFakeWorker(w.Addr, []string{"m"})
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
	p, err := New(Options{Registry: pools.NewRegistry(pools.RegistryOptions{})})
	require.NoError(t, err)
	err = p.EnsurePool(t.Context(), pools.Spec{ID: "x", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1})
	require.ErrorContains(t, err, "0 addresses are configured")
}
