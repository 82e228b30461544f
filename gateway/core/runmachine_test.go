package core

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// gatedStore is a store whose reads of training runs and checkpoints can be held at a gate
// (a slow or stalled store), to show what waits for them.
type gatedStore struct {
	store.Store
	mu sync.Mutex
	// runGate and ckGate, when set, hold GetTrainingRun and GetCheckpointAnyWorkspace until
	// closed; entered receives a value as each held call arrives.
	runGate, ckGate chan struct{}
	entered         chan string
}

func (g *gatedStore) hold(gate chan struct{}, what string) {
	if gate == nil {
		return
	}
	if g.entered != nil {
		g.entered <- what
	}
	<-gate
}

func (g *gatedStore) gates() (run, ck chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runGate, g.ckGate
}

func (g *gatedStore) GetTrainingRun(ctx context.Context, ws, id string) (*loopsv1.TrainingRun, error) {
	run, _ := g.gates()
	g.hold(run, "run "+id)
	return g.Store.GetTrainingRun(ctx, ws, id)
}

func (g *gatedStore) GetCheckpointAnyWorkspace(ctx context.Context, runID, id string) (*loopsv1.Checkpoint, string, error) {
	_, ck := g.gates()
	g.hold(ck, "checkpoint "+runID+"/"+id)
	return g.Store.GetCheckpointAnyWorkspace(ctx, runID, id)
}

// newGatedHarness is newHarness on a gatedStore.
func newGatedHarness(t *testing.T, opts Options) (*harness, *gatedStore) {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	g := &gatedStore{Store: st}
	fake := newFakeBackend()
	opts.DataDir = dir
	c, err := New(t.Context(), g, fake, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			return // a deadlocked core cannot be closed
		}
		_ = c.Close()
		_ = st.Close()
	})
	return &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}, g
}

// within runs f and fails the test if it has not returned after d: a bound for a hang (a
// deadlock), not a timing.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v: the server is stuck", what, d)
	}
}

// TestLoadWeightsCheckDoesNotDeadlockWithEviction is issue 23's item 1: load_weights
// resolves its checkpoint (which may read a run that is not in memory from the store)
// while the idle-eviction sweep walks the runs. Both, and every later request, must go on.
func TestLoadWeightsCheckDoesNotDeadlockWithEviction(t *testing.T) {
	clock := newTestClock()
	h, g := newGatedHarness(t, Options{Now: clock.Now})
	run, other := h.newRun(), h.newRun()
	// A checkpoint of a run that then leaves memory: resolving it reads the run's record
	// from the store and registers the run again.
	path, err := h.save(other, "c1", false)
	require.NoError(t, err)
	op, err := h.svc.Training.UnloadTrainingRun(h.ctx, &loopsv1.UnloadTrainingRunRequest{Id: other})
	require.NoError(t, err)
	h.wait(op)
	clock.add(time.Hour)
	h.core.evictIdleRuns(h.core.now())
	require.Nil(t, h.core.runs.peek(other), "the unloaded run left memory")
	h.core.ops.persist.Sync(context.Background()) // its record is in the store, not only in the persister

	g.mu.Lock()
	g.runGate, g.entered = make(chan struct{}), make(chan string, 16)
	g.mu.Unlock()
	loadDone := make(chan error, 1)
	go func() {
		_, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path})
		loadDone <- err
	}()
	select {
	case <-g.entered: // the check is reading the other run's record from the store
	case <-time.After(10 * time.Second):
		t.Fatal("load_weights never read the store")
	}
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		h.core.evictIdleRuns(h.core.now())
	}()
	// Let the sweep reach the run (on the old core it then waited for the run's lock, held
	// by the load's check, while holding the registry's).
	select {
	case <-sweepDone:
	case <-time.After(500 * time.Millisecond):
	}
	g.mu.Lock()
	close(g.runGate)
	g.runGate = nil
	g.mu.Unlock()
	within(t, 10*time.Second, "the eviction sweep", func() { <-sweepDone })
	within(t, 10*time.Second, "load_weights", func() { require.NoError(t, <-loadDone) })
	within(t, 10*time.Second, "a later request", func() {
		op, err := h.fb(run, 0, datum(1, 2))
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	})
}

// TestStoreReadOfOneRunDoesNotHoldUpAnother is issue 23's item 2: a load_weights whose check
// reads a slow store must not hold up another run's forward_backward on the same base model.
func TestStoreReadOfOneRunDoesNotHoldUpAnother(t *testing.T) {
	h, g := newGatedHarness(t, Options{})
	runA, runB := h.newRun(), h.newRun()
	path, err := h.save(runA, "c1", false)
	require.NoError(t, err)

	// Hold the backend so that the next round finds both runs ready.
	h.fake.gate, h.fake.entered = make(chan struct{}), make(chan struct{}, 16)
	first, err := h.fb(runB, 0, datum(1, 2))
	require.NoError(t, err)
	<-h.fake.entered
	opA, err := h.fb(runA, 0, datum(1, 2))
	require.NoError(t, err)
	opB, err := h.fb(runB, 0, datum(1, 2))
	require.NoError(t, err)

	g.mu.Lock()
	g.ckGate, g.entered = make(chan struct{}), make(chan string, 16)
	g.mu.Unlock()
	loadDone := make(chan error, 1)
	go func() {
		_, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: runA, Path: path})
		loadDone <- err
	}()
	<-g.entered // runA's load is reading the (stalled) store
	close(h.fake.gate)
	stopDraining := make(chan struct{})
	defer close(stopDraining)
	go func() {
		for {
			select {
			case <-h.fake.entered:
			case <-stopDraining:
				return
			}
		}
	}()
	// runB's forward_backward finishes while runA's store read is still stalled.
	within(t, 10*time.Second, "run B's forward_backward beside run A's stalled store read", func() {
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(first).GetState())
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(opB).GetState())
	})
	g.mu.Lock()
	close(g.ckGate)
	g.ckGate = nil
	g.mu.Unlock()
	require.NoError(t, <-loadDone)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(opA).GetState())
}

// slowStore takes a while to write sessions and samplers, as a store across a network does.
type slowStore struct{ store.Store }

func (s slowStore) PutSession(ctx context.Context, ws string, info *loopsv1.Session) error {
	time.Sleep(20 * time.Millisecond)
	return s.Store.PutSession(ctx, ws, info)
}

func (s slowStore) PutSampler(ctx context.Context, ws string, info *loopsv1.Sampler) error {
	time.Sleep(20 * time.Millisecond)
	return s.Store.PutSampler(ctx, ws, info)
}

func (s slowStore) PutTrainingRun(ctx context.Context, ws string, info *loopsv1.TrainingRun) error {
	time.Sleep(20 * time.Millisecond)
	return s.Store.PutTrainingRun(ctx, ws, info)
}

// newSlowHarness is newHarness on a slowStore.
func newSlowHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	opts.DataDir = dir
	c, err := New(t.Context(), slowStore{st}, newFakeBackend(), opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	return &harness{t: t, dir: dir, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
}

// TestRunBeingCreatedIsNotEvicted: a run is in memory while its creation records it in the
// store, before its creation task is queued; an idle sweep then must not drop it (found by
// the eviction hammer under -race: the creation task made the adapter for a run nobody held,
// and the run, reloaded from the store by the next request, found its adapter there already
// or, on a backend that allowed it, came back marked corrupted).
func TestRunBeingCreatedIsNotEvicted(t *testing.T) {
	h := newSlowHarness(t, Options{SweepInterval: time.Millisecond, Limits: Limits{RunIdleTTL: time.Millisecond, LiveRunIdleTTL: time.Millisecond}})
	for range 3 {
		run := h.newRun()
		op, err := h.fb(run, 0, datum(1, 2))
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
		info, err := h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
		require.NoError(t, err)
		require.False(t, info.GetCorrupted(), "the run kept its adapter")
	}
}

// TestSessionCapHoldsUnderConcurrency is issue 23's item 3: 40 concurrent creations against
// a cap of 5 live sessions give exactly 5.
func TestSessionCapHoldsUnderConcurrency(t *testing.T) {
	h := newSlowHarness(t, Options{Limits: Limits{MaxSessionsPerWorkspace: 5}})
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			_, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
			switch {
			case err == nil:
				ok.Add(1)
			case connect.CodeOf(err) == connect.CodeResourceExhausted:
				refused.Add(1)
			default:
				t.Errorf("unexpected error: %v", err)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 5, ok.Load())
	require.EqualValues(t, 35, refused.Load())
}

// TestSamplerCapHoldsUnderConcurrency: the same for samplers of one session.
func TestSamplerCapHoldsUnderConcurrency(t *testing.T) {
	h := newSlowHarness(t, Options{Limits: Limits{MaxSamplersPerSession: 5}})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			_, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{SessionId: sess.GetId(), BaseModel: "fake/model"})
			switch {
			case err == nil:
				ok.Add(1)
			case connect.CodeOf(err) == connect.CodeResourceExhausted:
				refused.Add(1)
			default:
				t.Errorf("unexpected error: %v", err)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 5, ok.Load())
	require.EqualValues(t, 35, refused.Load())
	got, err := h.svc.Sessions.GetSession(h.ctx, &loopsv1.GetSessionRequest{Id: sess.GetId()})
	require.NoError(t, err)
	require.Len(t, got.GetSamplerIds(), 5)
}

// TestMaxConcurrentRunsSurvivesRestart is issue 23's item 3: runs recovered at start-up
// count against max_concurrent_runs.
func TestMaxConcurrentRunsSurvivesRestart(t *testing.T) {
	p, err := policy.Parse([]byte("default: {max_concurrent_runs: 1}\n"))
	require.NoError(t, err)
	dir := t.TempDir()
	h := newHarness(t, dir, Options{Policy: p})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	create := func(h *harness) error {
		op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
			SessionId: sess.GetId(), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
		})
		if err == nil {
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
		}
		return err
	}
	require.NoError(t, create(h))
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(create(h)))
	require.NoError(t, h.core.Close())

	h2 := newHarness(t, dir, Options{Policy: p})
	err = create(h2)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "after a restart the recovered run still counts: %v", err)
	require.Equal(t, 1, h2.core.policy.Use("ws-a").LiveRuns)
}

// TestRecoveredRunsOfAGoneClientEnd: a run recovered at start-up whose client never comes
// back ends with its session's heartbeat timeout, and stops counting as live.
func TestRecoveredRunsOfAGoneClientEnd(t *testing.T) {
	p, err := policy.Parse([]byte("default: {max_concurrent_runs: 1}\n"))
	require.NoError(t, err)
	dir := t.TempDir()
	h := newHarness(t, dir, Options{Policy: p})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		SessionId: sess.GetId(), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	require.NoError(t, h.core.Close())

	clock := newTestClock()
	h2 := newHarness(t, dir, Options{Policy: p, Now: clock.Now, SessionTTL: time.Minute})
	require.Equal(t, 1, h2.core.policy.Use("ws-a").LiveRuns)
	clock.add(2 * time.Minute)
	h2.core.sweep(h2.ctx)
	require.Zero(t, h2.core.policy.Use("ws-a").LiveRuns)
	_, err = h2.fb(run, 0, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "heartbeat")
}

// TestCoreCallsWithACancelledContextAreNotInternalErrors is issue 23's item 6: a store call
// cut by the client's cancellation is Canceled, not an internal error with an error id.
func TestCoreCallsWithACancelledContextAreNotInternalErrors(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	_, err := h.svc.Sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(err), "%v", err)
	require.NotContains(t, err.Error(), "error id")
}

// TestNoLaneStartsAfterClose is issue 23's item 6: a run created during shutdown must not
// start a lane that nothing stops.
func TestNoLaneStartsAfterClose(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	require.NoError(t, h.core.Close())
	_, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)
	h.core.mu.Lock()
	n := len(h.core.lanes)
	h.core.mu.Unlock()
	require.Zero(t, n, "no lane runs after Close")
}

// wedgedStore never answers a batch write (a store that hangs).
type wedgedStore struct {
	store.Store
	release chan struct{}
}

func (w *wedgedStore) ApplyBatch(ctx context.Context, b store.Batch) error {
	<-w.release
	return w.Store.ApplyBatch(ctx, b)
}

// TestWedgedStoreDoesNotHangListsOrDrain is issue 23's item 6: the persister's waits take a
// context, so a store that hangs cannot hang a list call or the drain past their deadline.
func TestWedgedStoreDoesNotHangListsOrDrain(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	w := &wedgedStore{Store: st, release: make(chan struct{})}
	c, err := New(t.Context(), w, newFakeBackend(), Options{DataDir: dir, PublishAfterCommit: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		close(w.release)
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{t: t, dir: dir, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	_, err = h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(h.ctx, 200*time.Millisecond)
	defer cancel()
	within(t, 10*time.Second, "ListTrainingRuns on a wedged store", func() {
		_, err := h.svc.Training.ListTrainingRuns(ctx, &loopsv1.ListTrainingRunsRequest{})
		require.Error(t, err)
		require.Contains(t, []connect.Code{connect.CodeDeadlineExceeded, connect.CodeUnavailable}, connect.CodeOf(err), "%v", err)
	})
	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	within(t, 10*time.Second, "the drain on a wedged store", func() { c.Drain(dctx) })
}

// TestReplayLogsAreBoundedServerWide is issue 23's item 7: the replay logs of all runs
// together stay under a server-wide bound, not only each under its own.
func TestReplayLogsAreBoundedServerWide(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{RecoverSteps: true, Limits: Limits{MaxReplayBytesPerRun: 1 << 20, MaxReplayBytesTotal: 4 << 10}})
	var runs []string
	for range 4 {
		runs = append(runs, h.newRun())
	}
	big := make([]int32, 60)
	for i := range big {
		big[i] = int32(i%50 + 1)
	}
	for range 8 {
		for _, run := range runs {
			op, err := h.fb(run, 0, datum(big...))
			require.NoError(t, err)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
		}
	}
	require.LessOrEqual(t, h.core.replayBytes(), int64(4<<10), "the replay logs together stay within max_replay_bytes_total")
}

// TestSessionlessSamplesShareOneSampler is issue 23's item 7: sampling that names no sampler
// (Tinker's sessionless asample) uses the workspace's shared sampler of that model or
// checkpoint: one in memory, no record per request (before, 300 requests left 300 rows).
func TestSessionlessSamplesShareOneSampler(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	path, err := h.save(run, "s1", false)
	require.NoError(t, err)
	samplerOf := func(ctx context.Context, req *loopsv1.SampleRequest) string {
		t.Helper()
		op, err := h.svc.Sampling.Sample(ctx, req)
		require.NoError(t, err)
		done, err := h.svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
		return done.GetSamplerId()
	}
	base, ckpt := map[string]bool{}, map[string]bool{}
	for i := range 20 {
		base[samplerOf(h.ctx, &loopsv1.SampleRequest{BaseModel: "fake/model", Prompt: []int32{1, 2}, NumSamples: 1, SeqId: ptr(int64(i))})] = true
		ckpt[samplerOf(h.ctx, &loopsv1.SampleRequest{ModelPath: path, Prompt: []int32{1, 2}, NumSamples: 1})] = true
	}
	require.Len(t, base, 1, "one shared sampler of the base model")
	require.Len(t, ckpt, 1, "one shared sampler of the checkpoint")
	for id := range base {
		_, err := h.core.store.GetSampler(h.ctx, "ws-a", id)
		require.ErrorIs(t, err, store.ErrNotFound, "a shared sampler leaves no record")
	}
	require.Equal(t, 2, h.core.samplers.inMemory())

	other := auth.WithWorkspace(t.Context(), "ws-b")
	require.False(t, base[samplerOf(other, &loopsv1.SampleRequest{BaseModel: "fake/model", Prompt: []int32{1}, NumSamples: 1})], "another workspace has its own")
	_, err = h.svc.Sampling.Sample(other, &loopsv1.SampleRequest{ModelPath: path, Prompt: []int32{1}, NumSamples: 1})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "nor may it use another's checkpoint")
	_, err = h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{Prompt: []int32{1}, NumSamples: 1})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
}

// TestPendingOperationsSayWhyTheyWait is issue 25's item 3: a pending operation says where
// it waits and why: behind its run's earlier work (active, with its position), behind
// another workspace's batch when every batch is busy (paused_capacity), behind its
// workspace's sampling_concurrency (paused_rate_limit).
func TestPendingOperationsSayWhyTheyWait(t *testing.T) {
	p, err := policy.Parse([]byte("default: {sampling_concurrency: 1}\n"))
	require.NoError(t, err)
	h := newHarness(t, t.TempDir(), Options{Policy: p, LaneConcurrency: 1})
	runA := h.newRun()
	other := auth.WithWorkspace(t.Context(), "ws-b")
	op, err := h.svc.Training.CreateTrainingRun(other, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.NoError(t, err)
	done, err := h.svc.Operations.WaitOperation(other, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
	require.NoError(t, err)
	runB := done.GetTrainingRunId()
	third := auth.WithWorkspace(t.Context(), "ws-c")
	op, err = h.svc.Training.CreateTrainingRun(third, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.NoError(t, err)
	done, err = h.svc.Operations.WaitOperation(third, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
	require.NoError(t, err)
	runC := done.GetTrainingRunId()

	// ws-b's batch holds the only batch slot, and ws-c's small step the express batch.
	h.fake.gate, h.fake.entered = make(chan struct{}), make(chan struct{}, 16)
	held, err := h.svc.Training.ForwardBackward(other, &loopsv1.ForwardBackwardRequest{TrainingRunId: runB, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 2)}})
	require.NoError(t, err)
	<-h.fake.entered
	express, err := h.svc.Training.ForwardBackward(third, &loopsv1.ForwardBackwardRequest{TrainingRunId: runC, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 2)}})
	require.NoError(t, err)
	<-h.fake.entered
	first, err := h.fb(runA, 0, datum(1, 2))
	require.NoError(t, err)
	second, err := h.fb(runA, 0, datum(1, 2))
	require.NoError(t, err)
	status := func(ctx context.Context, id string) *loopsv1.QueueStatus {
		got, err := h.svc.Operations.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: id})
		require.NoError(t, err)
		return got.GetQueue()
	}
	require.Eventually(t, func() bool {
		return status(h.ctx, first.GetId()).GetState() == loopsv1.QueueState_QUEUE_STATE_PAUSED_CAPACITY
	}, 10*time.Second, 10*time.Millisecond, "the first waits for the busy batch: %v", status(h.ctx, first.GetId()))
	require.Contains(t, status(h.ctx, first.GetId()).GetReason(), "batches of fake/model are running")
	q := status(h.ctx, second.GetId())
	require.Equal(t, loopsv1.QueueState_QUEUE_STATE_ACTIVE, q.GetState())
	require.EqualValues(t, 1, q.GetPosition())
	require.Contains(t, q.GetReason(), "after 1 earlier operations of training run")
	require.Equal(t, loopsv1.QueueState_QUEUE_STATE_ACTIVE, status(other, held.GetId()).GetState(), "the running one is active")
	require.Equal(t, loopsv1.QueueState_QUEUE_STATE_ACTIVE, status(third, express.GetId()).GetState(), "and the express one")
	close(h.fake.gate)
	go func() {
		for range h.fake.entered {
		}
	}()
	for _, o := range []*loopsv1.Operation{first, second} {
		got := h.wait(o)
		require.Nil(t, got.GetQueue(), "a finished operation has no queue status")
	}
	for _, o := range []struct {
		ctx context.Context
		op  *loopsv1.Operation
	}{{other, held}, {third, express}} {
		got, err := h.svc.Operations.WaitOperation(o.ctx, &loopsv1.WaitOperationRequest{Id: o.op.GetId(), Timeout: durationpb.New(30 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
	}
	close(h.fake.entered)

	// Samples: the workspace's sampling_concurrency (1) is taken by a held sample.
	gs := &gatedSample{release: make(chan struct{}), entered: make(chan struct{}, 4)}
	h.fake.sampleHook = gs.hold
	a, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{BaseModel: "fake/model", Prompt: []int32{1}, NumSamples: 1})
	require.NoError(t, err)
	<-gs.entered
	b, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{BaseModel: "fake/model", Prompt: []int32{1}, NumSamples: 1})
	require.NoError(t, err)
	q = status(h.ctx, b.GetId())
	require.Equal(t, loopsv1.QueueState_QUEUE_STATE_PAUSED_RATE_LIMIT, q.GetState(), "%v", q)
	require.Contains(t, q.GetReason(), "sampling_concurrency")
	close(gs.release)
	h.wait(a)
	h.wait(b)
}

// gatedSample holds the fake backend's samples until release is closed.
type gatedSample struct {
	release, entered chan struct{}
}

func (g *gatedSample) hold() {
	g.entered <- struct{}{}
	<-g.release
}

// TestFairnessMetricsAreExported is issue 25's item 4: every finished operation feeds the
// per-workspace queue wait and latency inflation, and /metrics shows the SLO target and
// whether each workspace is within it.
func TestFairnessMetricsAreExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, t.TempDir(), Options{Registerer: reg, FairnessTarget: 3})
	run := h.newRun()
	op, err := h.fb(run, 0, datum(1, 2))
	require.NoError(t, err)
	h.wait(op)
	n, err := testutil.GatherAndCount(reg, "loops_queue_wait_seconds", "loops_latency_inflation", "loops_fairness_slo_target", "loops_fairness_slo_breached", "loops_fairness_jain_index", "loops_fairness_p99_inflation")
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 6)
	st := h.core.fair.Status("ws-a")
	require.GreaterOrEqual(t, st.Operations, 2, "the create and the forward_backward")
	require.Equal(t, 3.0, st.Target)
}
