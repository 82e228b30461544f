package core

import (
	"context"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// gatedSampler is the fake backend with a sampler that records the first prompt token of
// each call, in the order the calls start, and holds each call until the test lets one go.
type gatedSampler struct {
	*fakeBackend
	gate    chan struct{} // one receive per call
	entered chan struct{}
	mu      sync.Mutex
	order   []int32
}

func (g *gatedSampler) Sampler() backends.Sampler { return g }

func (g *gatedSampler) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	g.mu.Lock()
	g.order = append(g.order, req.GetPrompt()[0])
	g.mu.Unlock()
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.fakeBackend.Sample(ctx, req)
}

func (g *gatedSampler) started() []int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int32(nil), g.order...)
}

// sampleHarness is a core on the gated sampler, with one sampler per workspace asked for.
type sampleHarness struct {
	t    *testing.T
	g    *gatedSampler
	core *Core
	svc  Services
}

func newSampleHarness(t *testing.T, opts Options) *sampleHarness {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	g := &gatedSampler{fakeBackend: newFakeBackend(), gate: make(chan struct{}), entered: make(chan struct{}, 1024)}
	opts.DataDir = dir
	c, err := New(t.Context(), st, g, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		close(g.gate)
		_ = c.Close()
		_ = st.Close()
	})
	return &sampleHarness{t: t, g: g, core: c, svc: c.Services()}
}

func (h *sampleHarness) sampler(ws string) string {
	h.t.Helper()
	s, err := h.svc.Sampling.CreateSampler(auth.WithWorkspace(h.t.Context(), ws), &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
	require.NoError(h.t, err)
	return s.GetId()
}

// sample queues a sample whose prompt starts with tag; maxTokens sets its cost.
func (h *sampleHarness) sample(ws, sampler string, tag int32, maxTokens int32) (*loopsv1.Operation, error) {
	return h.svc.Sampling.Sample(auth.WithWorkspace(h.t.Context(), ws), &loopsv1.SampleRequest{
		SamplerId: sampler, Prompt: []int32{tag}, Params: &loopsv1.SamplingParams{MaxTokens: maxTokens, Temperature: 1, TopP: 1},
	})
}

// release lets n held calls finish, one at a time, each after it has started.
func (h *sampleHarness) release(n int) {
	for range n {
		select {
		case <-h.g.entered:
		case <-time.After(5 * time.Second):
			h.t.Fatal("no sampling call started")
		}
		h.g.gate <- struct{}{}
	}
}

// TestLightWorkspaceSamplesBeforeAFlood: one sampler slot; a heavy workspace holds it and
// has 30 more samples waiting when a light workspace sends one. The light one runs at the
// next free slot, not behind the 30 (a global FIFO runs it last).
func TestLightWorkspaceSamplesBeforeAFlood(t *testing.T) {
	h := newSampleHarness(t, Options{SamplingConcurrency: 1})
	heavy, light := h.sampler("ws-heavy"), h.sampler("ws-light")
	const heavyTag, lightTag = 3, 7
	_, err := h.sample("ws-heavy", heavy, heavyTag, 8)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(h.g.started()) == 1 }, 5*time.Second, time.Millisecond)
	for range 30 {
		_, err := h.sample("ws-heavy", heavy, heavyTag, 8)
		require.NoError(t, err)
	}
	op, err := h.sample("ws-light", light, lightTag, 8)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // let today's per-request goroutines reach the slot queue first
	h.release(3)
	order := h.g.started()
	require.GreaterOrEqual(t, len(order), 3)
	require.Equal(t, int32(lightTag), order[1], "the light workspace's sample must run at the next free slot, not behind the flood: %v", order)
	h.release(29)
	got, err := h.svc.Operations.WaitOperation(auth.WithWorkspace(t.Context(), "ws-light"), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(5 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
}

// TestSamplingSharesTokensFairly: two workspaces keep the one slot busy, one with requests
// 8× the size of the other's. While both wait, each is given the same number of tokens
// (within one request, counting the one that held the slot), so the small one runs ~8
// requests per large one.
func TestSamplingSharesTokensFairly(t *testing.T) {
	h := newSampleHarness(t, Options{SamplingConcurrency: 1})
	big, small := h.sampler("ws-big"), h.sampler("ws-small")
	_, err := h.sample("ws-big", big, 1, 31) // holds the slot
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(h.g.started()) == 1 }, 5*time.Second, time.Millisecond)
	for range 10 {
		_, err := h.sample("ws-big", big, 1, 31) // 32 tokens
		require.NoError(t, err)
	}
	for range 80 {
		_, err := h.sample("ws-small", small, 2, 3) // 4 tokens
		require.NoError(t, err)
	}
	h.release(91)
	order := h.g.started()[1:]
	bigTokens, smallTokens, bigLeft := 32, 0, 0 // the sample that held the slot was ws-big's
	for i, tag := range order {
		if tag == 1 {
			bigTokens += 32
		} else {
			smallTokens += 4
		}
		if i < 45 { // both still have work waiting
			require.InDelta(t, bigTokens, smallTokens, 32, "after %d samples: %v", i+1, order)
		}
		if tag == 1 {
			bigLeft++
		}
	}
	require.Equal(t, 10, bigLeft)
}

// TestSampleQueueCaps: past MaxQueuedSamplesPerWorkspace one workspace's samples are
// refused with ResourceExhausted naming the limit, while another workspace still queues;
// past MaxQueuedSamples everyone is refused.
func TestSampleQueueCaps(t *testing.T) {
	h := newSampleHarness(t, Options{SamplingConcurrency: 1, MaxQueuedSamples: 5, MaxQueuedSamplesPerWorkspace: 3})
	a, b := h.sampler("ws-a"), h.sampler("ws-b")
	_, err := h.sample("ws-a", a, 1, 4) // runs (held)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(h.g.started()) == 1 }, 5*time.Second, time.Millisecond)
	for range 3 {
		_, err := h.sample("ws-a", a, 1, 4)
		require.NoError(t, err)
	}
	_, err = h.sample("ws-a", a, 1, 4)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Equal(t, errs.ReasonQueueFull, errs.Reason(err))
	require.ErrorContains(t, err, "MaxQueuedSamplesPerWorkspace")
	ws, err := h.svc.Workspace.GetWorkspace(auth.WithWorkspace(t.Context(), "ws-a"), &loopsv1.GetWorkspaceRequest{})
	require.NoError(t, err)
	require.Equal(t, int32(3), ws.GetUse().GetWaitingSamples())

	for range 2 {
		_, err := h.sample("ws-b", b, 2, 4)
		require.NoError(t, err)
	}
	_, err = h.sample("ws-b", b, 2, 4)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.ErrorContains(t, err, "MaxQueuedSamples")
	require.NotContains(t, err.Error(), "PerWorkspace")

	h.release(6)
	_, err = h.sample("ws-a", a, 1, 4) // room again
	require.NoError(t, err)
	h.release(1)
}

// TestSamplingConcurrencyOfAWorkspace: a workspace at its policy's sampling_concurrency
// leaves the other sampler slots to other workspaces instead of holding them while it waits.
func TestSamplingConcurrencyOfAWorkspace(t *testing.T) {
	p, err := policy.Parse([]byte("workspaces:\n  ws-limited: {sampling_concurrency: 1}\n"))
	require.NoError(t, err)
	h := newSampleHarness(t, Options{SamplingConcurrency: 2, Policy: p})
	limited, other := h.sampler("ws-limited"), h.sampler("ws-other")
	for range 3 {
		_, err := h.sample("ws-limited", limited, 1, 4)
		require.NoError(t, err)
	}
	_, err = h.sample("ws-other", other, 2, 4)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(h.g.started()) == 2 }, 5*time.Second, time.Millisecond)
	require.ElementsMatch(t, []int32{1, 2}, h.g.started())
	ws, err := h.svc.Workspace.GetWorkspace(auth.WithWorkspace(t.Context(), "ws-limited"), &loopsv1.GetWorkspaceRequest{})
	require.NoError(t, err)
	require.Equal(t, int32(1), ws.GetUse().GetRunningSamples())
	require.Equal(t, int32(2), ws.GetUse().GetWaitingSamples())
	h.release(4)
}

// TestQueuedSamplesHoldNoGoroutineAndFailOnDrain: 200 waiting samples hold no goroutine
// each; a drain fails them with Unavailable while the running one finishes.
func TestQueuedSamplesHoldNoGoroutineAndFailOnDrain(t *testing.T) {
	h := newSampleHarness(t, Options{SamplingConcurrency: 1})
	s := h.sampler("ws-a")
	running, err := h.sample("ws-a", s, 1, 4)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(h.g.started()) == 1 }, 5*time.Second, time.Millisecond)
	before := runtime.NumGoroutine()
	var queued []*loopsv1.Operation
	for range 200 {
		op, err := h.sample("ws-a", s, 1, 4)
		require.NoError(t, err)
		queued = append(queued, op)
	}
	require.Less(t, runtime.NumGoroutine()-before, 20, "a goroutine per queued sample")

	h.core.Drain(t.Context())
	ctx := auth.WithWorkspace(t.Context(), "ws-a")
	for _, op := range queued {
		got, err := h.svc.Operations.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: op.GetId()})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
		require.Contains(t, got.GetError().GetMessage(), "shutting down")
	}
	h.release(1)
	require.NoError(t, h.core.WaitIdle(t.Context()))
	got, err := h.svc.Operations.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: running.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
	require.Equal(t, 1, len(h.g.started()))
}

// TestSparseWorkspaceGetsItsShareOnly: a workspace that sends one sample at a time (and so
// never has one waiting when the next slot frees) goes ahead of the round, but only while
// it owes nothing: beside three backlogged workspaces on one slot it gets a quarter of the
// slots, not every other one.
func TestSparseWorkspaceGetsItsShareOnly(t *testing.T) {
	h := newSampleHarness(t, Options{SamplingConcurrency: 1})
	q := h.core.samplers.queue
	q.mu.Lock()
	q.free = 0 // the test takes the picks itself
	q.mu.Unlock()
	push := func(ws string) {
		require.NoError(t, q.reserve(ws))
		require.True(t, q.push(&sampleJob{o: &operation{workspace: ws}, cost: 10}))
	}
	for range 100 {
		push("ws-b1")
		push("ws-b2")
		push("ws-b3")
	}
	push("ws-sparse")
	got := map[string]int{}
	for i := range 200 {
		q.mu.Lock()
		j := q.pickLocked(1)
		require.NotNil(t, j)
		ws := j.o.workspace
		w := q.ws[ws]
		w.running--
		q.cleanLocked(w)
		q.mu.Unlock()
		got[ws]++
		if ws == "ws-sparse" {
			push("ws-sparse") // its client sends the next one as soon as this one ends
		}
		if i < 4 && ws == "ws-sparse" {
			got["first"]++
		}
	}
	require.Equal(t, 1, got["first"], "the sparse workspace is served in the first round")
	delete(got, "first")
	q.mu.Lock() // the jobs left are not real operations: drop them before Close
	q.order, q.ws, q.reserved, q.free = nil, map[string]*wsSamples{}, 0, 1
	q.mu.Unlock()
	require.InDelta(t, 50, got["ws-sparse"], 3, "%v", got)
	for _, ws := range []string{"ws-b1", "ws-b2", "ws-b3"} {
		require.InDelta(t, 50, got[ws], 3, "%v", got)
	}
}

// TestFloodLeavesASpareSlot: with 4 sampler slots, a workspace with 10 samples waiting
// takes 3 (one slot is spare: only for a workspace with nothing running), and a light
// workspace's sample starts at once in the spare slot, without waiting for one to end.
func TestFloodLeavesASpareSlot(t *testing.T) {
	h := newSampleHarness(t, Options{SamplingConcurrency: 4})
	heavy, light := h.sampler("ws-heavy"), h.sampler("ws-light")
	for range 10 {
		_, err := h.sample("ws-heavy", heavy, 1, 4)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return len(h.g.started()) == 3 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 7, h.core.samplers.queue.waiting("ws-heavy"))
	_, err := h.sample("ws-light", light, 2, 4)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(h.g.started()) == 4 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []int32{1, 1, 1, 2}, h.g.started())
	h.release(11)
	require.NoError(t, h.core.WaitIdle(t.Context()))
	require.Len(t, h.g.started(), 11)
	require.Equal(t, 1, spareSlots(2))
	require.Equal(t, 0, spareSlots(1))
	require.Equal(t, 4, spareSlots(32))
}
