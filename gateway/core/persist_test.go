package core

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/writebehind"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// slowOpStore delays every write of operation records by delay (when set).
type slowOpStore struct {
	store.Store
	delay atomic.Int64
}

func (s *slowOpStore) sleep() {
	if d := time.Duration(s.delay.Load()); d > 0 {
		time.Sleep(d)
	}
}

func (s *slowOpStore) PutOperation(ctx context.Context, ws string, op *loopsv1.Operation) error {
	s.sleep()
	return s.Store.PutOperation(ctx, ws, op)
}

func (s *slowOpStore) ApplyBatch(ctx context.Context, b store.Batch) error {
	if len(b.Operations) > 0 {
		s.sleep()
	}
	return s.Store.ApplyBatch(ctx, b)
}

// timedBackend records when each adapter's forward/backward item reached the backend.
type timedBackend struct {
	*fakeBackend
	mu      sync.Mutex
	arrived map[string]time.Time
}

func (b *timedBackend) Trainer() backends.Trainer { return b }

func (b *timedBackend) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	b.mu.Lock()
	for _, it := range req.GetItems() {
		b.arrived[it.GetAdapterId()] = time.Now()
	}
	b.mu.Unlock()
	return b.fakeBackend.ForwardBackward(ctx, req)
}

func (b *timedBackend) arrival(id string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.arrived[id]
	return t, ok
}

// TestSlowStoreDoesNotDelayAnotherRun: with every operation write taking 300 ms, run A's
// submission does not hold up run B: B's submission returns at once and B's item reaches the
// backend at once (the lane never waits for the store). Only B's acknowledgement waits for
// its outcome to be durable, which takes the batch in progress plus B's own. Before
// write-behind, B's submission alone took a write (300 ms, under B's lock), its item reached
// the backend after A's submission, and the lane wrote each outcome before the next
// (issue 9: ~0.3 ms → ~950 ms).
func TestSlowStoreDoesNotDelayAnotherRun(t *testing.T) {
	const delay = 300 * time.Millisecond
	dir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	st := &slowOpStore{Store: sq}
	be := &timedBackend{fakeBackend: newFakeBackend(), arrived: map[string]time.Time{}}
	c, err := New(t.Context(), st, be, Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() {
		st.delay.Store(0)
		_ = c.Close()
		_ = sq.Close()
	})
	h := &harness{t: t, dir: dir, fake: be.fakeBackend, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	runA, runB := h.newRun(), h.newRun()

	st.delay.Store(int64(delay))
	aDone := make(chan *loopsv1.Operation, 1)
	go func() {
		op, err := h.fb(runA, 1, datum(1, 2))
		if err != nil {
			op = nil
		}
		aDone <- op
	}()
	time.Sleep(20 * time.Millisecond) // A's write is under way
	start := time.Now()
	opB, err := h.fb(runB, 1, datum(3, 4))
	require.NoError(t, err)
	submitted := time.Since(start)
	var reached time.Duration
	require.Eventually(t, func() bool {
		at, ok := be.arrival(runB)
		reached = at.Sub(start)
		return ok
	}, 5*time.Second, time.Millisecond)
	acked := h.wait(opB)
	ackedAfter := time.Since(start)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, acked.GetState())
	t.Logf("run B with a %v store write: submit %v, backend reached after %v, result acknowledged after %v", delay, submitted, reached, ackedAfter)
	require.Less(t, submitted, 50*time.Millisecond, "B's submission waited for the store")
	require.Less(t, reached, 100*time.Millisecond, "B's forward_backward waited for the store")
	require.Less(t, ackedAfter, 3*delay, "B's acknowledgement waited for more than two batches")
	opA := <-aDone
	require.NotNil(t, opA)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(opA).GetState())
}

// crashStore blocks the batch that holds operation hold until release is closed, then
// fails it; once dead it writes nothing (the process "crashed" meanwhile).
type crashStore struct {
	store.Store
	mu      sync.Mutex
	hold    string
	entered chan struct{}
	release chan struct{}
	dead    atomic.Bool
}

var errStoreDied = errors.New("crashed")

func (s *crashStore) ApplyBatch(ctx context.Context, b store.Batch) error {
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	for _, o := range b.Operations {
		if hold != "" && o.Operation.GetId() == hold && isDone(o.Operation) {
			close(s.entered)
			<-s.release
			return errStoreDied
		}
	}
	if s.dead.Load() {
		return errStoreDied
	}
	return s.Store.ApplyBatch(ctx, b)
}

func (s *crashStore) PutOperation(ctx context.Context, ws string, op *loopsv1.Operation) error {
	if s.dead.Load() {
		return errStoreDied
	}
	return s.Store.PutOperation(ctx, ws, op)
}

func (s *crashStore) PutTrainingRun(ctx context.Context, ws string, r *loopsv1.TrainingRun) error {
	if s.dead.Load() {
		return errStoreDied
	}
	return s.Store.PutTrainingRun(ctx, ws, r)
}

// holdJournal makes the persister block before journaling the group that holds operation
// id's final record: entered is closed when it gets there, and it goes on when release is.
func holdJournal(p *writebehind.Persister, id string) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.BeforeJournal(func(b store.Batch) {
		for _, o := range b.Operations {
			if o.Operation.GetId() == id && isDone(o.Operation) {
				once.Do(func() { close(entered) })
				<-release
			}
		}
	})
	return entered, release
}

// TestCrashKeepsWhatWasAcknowledged: the process dies between an operation's finish and the
// journal write of its outcome (its creation was recorded). After the restart, the run, an acknowledged checkpoint and
// every acknowledged outcome are there (a large result as RESULT_EXPIRED: only its small part
// is stored); the operation whose outcome was being journaled was never published (no client
// saw it finish) and is failed "server restarted"; one whose creation was never journaled is
// unknown, with "resubmit".
func TestCrashKeepsWhatWasAcknowledged(t *testing.T) {
	dir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	st := &crashStore{Store: sq}
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir, GapTimeout: time.Hour})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	fb1, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	require.Len(t, h.wait(fb1).GetForwardBackward().GetOutputs(), 1) // acknowledged, with its result
	save, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 2, Name: "ck1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING})
	require.NoError(t, err)
	saved := h.wait(save)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, saved.GetState(), saved.GetError().GetMessage())

	// fb2's outcome is decided; the crash comes before it is journaled.
	fake.gate = make(chan struct{})
	fb2, err := h.fb(run, 3, datum(1, 2))
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := sq.GetOperation(t.Context(), "ws-a", fb2.GetId()); return err == nil }, 5*time.Second, time.Millisecond)
	entered, release := holdJournal(c.ops.persist, fb2.GetId())
	close(fake.gate)
	<-entered
	fb3, err := h.fb(run, 4, datum(1, 2)) // created while fb2's group is being journaled
	require.NoError(t, err)
	// No client sees fb2's outcome: it is not durable.
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: fb2.GetId(), Timeout: durationpb.New(100 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, isDone(got))

	// Crash: nothing more is journaled, written or published.
	st.dead.Store(true)
	c.ops.persist.Crash()
	close(release)
	got, err = h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: fb2.GetId(), Timeout: durationpb.New(100 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, isDone(got))
	t.Cleanup(func() {
		_ = c.Close()
		_ = sq.Close()
	})

	h2 := newHarness(t, dir, Options{})
	// The acknowledged forward_backward: its outcome is stored (small part only) and its
	// large result is gone with the process.
	stored, err := sq.GetOperation(t.Context(), "ws-a", fb1.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, stored.GetState())
	require.Empty(t, stored.GetForwardBackward().GetOutputs())
	require.Contains(t, stored.GetForwardBackward().GetMetrics(), "loss:sum")
	_, err = h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: fb1.GetId()})
	requireExpired(t, err)
	// The acknowledged save, its checkpoint and the run.
	got, err = h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: save.GetId()})
	require.NoError(t, err)
	require.Equal(t, saved.GetSaveWeights().GetPath(), got.GetSaveWeights().GetPath())
	_, err = h2.svc.Checkpoints.GetCheckpoint(h2.ctx, &loopsv1.GetCheckpointRequest{Path: saved.GetSaveWeights().GetPath()})
	require.NoError(t, err)
	info, err := h2.svc.Training.GetTrainingRun(h2.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.Equal(t, saved.GetSaveWeights().GetPath(), info.GetLastCheckpoint().GetTinkerPath())
	// fb2: recorded, never acknowledged: failed by the restart.
	got, err = h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: fb2.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "server restarted")
	// fb3: never recorded: unknown, resubmit.
	_, err = h2.svc.Operations.WaitOperation(h2.ctx, &loopsv1.WaitOperationRequest{Id: fb3.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	require.Contains(t, err.Error(), "restarted before recording it; resubmit")
}

// TestCrashKeepsJournaledOutcomes: an outcome is acknowledged once journaled, before the
// store has it; the process dies while the store write is blocked. The restart replays the
// journal: the acknowledged outcome is there (not "server restarted"), and the store holds
// it too. The journal is then empty.
func TestCrashKeepsJournaledOutcomes(t *testing.T) {
	dir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	st := &crashStore{Store: sq, entered: make(chan struct{}), release: make(chan struct{})}
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir, GapTimeout: time.Hour})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	fake.gate = make(chan struct{})
	fb, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	opt, err := h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 2, Adam: &loopsv1.AdamParams{LearningRate: 1e-4}})
	require.NoError(t, err)
	st.mu.Lock()
	st.hold = fb.GetId() // the store write of fb's outcome blocks
	st.mu.Unlock()
	close(fake.gate)
	acked := h.wait(fb)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, acked.GetState())
	ackedOpt := h.wait(opt)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, ackedOpt.GetState())
	<-st.entered
	if got, err := sq.GetOperation(t.Context(), "ws-a", fb.GetId()); err == nil {
		require.False(t, isDone(got), "the store does not have fb's outcome yet")
	}

	st.dead.Store(true)
	c.ops.persist.Crash()
	close(st.release)
	t.Cleanup(func() {
		_ = c.Close()
		_ = sq.Close()
	})

	h2 := newHarness(t, dir, Options{})
	for _, want := range []*loopsv1.Operation{acked, ackedOpt} {
		stored, err := sq.GetOperation(t.Context(), "ws-a", want.GetId())
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, stored.GetState(), stored.GetError().GetMessage())
		require.Equal(t, want.GetDoneTime().AsTime(), stored.GetDoneTime().AsTime())
	}
	got, err := h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: opt.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
	info, err := h2.svc.Training.GetTrainingRun(h2.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.EqualValues(t, 2, info.GetLastSeqId())
	names, err := writebehind.JournalFiles(dir)
	require.NoError(t, err)
	require.Len(t, names, 1, "the replayed files are removed; the new process has its own")
}

// TestUncommittedOutcomesStayInMemory: an outcome is published once journaled; while the
// store does not have it yet, the operation stays in memory past finishedInMemory, and reads
// through the core's store see it; once committed it may leave memory.
func TestUncommittedOutcomesStayInMemory(t *testing.T) {
	dir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	st := &gateStore{Store: sq, gate: make(chan struct{})}
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = sq.Close()
	})
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	// The creation, and its retrieval time, are in the store.
	require.NoError(t, c.ops.persist.Sync(context.Background()))
	st.closed.Store(true) // from here every batch waits at the gate
	op, err := h.fb(run, 0, datum(1, 2, 3))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	_, err = sq.GetOperation(h.ctx, "ws-a", op.GetId())
	require.ErrorIs(t, err, store.ErrNotFound, "not committed yet")
	read, err := c.store.GetOperation(h.ctx, "ws-a", op.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, read.GetState())
	_, err = c.store.GetOperation(h.ctx, "ws-b", op.GetId())
	require.ErrorIs(t, err, store.ErrNotFound)
	info, err := c.store.GetTrainingRun(h.ctx, "ws-a", run)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.GetLastSeqId())

	c.ops.evictFinishedBefore(c.now().Add(2 * finishedInMemory))
	c.ops.mu.Lock()
	_, inMemory := c.ops.byID[op.GetId()]
	c.ops.mu.Unlock()
	require.True(t, inMemory, "evicted before the store had it")

	close(st.gate)
	require.NoError(t, c.ops.persist.Sync(context.Background())) // the outcome, and its retrieval time
	stored, err := sq.GetOperation(h.ctx, "ws-a", op.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, stored.GetState())
	c.ops.evictFinishedBefore(c.now().Add(2 * finishedInMemory))
	c.ops.mu.Lock()
	_, inMemory = c.ops.byID[op.GetId()]
	c.ops.mu.Unlock()
	require.False(t, inMemory)
}

// gateStore holds every ApplyBatch, once closed is set, until gate is closed.
type gateStore struct {
	store.Store
	closed atomic.Bool
	gate   chan struct{}
}

func (s *gateStore) ApplyBatch(ctx context.Context, b store.Batch) error {
	if s.closed.Load() {
		<-s.gate
	}
	return s.Store.ApplyBatch(ctx, b)
}

func requireExpired(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), err)
	require.Equal(t, errs.ReasonResultExpired, errs.Reason(err))
	require.Contains(t, err.Error(), "result expired")
	require.Contains(t, err.Error(), "rerun the step")
}

// TestResultCacheBudgets: large results stay retrievable within the cache's size budget
// (oldest leave first) and its time budget, then answer RESULT_EXPIRED over WaitOperation
// and GetOperation; the store keeps state and metrics only; an encoding is made once.
func TestResultCacheBudgets(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	long := make([]int32, 32)
	for i := range long {
		long[i] = int32(i % 50)
	}
	// The size of one result, measured on a first server.
	h := newHarness(t, t.TempDir(), Options{Now: clock, ResultCacheTTL: time.Minute})
	op0, err := h.fb(h.newRun(), 1, datum(long...))
	require.NoError(t, err)
	h.wait(op0)
	one, n := h.core.ops.results.Usage()
	require.Equal(t, 1, n)

	h = newHarness(t, t.TempDir(), Options{Now: clock, ResultCacheTTL: time.Minute, ResultCacheBytes: 2*one + one/2}) // room for two results
	rc := h.core.ops.results
	run := h.newRun()
	op1, err := h.fb(run, 1, datum(long...))
	require.NoError(t, err)
	require.Len(t, h.wait(op1).GetForwardBackward().GetOutputs()[0].GetOutputs()["logprobs"].GetFloat32Data(), 32)
	_, n = rc.Usage()
	require.Equal(t, 1, n)

	op2, err := h.fb(run, 2, datum(long...))
	require.NoError(t, err)
	h.wait(op2)
	op3, err := h.fb(run, 3, datum(long...))
	require.NoError(t, err)
	h.wait(op3)
	bytes, n := rc.Usage()
	require.Equal(t, 2, n)
	require.LessOrEqual(t, bytes, rc.MaxBytes())

	// op1 left first.
	_, err = h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: op1.GetId()})
	requireExpired(t, err)
	_, err = h.svc.Operations.GetOperation(h.ctx, &loopsv1.GetOperationRequest{Id: op1.GetId()})
	requireExpired(t, err)
	got, err := h.svc.Operations.GetOperation(h.ctx, &loopsv1.GetOperationRequest{Id: op3.GetId()})
	require.NoError(t, err)
	require.Len(t, got.GetForwardBackward().GetOutputs(), 1)

	// The store holds state and metrics, not outputs.
	h.core.ops.persist.Settle(context.Background())
	stored, err := h.core.store.GetOperation(h.ctx, "ws-a", op3.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, stored.GetState())
	require.Empty(t, stored.GetForwardBackward().GetOutputs())
	require.InDelta(t, 1, stored.GetForwardBackward().GetMetrics()["loss:sum"], 0) // the fake reports its datum count

	// An encoding is made once and counts against the budget.
	calls := 0
	enc := func() ([]byte, error) { calls++; return make([]byte, 100), nil }
	for range 3 {
		b, err := h.svc.Operations.EncodedResult(op3.GetId(), "x", enc)
		require.NoError(t, err)
		require.Len(t, b, 100)
	}
	require.Equal(t, 1, calls)
	after, _ := rc.Usage()
	require.Equal(t, bytes+100, after)

	// Small results (optim_step, saves) are not cached and never expire.
	opt, err := h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 4, Adam: &loopsv1.AdamParams{LearningRate: 1e-3}})
	require.NoError(t, err)
	h.wait(opt)

	// Past the time budget, every large result has expired.
	now.Add(int64(2 * time.Minute))
	_, err = h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: op3.GetId()})
	requireExpired(t, err)
	h.core.ops.evictFinishedBefore(clock().Add(-time.Hour))
	_, n = rc.Usage()
	require.Zero(t, n)
	got, err = h.svc.Operations.GetOperation(h.ctx, &loopsv1.GetOperationRequest{Id: opt.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
}
