package core

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/stretchr/testify/require"
)

// testClock is a settable clock for Options.Now.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Now()} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// inMemory reports whether the core holds run id in its registry.
func inMemory(c *Core, id string) bool {
	c.runs.mu.Lock()
	defer c.runs.mu.Unlock()
	_, ok := c.runs.runs[id]
	return ok
}

// requireLimit checks a refusing cap's answer: 429 (ResourceExhausted) with reason, a
// Retry-After hint, and a message that names the limit.
func requireLimit(t *testing.T, err error, reason, limit string) {
	t.Helper()
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "%v", err)
	require.Equal(t, reason, errs.Reason(err))
	require.ErrorContains(t, err, limit)
	require.Equal(t, limit, errs.Info(err).GetMetadata()[errs.MetadataLimit])
	d, ok := errs.RetryAfter(err)
	require.True(t, ok)
	require.Positive(t, d)
}

// TestUnloadedRunIsEvictedAndReloadedOnDemand: a run whose session ended leaves memory once
// idle; a request that names it (by id or alias) reloads its record, which answers
// GetTrainingRun and refuses work with the reason it was unloaded.
func TestUnloadedRunIsEvictedAndReloadedOnDemand(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, t.TempDir(), Options{Now: clock.Now})
	sess := h.session()
	op, err := h.createIn(sess, ptr(int64(0)))
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	lone := h.newRun() // no session: unloaded explicitly
	op, err = h.svc.Training.UnloadTrainingRun(h.ctx, &loopsv1.UnloadTrainingRunRequest{Id: lone})
	require.NoError(t, err)
	h.wait(op)
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess, Reason: "done"})
	require.NoError(t, err)
	live := h.newRun() // holds an adapter: never evicted

	clock.add(30 * time.Second)
	h.core.sweep(h.ctx)
	require.True(t, inMemory(h.core, run), "evicted before its idle time")
	clock.add(time.Minute)
	h.core.sweep(h.ctx)
	require.False(t, inMemory(h.core, run), "an unloaded idle run stays in memory")
	require.False(t, inMemory(h.core, lone), "an unloaded idle run stays in memory")
	require.True(t, inMemory(h.core, live))

	// By its alias first: the store finds it by session and client_seq_id.
	_, err = h.fb(sess+":train:7", 1, datum(1, 2))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "no run has that alias")
	info, err := h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: sess + ":train:0"})
	require.NoError(t, err)
	require.Equal(t, run, info.GetId())
	require.Contains(t, info.GetUnloadReason(), "its session "+sess+" ended")
	for _, id := range []string{run, sess + ":train:0"} {
		_, err = h.fb(id, 1, datum(1, 2))
		require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), id)
		require.ErrorContains(t, err, "its session "+sess+" ended")
	}
	_, err = h.fb(lone, 1, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "it was unloaded")
	_, err = h.fb(run, 1, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	_, err = h.svc.Training.GetTrainingRun(auth.WithWorkspace(h.ctx, "ws-b"), &loopsv1.GetTrainingRunRequest{Id: run})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "another workspace does not reload it")
	op, err = h.fb(live, 1, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
}

// TestRecoverRunsLoadsOnlyLiveRuns: at start-up the runs that ended (session finished,
// unloaded) stay in the store only; they answer as before when named.
func TestRecoverRunsLoadsOnlyLiveRuns(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	c, err := New(t.Context(), st, newFakeBackend(), Options{DataDir: dir})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	sess := h.session()
	op, err := h.createIn(sess, ptr(int64(0)))
	require.NoError(t, err)
	ended := h.wait(op).GetTrainingRunId()
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess})
	require.NoError(t, err)
	unloaded := h.newRun()
	op, err = h.svc.Training.UnloadTrainingRun(h.ctx, &loopsv1.UnloadTrainingRunRequest{Id: unloaded})
	require.NoError(t, err)
	h.wait(op)
	live := h.newRun()
	require.NoError(t, c.Close())
	require.NoError(t, st.Close())

	h2 := newHarness(t, dir, Options{})
	require.False(t, inMemory(h2.core, ended), "a run of an ended session was loaded at start-up")
	require.False(t, inMemory(h2.core, unloaded), "an unloaded run was loaded at start-up")
	require.True(t, inMemory(h2.core, live))
	_, err = h2.fb(ended, 1, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "ended")
	_, err = h2.fb(unloaded, 1, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "it was unloaded")
	op, err = h2.fb(live, 1, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h2.wait(op).GetState())
}

// TestRunQueueFullIs429AndKeepsTheSeqID: past MaxPendingPerRun queued operations a request
// is refused with 429 + Retry-After, and its seq_id is not used: the retry is accepted.
func TestRunQueueFullIs429AndKeepsTheSeqID(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{Limits: Limits{MaxPendingPerRun: 2}})
	run := h.newRun()
	h.fake.entered, h.fake.gate = make(chan struct{}, 8), make(chan struct{})
	first, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	<-h.fake.entered // seq 1 runs (held): it no longer counts as queued
	_, err = h.fb(run, 2, datum(1, 2))
	require.NoError(t, err)
	third, err := h.fb(run, 3, datum(1, 2))
	require.NoError(t, err)
	_, err = h.fb(run, 4, datum(1, 2))
	requireLimit(t, err, errs.ReasonQueueFull, "max_pending_per_run")
	close(h.fake.gate)
	h.wait(first)
	h.wait(third)
	op, err := h.fb(run, 4, datum(1, 2))
	require.NoError(t, err, "the refused seq_id stays free")
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
}

// TestSeenSeqTableStaysBounded: sparse, huge seq_ids (each a gap the run skips) do not grow
// its de-duplication table without bound, and the queue cap bounds what waits on gaps.
func TestSeenSeqTableStaysBounded(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{GapTimeout: time.Nanosecond})
	run := h.newRun()
	r, err := h.core.runOf("ws-a", run)
	require.NoError(t, err)
	var last *loopsv1.Operation
	for i := int64(0); i < 12000; {
		last, err = h.fb(run, 1+i*1000, datum(1, 2)) // each waits for its gap to be skipped
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			time.Sleep(time.Millisecond) // the queue is full: back off, as a client does
			continue
		}
		require.NoError(t, err)
		i++
	}
	h.wait(last)
	n := r.SeenLen()
	require.LessOrEqual(t, n, max(2*sequencer.Keep, sequencer.Keep+h.core.opts.Limits.MaxPendingPerRun)+1)
}

// TestSessionlessSamplersExpireAndAreBoundedInMemory: samplers are dropped from memory
// past MaxSamplersInMemory per workspace (least recently used first) and after
// SamplerIdleTTL, and keep working: a request that names one reloads it.
func TestSessionlessSamplersExpireAndAreBoundedInMemory(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, t.TempDir(), Options{Now: clock.Now, Limits: Limits{MaxSamplersInMemory: 3}})
	var ids []string
	for range 5 {
		smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
		require.NoError(t, err)
		ids = append(ids, smp.GetId())
		clock.add(time.Second)
	}
	require.Equal(t, 3, h.core.samplers.inMemory())
	op, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: ids[0], Prompt: []int32{1, 2}, Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1}})
	require.NoError(t, err, "a sampler dropped from memory still works")
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	require.Equal(t, 3, h.core.samplers.inMemory())

	clock.add(11 * time.Minute)
	h.core.sweep(h.ctx)
	require.Equal(t, 0, h.core.samplers.inMemory(), "idle samplers stay in memory")
	got, err := h.svc.Sampling.GetSampler(h.ctx, &loopsv1.GetSamplerRequest{Id: ids[4]})
	require.NoError(t, err)
	require.Equal(t, ids[4], got.GetId())
}

// TestSessionsPerWorkspaceAreCapped: past MaxSessionsPerWorkspace live sessions a new one
// is refused with 429 + Retry-After naming the limit; ending one frees room; another
// workspace is not affected.
func TestSessionsPerWorkspaceAreCapped(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{Limits: Limits{MaxSessionsPerWorkspace: 2, MaxRunsPerSession: 1}})
	a := h.session()
	h.session()
	_, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	requireLimit(t, err, errs.ReasonLimitReached, "max_sessions_per_workspace")
	_, err = h.svc.Sessions.CreateSession(auth.WithWorkspace(h.ctx, "ws-b"), &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: a})
	require.NoError(t, err)
	b := h.session()

	op, err := h.createIn(b, ptr(int64(0)))
	require.NoError(t, err)
	h.wait(op)
	_, err = h.createIn(b, ptr(int64(1)))
	requireLimit(t, err, errs.ReasonLimitReached, "max_runs_per_session")
}

// TestSessionSeqTablesStayBounded: a session's client_seq_id tables forget old entries.
func TestSessionSeqTablesStayBounded(t *testing.T) {
	table := newOnceTable()
	for i := range int64(20000) {
		_, fresh, err := table.once(t.Context(), i*7, func() (string, error) { return "x", nil })
		require.NoError(t, err)
		require.True(t, fresh)
	}
	require.LessOrEqual(t, table.len(), 2*seqTableKeep+1)
	id, fresh, err := table.once(t.Context(), 19999*7, func() (string, error) { return "y", nil })
	require.NoError(t, err)
	require.False(t, fresh, "the newest is kept")
	require.Equal(t, "x", id)
}
