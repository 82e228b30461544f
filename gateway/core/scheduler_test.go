package core

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core/trainrun"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/lifecycle"
)

// recordingRunner is a taskRunner with no backend: it records what the lane sends, holds
// non-batched tasks until released, and finishes everything else at once.
type recordingRunner struct {
	mu      sync.Mutex
	batches [][]string // run ids per forward/backward call
	ran     []string   // "<run>:<seq>" of non-batched tasks, when they finished
	held    chan struct{}
	started chan string
	done    chan string
}

func (f *recordingRunner) prepare(context.Context, *run, *task) error { return nil }

func (f *recordingRunner) run(_ context.Context, r *run, t *task) {
	f.started <- r.ID()
	<-f.held
	f.mu.Lock()
	f.ran = append(f.ran, r.ID())
	f.mu.Unlock()
	r.Release()
	f.done <- r.ID()
}

func (f *recordingRunner) forwardBackward(_ context.Context, batch []runTask) {
	var ids []string
	for _, rt := range batch {
		ids = append(ids, rt.r.ID())
	}
	f.mu.Lock()
	f.batches = append(f.batches, ids)
	f.mu.Unlock()
	for _, rt := range batch {
		rt.r.Release()
		f.done <- rt.r.ID()
	}
}

func (f *recordingRunner) fail(r *run, _ *task, _ error) { r.Release() }

func (f *recordingRunner) resume(r *run) { r.Release() }

func (f *recordingRunner) rebuild(context.Context, *run) error { return nil }

// freeSlots is a slotKeeper with a slot for every run.
type freeSlots struct{}

func (freeSlots) admit(context.Context, *run) error { return nil }
func (freeSlots) park(*run)                         {}
func (freeSlots) move(context.Context, *run) error  { return nil }
func (freeSlots) keep(*run)                         {}

// laneRun is a run on lane l with no core behind it.
func laneRun(l *lane, id, ws string) *run {
	return trainrun.New(trainrun.Config[*operation]{Workspace: ws, Record: &loopsv1.TrainingRun{Id: id},
		NextSeq: 1, MaxPending: 16, Ready: l.markReady})
}

// enqueue queues a task on the run as submit does: a barrier, or forward/backward work of
// the given tokens.
func enqueue(r *run, seq int64, fbTokens int) {
	t := &task{Seq: seq, Op: &operation{}}
	kind := loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP
	if fbTokens > 0 {
		t.FB, t.Tokens = &backendv1.ForwardBackwardItem{}, fbTokens
		kind = loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD
	}
	if _, err := r.Admit(seq, kind); err != nil {
		panic(err)
	}
	if err := r.Commit(kind, "op", t); err != nil {
		panic(err)
	}
}

// TestLaneBarrierHoldsOnlyItsRun drives a lane with no core: while run A's optim_step (a
// barrier) is held, runs B and C keep stepping, batched together; A's next step waits for
// its barrier only; batches split at maxBatchTokens.
func TestLaneBarrierHoldsOnlyItsRun(t *testing.T) {
	f := &recordingRunner{held: make(chan struct{}), started: make(chan string, 1), done: make(chan string, 64)}
	running := newBusy()
	life := lifecycle.New(t.Context())
	l, err := newLane(life, "m", f, freeSlots{}, running, 100)
	require.NoError(t, err)
	defer func() { require.NoError(t, life.Stop(t.Context())) }()
	a, b, c := laneRun(l, "A", "ws1"), laneRun(l, "B", "ws2"), laneRun(l, "C", "ws3")

	enqueue(a, 1, 0)  // barrier
	enqueue(a, 2, 10) // waits for it
	require.Equal(t, "A", <-f.started)
	for seq := int64(1); seq <= 3; seq++ {
		enqueue(b, seq, 60)
		enqueue(c, seq, 60)
		got := []string{<-f.done, <-f.done}
		slices.Sort(got)
		require.Equal(t, []string{"B", "C"}, got, "step %d of B and C ran while A's barrier is held", seq)
	}
	f.mu.Lock()
	for _, batch := range f.batches {
		require.NotContains(t, batch, "A")
		require.LessOrEqual(t, len(batch), 1, "two 60-token items do not fit a 100-token batch")
	}
	f.mu.Unlock()

	close(f.held)
	require.Equal(t, "A", <-f.done, "the barrier")
	require.Equal(t, "A", <-f.done, "then A's own forward/backward")
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
		defer cancel()
		return running.wait(ctx) == nil
	}, 5*time.Second, time.Millisecond, "the lane is idle")
}
