package worker

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// replicas returns a backend with n alive replicas serving model "m" (no processes: the
// routing reads only what the backend knows of them).
func replicas(n int) (*Backend, []*worker) {
	b := &Backend{ctx: context.Background(), log: slog.New(slog.DiscardHandler), adapters: map[string]*worker{}, lost: map[string]lostEntry{}}
	for i := range n {
		w := b.newWorker(i, "")
		w.setAlive(&backendv1.GetCapabilitiesResponse{Models: []*loopsv1.ModelInfo{{Name: "m"}}})
		b.workers = append(b.workers, w)
	}
	return b, b.workers
}

func inflight(ws []*worker) []int {
	out := make([]int, len(ws))
	for i, w := range ws {
		w.mu.Lock()
		out[i] = w.load.inflight
		w.mu.Unlock()
	}
	return out
}

// TestSamplerRouting: a sample goes to a replica holding its adapter while that replica
// has at most samplerSpill samples more in flight than the least loaded one, else to the
// least loaded (which then holds it too); base-model samples and new adapters go to the
// least loaded; a dead replica gets nothing and forgets what it held.
func TestSamplerRouting(t *testing.T) {
	b, ws := replicas(3)
	pickA := func() (*worker, func()) {
		w, done, err := b.pickSampler("", "m", "dir:/ck/a")
		require.NoError(t, err)
		return w, done
	}
	first, d1 := pickA()
	second, d2 := pickA()
	third, d3 := pickA()
	require.Same(t, first, second, "the replica that loaded adapter a gets its next samples")
	require.Same(t, first, third, "…while it has at most samplerSpill more in flight than the least loaded")
	fourth, d4 := pickA()
	require.NotSame(t, first, fourth, "a holder 3 samples ahead of the least loaded is passed over")
	five, d5 := pickA()
	require.Same(t, fourth, five, "the replica that took the overflow holds a too now")

	// the base model and a new adapter go to the least loaded replica
	other, d6, err := b.pickSampler("", "m", "")
	require.NoError(t, err)
	require.NotSame(t, first, other)
	require.NotSame(t, fourth, other)
	for _, d := range []func(){d1, d2, d3, d4, d5, d6} {
		d()
	}
	require.Equal(t, []int{0, 0, 0}, inflight(ws), "every sample is uncounted when it ends")

	// a dead replica gets nothing and has loaded nothing once back
	first.fail(-1, "test")
	for range 5 {
		w, done, err := b.pickSampler("", "m", "dir:/ck/a")
		require.NoError(t, err)
		require.NotSame(t, first, w)
		done()
	}
	first.setAlive(&backendv1.GetCapabilitiesResponse{Models: []*loopsv1.ModelInfo{{Name: "m"}}})
	first.mu.Lock()
	require.Empty(t, first.load.held, "a restarted replica holds no adapter")
	first.mu.Unlock()

	// the remembered adapters per replica are bounded
	for i := range 3 * samplerHeldMax {
		_, done, err := b.pickSampler("", "m", "dir:/ck/"+string(rune('A'+i)))
		require.NoError(t, err)
		done()
	}
	for _, w := range ws {
		require.LessOrEqual(t, len(w.load.held), samplerHeldMax)
	}
	// a model no replica serves is the usual error
	_, _, err = b.pickSampler("", "other", "")
	require.Error(t, err)
}

func TestAdapterKey(t *testing.T) {
	require.Empty(t, adapterKey(&backendv1.SampleRequest{}))
	require.Equal(t, "dir:/x", adapterKey(&backendv1.SampleRequest{AdapterDir: "/x"}))
	a := adapterKey(&backendv1.SampleRequest{AdapterFiles: []*backendv1.FileURL{{Name: "w", Url: "http://one", Sha256: "ab"}}})
	c := adapterKey(&backendv1.SampleRequest{AdapterFiles: []*backendv1.FileURL{{Name: "w", Url: "http://two", Sha256: "ab"}}})
	require.Equal(t, a, c, "the same files under other presigned URLs are the same adapter")
}

// TestWaitReadySkipsFreedSlots: a pool slot whose replica was scaled away while
// WaitReady waited on it stops the wait; before, WaitReady blocked until its context ended
// (test-ray hung once after scaling a pool 3→1: the registry already had one member while
// the backend had not yet freed the two lost slots).
func TestWaitReadySkipsFreedSlots(t *testing.T) {
	w := &worker{pooled: true, pool: "p", replica: 2, cl: &clients{}, up: make(chan struct{})}
	go func() {
		time.Sleep(150 * time.Millisecond)
		w.mu.Lock()
		w.pool, w.replica, w.cl = "", 0, nil // as followRegistry frees a slot scaled away
		w.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, (&Backend{workers: []*worker{w, {pooled: true}}}).WaitReady(ctx))
	require.Less(t, time.Since(start), 5*time.Second, "WaitReady waited for a freed slot")
}
