package lane_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/loops-dev/loops/gateway/core/lane"
	"github.com/loops-dev/loops/gateway/core/trainrun"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type op struct{}

type (
	run  = trainrun.Run[*op]
	task = trainrun.Task[*op]
)

// recordingRunner is a Runner with no backend: it records what the lane sends, holds
// non-batched tasks until released and batches while gate is closed, and finishes
// everything else at once.
type recordingRunner struct {
	mu      sync.Mutex
	batches [][]string // "<run>#<piece>" per batch
	held    chan struct{}
	gate    chan struct{} // when set, a batch waits on it
	started chan string
	entered chan []string // when set, receives each batch as it starts
	done    chan string
}

func (f *recordingRunner) Prepare(context.Context, *run, *task) error { return nil }

func (f *recordingRunner) Run(_ context.Context, r *run, _ *task) {
	f.started <- r.ID()
	<-f.held
	r.Release()
	f.done <- r.ID()
}

func (f *recordingRunner) ForwardBackward(_ context.Context, batch []lane.Item[*op]) []bool {
	var ids []string
	for _, it := range batch {
		ids = append(ids, it.Run.ID()+"#"+string(rune('0'+it.Task.Next)))
	}
	if f.entered != nil {
		f.entered <- ids
	}
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	f.batches = append(f.batches, ids)
	f.mu.Unlock()
	more := make([]bool, len(batch))
	for i, it := range batch {
		if it.Task.Next++; !it.Task.Done() {
			more[i] = true
			continue
		}
		it.Run.Release()
		f.done <- it.Run.ID()
	}
	return more
}

func (f *recordingRunner) Fail(r *run, _ *task, _ error) { r.Release() }
func (f *recordingRunner) Resume(r *run)                 { r.Release() }
func (f *recordingRunner) Rebuild(context.Context, *run) error {
	return nil
}

// freeSlots is a Slots with a slot for every run.
type freeSlots struct{}

func (freeSlots) Admit(context.Context, *run) error { return nil }
func (freeSlots) Park(*run)                         {}
func (freeSlots) Move(context.Context, *run) error  { return nil }
func (freeSlots) Keep(*run)                         {}

// counter counts the lane's work in progress. (A sync.WaitGroup is not one: the lane adds
// to it at any time, and an Add racing a Wait is a misuse the race detector reports.)
type counter struct{ n atomic.Int64 }

func (c *counter) Add()  { c.n.Add(1) }
func (c *counter) Done() { c.n.Add(-1) }

// idle reports whether no work is in progress.
func (c *counter) idle() bool { return c.n.Load() == 0 }

func newLane(t *testing.T, f *recordingRunner, maxBatchTokens, concurrency int) (*lane.Lane[*op], *counter) {
	t.Helper()
	return newLaneWith(t, f, lane.Config{MaxBatchTokens: maxBatchTokens, Concurrency: concurrency})
}

// newLaneWith starts a lane of cfg (its model, lifecycle owner and counter set here).
func newLaneWith(t *testing.T, f *recordingRunner, cfg lane.Config) (*lane.Lane[*op], *counter) {
	t.Helper()
	life := lifecycle.New(t.Context())
	busy := &counter{}
	cfg.Model, cfg.Life, cfg.Busy = "m", life, busy
	l, err := lane.New(cfg, lane.Runner[*op](f), lane.Slots[*op](freeSlots{}))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, life.Stop(context.Background())) })
	return l, busy
}

// laneRun is a run on lane l with no core behind it.
func laneRun(l *lane.Lane[*op], id, ws string) *run {
	return trainrun.New(trainrun.Config[*op]{Workspace: ws, Record: &loopsv1.TrainingRun{Id: id},
		NextSeq: 1, MaxPending: 16, Ready: l.MarkReady})
}

// enqueue queues a task on the run as the core's submit does: a barrier, or
// forward/backward work of the given tokens in pieces.
func enqueue(r *run, seq int64, pieces ...int) {
	t := &task{Seq: seq, Op: &op{}}
	kind := loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP
	if len(pieces) > 0 {
		t.FB = &backendv1.ForwardBackwardItem{}
		kind = loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD
		for _, n := range pieces {
			t.Chunks = append(t.Chunks, trainrun.Chunk{Tokens: n})
			t.Tokens += n
		}
		if len(pieces) == 1 {
			t.Chunks = nil
		}
	}
	if _, err := r.Admit(seq, kind); err != nil {
		panic(err)
	}
	if err := r.Commit(kind, "op", t); err != nil {
		panic(err)
	}
}

// TestBarrierHoldsOnlyItsRun: while run A's optim_step (a barrier) is held, runs B and C
// keep stepping; A's next step waits for its barrier only; batches hold at most
// maxBatchTokens.
func TestBarrierHoldsOnlyItsRun(t *testing.T) {
	f := &recordingRunner{held: make(chan struct{}), started: make(chan string, 1), done: make(chan string, 64)}
	l, busy := newLane(t, f, 100, 2)
	a, b, c := laneRun(l, "A", "ws1"), laneRun(l, "B", "ws2"), laneRun(l, "C", "ws3")

	enqueue(a, 1)     // barrier
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
		require.NotContains(t, batch, "A#0")
		require.Len(t, batch, 1, "two 60-token items do not fit a 100-token batch")
	}
	f.mu.Unlock()

	close(f.held)
	require.Equal(t, "A", <-f.done, "the barrier")
	require.Equal(t, "A", <-f.done, "then A's own forward/backward")
	require.Eventually(t, busy.idle, 5*time.Second, time.Millisecond, "the lane is idle")
}

// TestAnotherWorkspaceDoesNotWaitForABatchInFlight: while a flooding workspace's batch is
// in flight (held), another workspace's work starts on the second batch at once; the
// flooding workspace's next piece waits for its own batch.
func TestAnotherWorkspaceDoesNotWaitForABatchInFlight(t *testing.T) {
	f := &recordingRunner{gate: make(chan struct{}), entered: make(chan []string, 8), done: make(chan string, 64)}
	var once sync.Once
	release := func() { once.Do(func() { close(f.gate) }) }
	t.Cleanup(release)
	l, _ := newLane(t, f, 1000, 2)
	heavy, heavy2, light := laneRun(l, "H", "heavy"), laneRun(l, "H2", "heavy"), laneRun(l, "L", "light")
	enqueue(heavy, 1, 500, 500, 500)
	require.Equal(t, []string{"H#0"}, <-f.entered)
	enqueue(heavy2, 1, 100) // the same workspace: waits for its batch
	enqueue(light, 1, 30)
	require.Equal(t, []string{"L#0"}, <-f.entered, "the light workspace's work started beside the heavy batch")
	select {
	case b := <-f.entered:
		t.Fatalf("a second batch of the heavy workspace started while its first was in flight: %v", b)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	var got []string
	for range 3 {
		got = append(got, <-f.done)
	}
	slices.Sort(got)
	require.Equal(t, []string{"H", "H2", "L"}, got)
	f.mu.Lock()
	defer f.mu.Unlock()
	var hPieces []string
	for _, b := range f.batches {
		for _, id := range b {
			if id[:2] == "H#" {
				hPieces = append(hPieces, id)
			}
		}
	}
	require.Equal(t, []string{"H#0", "H#1", "H#2"}, hPieces, "one piece per batch, in order")
}

// TestSmallStepIsNotHeldUpByFloods: with both batches taken by two flooding workspaces, a
// third workspace's small step starts at once in the express batch, alone; a second small
// step waits for the express batch, and a big piece never takes it.
func TestSmallStepIsNotHeldUpByFloods(t *testing.T) {
	f := &recordingRunner{gate: make(chan struct{}), entered: make(chan []string, 8), done: make(chan string, 64)}
	var once sync.Once
	release := func() { once.Do(func() { close(f.gate) }) }
	t.Cleanup(release)
	l, _ := newLaneWith(t, f, lane.Config{MaxBatchTokens: 1000, Concurrency: 2, ExpressTokens: 16})
	a, b := laneRun(l, "A", "flood-a"), laneRun(l, "B", "flood-b")
	light, light2, big := laneRun(l, "L", "light"), laneRun(l, "L2", "light2"), laneRun(l, "C", "big")
	enqueue(a, 1, 500, 500)
	require.Equal(t, []string{"A#0"}, <-f.entered)
	enqueue(b, 1, 500, 500)
	require.Equal(t, []string{"B#0"}, <-f.entered)
	enqueue(big, 1, 100)
	enqueue(light, 1, 10)
	require.Equal(t, []string{"L#0"}, <-f.entered, "the small step started beside both floods' batches")
	enqueue(light2, 1, 10)
	select {
	case got := <-f.entered:
		t.Fatalf("%v started while every batch and the express batch were running", got)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	var got []string
	for range 5 {
		got = append(got, <-f.done)
	}
	slices.Sort(got)
	require.Equal(t, []string{"A", "B", "C", "L", "L2"}, got)
}

// TestPiecesInterleaveWithOtherWork: with one batch at a time, a big task's pieces
// alternate with another workspace's steps instead of running back to back.
func TestPiecesInterleaveWithOtherWork(t *testing.T) {
	f := &recordingRunner{done: make(chan string, 64), entered: make(chan []string, 64), gate: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(f.gate) }) }
	t.Cleanup(release)
	l, _ := newLane(t, f, 1000, 1)
	big, small := laneRun(l, "B", "big"), laneRun(l, "S", "small")
	enqueue(big, 1, 400, 400, 400)
	require.Equal(t, []string{"B#0"}, <-f.entered)
	enqueue(small, 1, 30)
	f.gate <- struct{}{} // B#0 returns: the next batch has S's step beside B's next piece
	require.ElementsMatch(t, []string{"B#1", "S#0"}, <-f.entered, "the small step joined the next batch, not the end of the big one")
	release()
	require.ElementsMatch(t, []string{"S", "B"}, []string{<-f.done, <-f.done})
}
