package pools_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
)

// TestUsageAccumulatesPerSlot: a managed pool's replica slot accumulates the time its
// replicas were registered over incarnations (ended ones kept after the replica leaves, the
// current one up to now), says when it was last lost, and is forgotten with the pool; an
// unmanaged pool's slot counts only its current registration, so the memory is one entry per
// slot of a managed pool, whatever the churn.
func TestUsageAccumulatesPerSlot(t *testing.T) {
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "tok"})
	t.Cleanup(reg.Close)
	reg.SetDesired("p", 2)
	now := time.Now()
	reg.Announce(pools.Member{Pool: "p", Replica: 0, Address: "127.0.0.1:1", Incarnation: "a", Since: now.Add(-10 * time.Second)})
	reg.Remove("p", 0, "gone")
	reg.Announce(pools.Member{Pool: "p", Replica: 0, Address: "127.0.0.1:1", Incarnation: "b", Since: now.Add(-5 * time.Second)})
	reg.Announce(pools.Member{Pool: "p", Replica: 1, Address: "127.0.0.1:2", Incarnation: "c", Since: now.Add(-3 * time.Second)})
	reg.Remove("p", 1, "exited")
	for i := range 100 { // churn: still one entry per slot
		reg.Announce(pools.Member{Pool: "p", Replica: 1, Address: "127.0.0.1:2", Incarnation: "x" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Since: time.Now()})
		reg.Remove("p", 1, "exited")
	}

	u := reg.Usage("p")
	require.Len(t, u, 2)
	require.Equal(t, 0, u[0].Replica)
	require.InDelta(t, 15, u[0].Registered.Seconds(), 1, "10 s of the ended incarnation and 5 s of the current one")
	require.True(t, u[0].LostAt.IsZero(), "registered now")
	require.Equal(t, 1, u[1].Replica)
	require.InDelta(t, 3, u[1].Registered.Seconds(), 1)
	require.False(t, u[1].LostAt.IsZero())
	require.Equal(t, "exited", reg.LostReason("p", 1))

	reg.Announce(pools.Member{Pool: "q", Replica: 0, Address: "127.0.0.1:3", Incarnation: "d", Since: now.Add(-7 * time.Second)})
	q := reg.Usage("q")
	require.Len(t, q, 1)
	require.InDelta(t, 7, q[0].Registered.Seconds(), 1)
	reg.Remove("q", 0, "gone")
	require.Empty(t, reg.Usage("q"), "an unmanaged pool keeps nothing once its replica leaves")

	reg.DropPool("p", "deleted")
	require.Empty(t, reg.Usage("p"), "a deleted pool's usage goes with it")
}
