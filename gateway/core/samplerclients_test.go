package core

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestJoinSamplerHandsOutUniqueIDs: clients of one sampler get 1, 2, … (concurrent joins
// included), counted on the sampler's record so a restart continues the count; another
// workspace's sampler is NOT_FOUND; a sampler at its bound refuses more.
func TestJoinSamplerHandsOutUniqueIDs(t *testing.T) {
	dir := t.TempDir()
	fake := newFakeBackend()
	h, stop := openHarness(t, dir, fake, fake)
	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
	require.NoError(t, err)
	join := func(h *harness) int64 {
		t.Helper()
		res, err := h.svc.Clients.JoinSampler(h.ctx, &loopsv1.JoinSamplerRequest{SamplerId: smp.GetId()})
		require.NoError(t, err)
		return res.GetClientCounter()
	}
	require.Equal(t, int64(1), join(h))

	const n = 16
	got := make(chan int64, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { got <- join(h) })
	}
	wg.Wait()
	close(got)
	seen := map[int64]bool{}
	for id := range got {
		require.False(t, seen[id], "client id %d handed out twice", id)
		require.True(t, id >= 2 && id <= n+1, id)
		seen[id] = true
	}

	_, err = h.svc.Clients.JoinSampler(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.JoinSamplerRequest{SamplerId: smp.GetId()})
	require.Equal(t, "not_found", codeOf(t, err))
	_, err = h.svc.Clients.JoinSampler(h.ctx, &loopsv1.JoinSamplerRequest{})
	require.Equal(t, "invalid_argument", codeOf(t, err))

	stop()
	h, _ = openHarness(t, dir, fake, fake)
	require.Equal(t, int64(n+2), join(h), "the count survives a restart")

	rec, err := h.core.store.GetSampler(t.Context(), "ws-a", smp.GetId())
	require.NoError(t, err)
	rec.Clients = MaxSamplerClients
	require.NoError(t, h.core.store.PutSampler(t.Context(), "ws-a", rec))
	_, err = h.svc.Clients.JoinSampler(h.ctx, &loopsv1.JoinSamplerRequest{SamplerId: smp.GetId()})
	require.Equal(t, "resource_exhausted", codeOf(t, err))
}
