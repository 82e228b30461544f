package poolstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// Harness is one provider under test.
type Harness struct {
	// Provider is the provider under test; Registry is the one its workers register with.
	Provider pools.Provider
	Registry *pools.Registry
	// Spec returns a valid spec for a pool the provider can place (Replicas is set by the
	// suite, at most MaxReplicas).
	Spec        func(id string) pools.Spec
	MaxReplicas int
	// Kill makes replica i of the pool die abruptly (a killed process, a killed actor, a
	// stopped server); the provider, or the harness for providers that restart nothing,
	// brings a new incarnation up.
	Kill func(t *testing.T, pool string, replica int)
	// Timeout bounds each wait for replicas (default 30s).
	Timeout time.Duration
	// Authority is the gateway's, whose workers the replicas are: the suite dials them
	// with it.
	Authority *mtls.Authority
}

// Run checks the provider contract. newHarness builds a fresh provider per case.
func Run(t *testing.T, newHarness func(t *testing.T) *Harness) {
	t.Run("EnsureWatch", func(t *testing.T) { testEnsureWatch(t, newHarness(t)) })
	t.Run("Scale", func(t *testing.T) { testScale(t, newHarness(t)) })
	t.Run("Kill", func(t *testing.T) { testKill(t, newHarness(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newHarness(t)) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, newHarness(t)) })
}

func (h *Harness) timeout() time.Duration {
	if h.Timeout > 0 {
		return h.Timeout
	}
	return 30 * time.Second
}

// next reads the next event of kind want (other kinds fail the test).
func next(t *testing.T, h *Harness, ch <-chan pools.Event, want pools.EventKind) pools.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "watch closed while waiting for %s", want)
		t.Logf("event: %v", ev)
		require.Equal(t, want, ev.Kind, "event %v", ev)
		return ev
	case <-time.After(h.timeout()):
		t.Fatalf("no %s event within %v", want, h.timeout())
	}
	return pools.Event{}
}

// quiet checks no event arrives for d.
func quiet(t *testing.T, ch <-chan pools.Event, d time.Duration) {
	t.Helper()
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %v", ev)
	case <-time.After(d):
	}
}

func ensure(t *testing.T, h *Harness, id string, n int) pools.Spec {
	t.Helper()
	spec := h.Spec(id)
	spec.Replicas = n
	require.NoError(t, h.Provider.EnsurePool(t.Context(), spec))
	return spec
}

func watch(t *testing.T, h *Harness, id string) <-chan pools.Event {
	t.Helper()
	ch, err := h.Provider.Watch(t.Context(), id)
	require.NoError(t, err)
	return ch
}

// upAll waits for n Up events (any order) and returns them by replica.
func upAll(t *testing.T, h *Harness, ch <-chan pools.Event, n int) map[int]pools.Event {
	t.Helper()
	got := map[int]pools.Event{}
	for len(got) < n {
		ev := next(t, h, ch, pools.Up)
		got[ev.Replica] = ev
	}
	return got
}

// answers checks a registered address serves the worker protocol to the gateway, as a
// worker of pool.
func answers(t *testing.T, h *Harness, pool, addr string) {
	t.Helper()
	hc := mtls.HTTPClient(h.Authority.DialConfig(pool))
	defer hc.CloseIdleConnections()
	cl := backendv1connect.NewTrainerServiceClient(hc, "https://"+addr)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := cl.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err, "registered address %s does not answer", addr)
}

func testEnsureWatch(t *testing.T, h *Harness) {
	n := min(2, h.MaxReplicas)
	spec := ensure(t, h, "pool-a", n)
	ch := watch(t, h, spec.ID)
	ups := upAll(t, h, ch, n)
	for i := range n {
		require.Contains(t, ups, i)
		answers(t, h, spec.ID, ups[i].Address)
	}
	ms := h.Registry.Members(spec.ID)
	require.Len(t, ms, n)
	require.NotEqual(t, ms[0].Incarnation, ms[len(ms)-1].Incarnation+"x")
	// the same spec again starts nothing new
	require.NoError(t, h.Provider.EnsurePool(t.Context(), spec))
	quiet(t, ch, 2*time.Second)
	require.Equal(t, ms, h.Registry.Members(spec.ID))
	// a second watcher starts from the current replicas
	ch2 := watch(t, h, spec.ID)
	require.Len(t, upAll(t, h, ch2, n), n)
}

func testScale(t *testing.T, h *Harness) {
	if h.MaxReplicas < 3 {
		t.Skip("the harness hosts fewer than 3 replicas")
	}
	spec := ensure(t, h, "pool-s", 1)
	specIs(t, h, spec, 1)
	ch := watch(t, h, spec.ID)
	upAll(t, h, ch, 1)
	require.NoError(t, h.Provider.ScalePool(t.Context(), spec.ID, 3))
	specIs(t, h, spec, 3)
	ups := upAll(t, h, ch, 2)
	require.Contains(t, ups, 1)
	require.Contains(t, ups, 2)
	require.Len(t, h.Registry.Members(spec.ID), 3)
	require.NoError(t, h.Provider.ScalePool(t.Context(), spec.ID, 1))
	gone := map[int]bool{}
	for len(gone) < 2 {
		gone[next(t, h, ch, pools.Lost).Replica] = true
	}
	require.Equal(t, map[int]bool{1: true, 2: true}, gone)
	ms := h.Registry.Members(spec.ID)
	require.Len(t, ms, 1)
	require.Equal(t, 0, ms[0].Replica)
	specIs(t, h, spec, 1)
	quiet(t, ch, 2*time.Second) // the stopped replicas stay stopped
	require.ErrorIs(t, h.Provider.ScalePool(t.Context(), "no-such-pool", 1), pools.ErrNoPool)
}

// specIs checks, for a provider that says its pools' specs (pools.SpecReader), that pool id
// has want's shape scaled to n replicas; n < 0: that it is not managed.
func specIs(t *testing.T, h *Harness, want pools.Spec, n int) {
	t.Helper()
	sr, ok := h.Provider.(pools.SpecReader)
	if !ok {
		return
	}
	got, ok := sr.Spec(want.ID)
	if n < 0 {
		require.False(t, ok, "a deleted pool has no spec")
		return
	}
	require.True(t, ok)
	want.Replicas = n
	require.Equal(t, want, got)
}

func testKill(t *testing.T, h *Harness) {
	spec := ensure(t, h, "pool-k", 1)
	ch := watch(t, h, spec.ID)
	first := upAll(t, h, ch, 1)[0]
	h.Kill(t, spec.ID, 0)
	lost := next(t, h, ch, pools.Lost)
	require.Equal(t, 0, lost.Replica)
	require.Equal(t, first.Incarnation, lost.Incarnation)
	require.NotEmpty(t, lost.Reason)
	again := next(t, h, ch, pools.Up)
	require.Equal(t, 0, again.Replica)
	require.NotEqual(t, first.Incarnation, again.Incarnation, "a restarted replica is a new incarnation")
	answers(t, h, spec.ID, again.Address)
}

func testDelete(t *testing.T, h *Harness) {
	n := min(2, h.MaxReplicas)
	spec := ensure(t, h, "pool-d", n)
	ch := watch(t, h, spec.ID)
	upAll(t, h, ch, n)
	require.NoError(t, h.Provider.DeletePool(t.Context(), spec.ID))
	deadline := time.After(h.timeout())
	for done := false; !done; {
		select {
		case ev, ok := <-ch:
			if !ok {
				done = true
				break
			}
			require.Contains(t, []pools.EventKind{pools.Lost, pools.Deleted}, ev.Kind, "event %v", ev)
		case <-deadline:
			t.Fatal("the watch did not end after DeletePool")
		}
	}
	require.Empty(t, h.Registry.Members(spec.ID))
	specIs(t, h, spec, -1)
	require.NoError(t, h.Provider.DeletePool(t.Context(), spec.ID), "deleting twice is not an error")
	require.ErrorIs(t, h.Provider.ScalePool(t.Context(), spec.ID, 1), pools.ErrNoPool)
	// the same id can be created again
	spec2 := ensure(t, h, spec.ID, 1)
	upAll(t, h, watch(t, h, spec2.ID), 1)
}

func testInvalid(t *testing.T, h *Harness) {
	ctx := t.Context()
	good := h.Spec("pool-i")
	good.Replicas = 1
	for name, mut := range map[string]func(*pools.Spec){
		"bad id":        func(s *pools.Spec) { s.ID = "../x" },
		"no role":       func(s *pools.Spec) { s.Role = "" },
		"no model":      func(s *pools.Spec) { s.BaseModel = "" },
		"negative":      func(s *pools.Spec) { s.Replicas = -1 },
		"too many":      func(s *pools.Spec) { s.Replicas = pools.MaxReplicas + 1 },
		"negative gpus": func(s *pools.Spec) { s.GPUsPerReplica = -1 },
		"bad gpu kind":  func(s *pools.Spec) { s.GPUKind = "H100/SXM" },
	} {
		s := good
		mut(&s)
		err := h.Provider.EnsurePool(ctx, s)
		require.Error(t, err, name)
		require.False(t, errors.Is(err, pools.ErrNoPool), name)
	}
	require.Empty(t, h.Registry.Pools(), "refused specs leave nothing behind")
	require.NoError(t, h.Provider.EnsurePool(ctx, good))
	require.Error(t, h.Provider.ScalePool(ctx, good.ID, -1))
	require.Error(t, h.Provider.ScalePool(ctx, good.ID, pools.MaxReplicas+1))
}
