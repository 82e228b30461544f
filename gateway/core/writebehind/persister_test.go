package writebehind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/core/trainrun"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

var (
	pending   = loopsv1.OperationState_OPERATION_STATE_PENDING
	succeeded = loopsv1.OperationState_OPERATION_STATE_SUCCEEDED
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testStore is a SQLite store whose writes can be held (hold), made to fail as batches
// (failBatches) or all made to fail (dead), and which records every operation it was given.
type testStore struct {
	store.Store
	mu          sync.Mutex
	held        chan struct{} // non-nil: writes wait until it is closed
	failBatches bool
	dead        bool
	ops         []*loopsv1.Operation // every operation record written, in order
}

func openStore(t *testing.T) *testStore {
	t.Helper()
	sq, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "loops.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sq.Close() })
	return &testStore{Store: sq}
}

var errDead = errors.New("the store is gone")

// hold makes every write wait until the returned function is called.
func (s *testStore) hold() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.held = ch
	s.mu.Unlock()
	return sync.OnceFunc(func() { close(ch) })
}

// enter waits while writes are held and says how the write goes on.
func (s *testStore) enter() (dead, failBatches bool) {
	s.mu.Lock()
	ch := s.held
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead, s.failBatches
}

func (s *testStore) ApplyBatch(ctx context.Context, b store.Batch) error {
	dead, fail := s.enter()
	if dead {
		return errDead
	}
	if fail {
		return errors.New("the batch failed")
	}
	if err := s.Store.ApplyBatch(ctx, b); err != nil {
		return err
	}
	s.mu.Lock()
	for _, o := range b.Operations {
		s.ops = append(s.ops, o.Operation)
	}
	s.mu.Unlock()
	return nil
}

func (s *testStore) PutOperation(ctx context.Context, ws string, op *loopsv1.Operation) error {
	if dead, _ := s.enter(); dead {
		return errDead
	}
	if err := s.Store.PutOperation(ctx, ws, op); err != nil {
		return err
	}
	s.mu.Lock()
	s.ops = append(s.ops, op)
	s.mu.Unlock()
	return nil
}

func (s *testStore) PutTrainingRun(ctx context.Context, ws string, r *loopsv1.TrainingRun) error {
	if dead, _ := s.enter(); dead {
		return errDead
	}
	return s.Store.PutTrainingRun(ctx, ws, r)
}

// written returns the states in which operation id was written to the store, in order.
func (s *testStore) written(id string) []loopsv1.OperationState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var states []loopsv1.OperationState
	for _, o := range s.ops {
		if o.GetId() == id {
			states = append(states, o.GetState())
		}
	}
	return states
}

func operation(id string, state loopsv1.OperationState) *loopsv1.Operation {
	return &loopsv1.Operation{Id: id, State: state, TrainingRunId: "run-1", CreateTime: timestamppb.Now()}
}

// finish queues op's final record and returns a channel closed once it is published.
func finish(p *Persister, ws string, op *loopsv1.Operation) <-chan struct{} {
	published := make(chan struct{})
	p.Finish(ws, op, func() { close(published) })
	return published
}

func requirePublished(t *testing.T, published <-chan struct{}) {
	t.Helper()
	select {
	case <-published:
	case <-time.After(10 * time.Second):
		t.Fatal("the outcome was not published")
	}
}

func requireNotPublished(t *testing.T, published <-chan struct{}) {
	t.Helper()
	select {
	case <-published:
		t.Fatal("the outcome was published before it was durable")
	case <-time.After(50 * time.Millisecond):
	}
}

// TestOutcomePublishedOnceJournaled: with a journal, an outcome is published while the
// store write is still held (the journal has it), and the store gets it afterwards. An
// operation created and finished within one group is written once, in its final state.
func TestOutcomePublishedOnceJournaled(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t)
	p := New(st, quiet())
	require.NoError(t, p.Recover(t.Context(), dir, true))
	defer p.Close()

	// Hold the loop on a first group, so that op-1's creation and outcome go in the next.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.BeforeJournal(func(b store.Batch) {
		for _, o := range b.Operations {
			if o.Operation.GetId() == "op-0" {
				once.Do(func() { close(entered) })
				<-release
			}
		}
	})
	require.NoError(t, p.Create("ws", operation("op-0", pending)))
	<-entered
	releaseStore := st.hold()
	defer releaseStore()
	require.NoError(t, p.Create("ws", operation("op-1", pending)))
	published := finish(p, "ws", operation("op-1", succeeded))
	close(release)
	requirePublished(t, published)
	require.Empty(t, st.written("op-1"), "the store write is held")
	require.True(t, p.Uncommitted("op-1"))
	names, err := JournalFiles(dir)
	require.NoError(t, err)
	require.Len(t, names, 1)

	releaseStore()
	require.NoError(t, p.Settle(t.Context()))
	require.Equal(t, []loopsv1.OperationState{succeeded}, st.written("op-1"), "created and finished in one group: written once")
	require.False(t, p.Uncommitted("op-1"))
}

// TestNoJournalPublishesOnceCommitted: without a journal an outcome is published only once
// the store has it, and Flush gives up when its context ends while the store hangs.
func TestNoJournalPublishesOnceCommitted(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t)
	p := New(st, quiet())
	require.NoError(t, p.Recover(t.Context(), dir, false))
	defer p.Close()
	release := st.hold()
	defer release()

	published := finish(p, "ws", operation("op-1", succeeded))
	requireNotPublished(t, published)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.Flush(ctx), context.DeadlineExceeded)
	names, err := JournalFiles(dir)
	require.NoError(t, err)
	require.Empty(t, names, "no journal is written")

	release()
	requirePublished(t, published)
	require.Equal(t, []loopsv1.OperationState{succeeded}, st.written("op-1"))
	require.NoError(t, p.Flush(t.Context()))
}

// TestReadStoreSeesWhatTheStoreDoesNotHaveYet: reads through a ReadStore answer the
// newest record of an operation or run that the persister holds (only to its workspace);
// lists wait until the store has everything, or end with their context.
func TestReadStoreSeesWhatTheStoreDoesNotHaveYet(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t)
	p := New(st, quiet())
	require.NoError(t, p.Recover(t.Context(), dir, true))
	defer p.Close()
	rs := NewReadStore(st, p)
	release := st.hold()
	defer release()

	r := trainrun.New(trainrun.Config[struct{}]{Workspace: "ws", Record: &loopsv1.TrainingRun{Id: "run-1", CreateTime: timestamppb.Now()}, NextSeq: 1, MaxPending: 1})
	r.Update(func(rec *loopsv1.TrainingRun) { rec.LastSeqId = 7 })
	p.RunChanged(r)
	requirePublished(t, finish(p, "ws", operation("op-1", succeeded)))

	_, err := st.Store.GetOperation(t.Context(), "ws", "op-1")
	require.ErrorIs(t, err, store.ErrNotFound, "not committed yet")
	got, err := rs.GetOperation(t.Context(), "ws", "op-1")
	require.NoError(t, err)
	require.Equal(t, succeeded, got.GetState())
	_, err = rs.GetOperation(t.Context(), "ws-other", "op-1")
	require.ErrorIs(t, err, store.ErrNotFound, "another workspace's operation")
	run, err := rs.GetTrainingRun(t.Context(), "ws", "run-1")
	require.NoError(t, err)
	require.EqualValues(t, 7, run.GetLastSeqId())
	_, err = rs.GetTrainingRun(t.Context(), "ws-other", "run-1")
	require.ErrorIs(t, err, store.ErrNotFound)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, _, err = rs.ListTrainingRuns(ctx, "ws", store.Page{Limit: 10})
	require.ErrorIs(t, err, context.DeadlineExceeded, "a list waits for the store, within its context")

	release()
	runs, n, err := rs.ListTrainingRuns(t.Context(), "ws", store.Page{Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 7, runs[0].GetLastSeqId())
	stored, err := st.Store.GetOperation(t.Context(), "ws", "op-1")
	require.NoError(t, err)
	require.Equal(t, succeeded, stored.GetState())
}

// TestCreateRefusedWhileTheStoreIsFarBehind: with the store hung, new operations are
// taken until maxPendingCreates records wait, then refused with ResourceExhausted
// (QUEUE_FULL); once the persister has stopped, with ErrStopped.
func TestCreateRefusedWhileTheStoreIsFarBehind(t *testing.T) {
	st := openStore(t)
	p := New(st, quiet())
	require.NoError(t, p.Recover(t.Context(), t.TempDir(), true))
	release := st.hold()
	var err error
	accepted := 0
	for i := range 3 * maxPendingCreates {
		if err = p.Create("ws", operation(fmt.Sprintf("op-%d", i), pending)); err != nil {
			break
		}
		accepted++
	}
	require.Error(t, err, "a hung store must stop new operations")
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Equal(t, errs.ReasonQueueFull, errs.Reason(err))
	require.GreaterOrEqual(t, accepted, maxPendingCreates)
	release()
	p.Close()
	require.ErrorIs(t, p.Create("ws", operation("op-late", pending)), ErrStopped)
}

// TestRecoverReplaysTheJournalOfACrash: a process that crashed after publishing an outcome
// the store never got leaves its journal; the next Recover commits it to the store and
// removes the old file, and Close removes the new one once everything is committed.
func TestRecoverReplaysTheJournalOfACrash(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t)
	p1 := New(st, quiet())
	require.NoError(t, p1.Recover(t.Context(), dir, true))
	release := st.hold()
	step := &loopsv1.ReceiptStep{TrainingRunId: "run-1", SeqId: 1, Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD,
		BatchSha256: "sha256:ab", Loss: proto.Float64(1.5)}
	p1.ReceiptStep("ws", step) // queued before the outcome, as the lane does
	requirePublished(t, finish(p1, "ws", operation("op-1", succeeded)))
	st.mu.Lock()
	st.dead = true // the process dies: nothing it still holds reaches the store
	st.mu.Unlock()
	p1.Crash()
	release()
	p1.Close()
	_, err := st.Store.GetOperation(t.Context(), "ws", "op-1")
	require.ErrorIs(t, err, store.ErrNotFound)
	old, err := JournalFiles(dir)
	require.NoError(t, err)
	require.Len(t, old, 1, "the crash left its journal")

	st.mu.Lock()
	st.dead = false
	st.mu.Unlock()
	p2 := New(st, quiet())
	require.NoError(t, p2.Recover(t.Context(), dir, true))
	got, err := st.Store.GetOperation(t.Context(), "ws", "op-1")
	require.NoError(t, err)
	require.Equal(t, succeeded, got.GetState())
	steps, _, err := st.Store.ListReceiptSteps(t.Context(), "ws", "run-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, steps, 1, "the receipt step the journal held reached the store")
	require.True(t, proto.Equal(step, steps[0]))
	names, err := JournalFiles(dir)
	require.NoError(t, err)
	require.Len(t, names, 1)
	require.NotEqual(t, old, names, "the replayed file is removed; the new process has its own")
	p2.Close()
	names, err = JournalFiles(dir)
	require.NoError(t, err)
	require.Empty(t, names)
}

// TestFailedBatchIsWrittenRecordByRecord: a batch the store fails is written one record at
// a time. A record that still fails is logged and the journal is kept rather than removed,
// so that the next start replays it.
func TestFailedBatchIsWrittenRecordByRecord(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t)
	st.failBatches = true
	p := New(st, quiet())
	require.NoError(t, p.Recover(t.Context(), dir, true))
	requirePublished(t, finish(p, "ws", operation("op-1", succeeded)))
	require.NoError(t, p.Settle(t.Context()))
	got, err := st.Store.GetOperation(t.Context(), "ws", "op-1")
	require.NoError(t, err)
	require.Equal(t, succeeded, got.GetState())

	st.mu.Lock()
	st.dead = true // now single records fail too
	st.mu.Unlock()
	requirePublished(t, finish(p, "ws", operation("op-2", succeeded)))
	require.NoError(t, p.Settle(t.Context()))
	p.Close()
	names, err := JournalFiles(dir)
	require.NoError(t, err)
	require.Len(t, names, 1, "a store write failed: the journal is kept")

	st.mu.Lock()
	st.dead, st.failBatches = false, false
	st.mu.Unlock()
	p2 := New(st, quiet())
	require.NoError(t, p2.Recover(t.Context(), dir, true))
	defer p2.Close()
	got, err = st.Store.GetOperation(t.Context(), "ws", "op-2")
	require.NoError(t, err)
	require.Equal(t, succeeded, got.GetState())
}
