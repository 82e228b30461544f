package core

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

func (h *harness) session() string {
	h.t.Helper()
	s, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(h.t, err)
	return s.GetId()
}

func (h *harness) createIn(session string, seq *int64) (*loopsv1.Operation, error) {
	return h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "fake/model", SessionId: session, ClientSeqId: seq, Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
}

// TestConcurrentRetriedCreatesMakeOneRun: retries of one client_seq_id that arrive together
// (the SDK retries a create whose answer was lost) create one run, not several.
func TestConcurrentRetriedCreatesMakeOneRun(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	sess := h.session()
	const n = 16
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op, err := h.createIn(sess, ptr(int64(7)))
			if err == nil {
				ids[i] = op.GetId()
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	runs, err := h.svc.Training.ListTrainingRuns(h.ctx, &loopsv1.ListTrainingRunsRequest{})
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.GetTotalCount())
	got, err := h.svc.Sessions.GetSession(h.ctx, &loopsv1.GetSessionRequest{Id: sess})
	require.NoError(t, err)
	require.Len(t, got.GetTrainingRunIds(), 1)
}

// heldRunWrites is a store whose next PutTrainingRun waits until release is closed, to
// stop a creation in the middle while the test ends its session.
type heldRunWrites struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *heldRunWrites) PutTrainingRun(ctx context.Context, ws string, r *loopsv1.TrainingRun) error {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Store.PutTrainingRun(ctx, ws, r)
}

// TestRunCreatedWhileItsSessionEndsIsNotLeft: a run whose creation is under way when its
// session ends is refused or unloaded with the session; it never keeps an adapter and
// work in an ended session.
func TestRunCreatedWhileItsSessionEndsIsNotLeft(t *testing.T) {
	dir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	st := &heldRunWrites{Store: sq, entered: make(chan struct{}), release: make(chan struct{})}
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = sq.Close()
	})
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	sess := h.session()
	st.armed.Store(true)
	type result struct {
		op  *loopsv1.Operation
		err error
	}
	res := make(chan result, 1)
	go func() {
		op, err := h.createIn(sess, nil)
		res <- result{op, err}
	}()
	<-st.entered
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess})
	require.NoError(t, err)
	close(st.release)
	r := <-res
	if r.err != nil {
		require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(r.err), r.err.Error())
		require.Empty(t, fake.adapters)
		return
	}
	run := h.wait(r.op).GetTrainingRunId()
	_, err = h.fb(run, 0, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "run %s of an ended session still takes work", run)
	require.Eventually(t, func() bool { return h.fake.has(run) != nil }, 5*time.Second, time.Millisecond, "run %s of an ended session kept its adapter", run)
}

// TestSessionEndWaitsForTheRunsInFlightWork: ending a session while one of its runs is in
// a backend call frees the adapter after that call, not under it; the call succeeds.
func TestSessionEndWaitsForTheRunsInFlightWork(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	sess := h.session()
	op, err := h.createIn(sess, nil)
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 1)
	fb, err := h.fb(run, 0, datum(1, 2, 3))
	require.NoError(t, err)
	<-h.fake.entered
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess})
	require.NoError(t, err)
	require.NoError(t, h.fake.has(run), "the adapter was freed under the run's in-flight forward_backward")
	close(h.fake.gate)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(fb).GetState(), h.wait(fb).GetError().GetMessage())
	require.Eventually(t, func() bool { return h.fake.has(run) != nil }, 5*time.Second, 5*time.Millisecond, "the adapter was not freed after the call")
	// The run refuses new work with the reason.
	_, err = h.fb(run, 0, datum(1, 2))
	require.ErrorContains(t, err, "its session "+sess+" ended")
}

// TestUnloadIsQueuedBehindRunningWork: an explicit unload runs after the run's queued work.
func TestUnloadIsQueuedBehindRunningWork(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 1)
	fb, err := h.fb(run, 0, datum(1, 2, 3))
	require.NoError(t, err)
	<-h.fake.entered
	unload, err := h.svc.Training.UnloadTrainingRun(h.ctx, &loopsv1.UnloadTrainingRunRequest{Id: run})
	require.NoError(t, err)
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: unload.GetId(), Timeout: durationpb.New(30 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, isDone(got))
	require.NoError(t, h.fake.has(run))
	close(h.fake.gate)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(fb).GetState())
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(unload).GetState())
	require.Error(t, h.fake.has(run), "the unload's result came before the adapter was freed")
}
