package lane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/loops-dev/loops/gateway/core/trainrun"
	"github.com/loops-dev/loops/internal/lifecycle"
	"github.com/loops-dev/loops/internal/lockorder"
)

// RankLane places Lane.mu in the core's lock order (gateway/core/doc.go): nothing is taken
// under it.
type RankLane struct{}

// Rank places Lane.mu after the slot table's lock.
func (RankLane) Rank() (int, string) { return 550, "lane.Lane.mu" }

// ErrNoSlot means every adapter slot is pinned; the run waits for one (Slots.Park).
var ErrNoSlot = errors.New("no adapter slot is free")

// ErrMoveNeeded means the run's adapter must be restored, or another run's offloaded to
// make room, before it can run: backend calls the lane's loop must not wait for
// (Slots.Move, on a goroutine of its own).
var ErrMoveNeeded = errors.New("the run's adapter must be moved onto the backend first")

// Item is a forward/backward task of a run in a batch: its next piece (Task.Piece) runs.
type Item[O any] struct {
	Run  *trainrun.Run[O]
	Task *trainrun.Task[O]
}

// Runner runs the work a lane schedules. Run, ForwardBackward and Fail finish the task's
// operation and then release the run, except for a forward/backward task with pieces left.
type Runner[O any] interface {
	// Prepare readies run r to execute its head task t (marks the operation running and
	// recreates a lost adapter). An error fails t.
	Prepare(ctx context.Context, r *trainrun.Run[O], t *trainrun.Task[O]) error
	// Run executes a task that is not batched.
	Run(ctx context.Context, r *trainrun.Run[O], t *trainrun.Task[O])
	// ForwardBackward sends the next piece of each item's task to the backend in one call
	// and advances the tasks. more[i] is true when item i's task has pieces left (its run
	// stays busy and the lane runs its next piece later); otherwise the task is finished
	// and its run released.
	ForwardBackward(ctx context.Context, batch []Item[O]) (more []bool)
	// Fail ends task t (nil: none was taken) of run r with err.
	Fail(r *trainrun.Run[O], t *trainrun.Task[O], err error)
	// Resume releases run r after its adapter was moved or rebuilt, keeping the slot's pin
	// for its head task.
	Resume(r *trainrun.Run[O])
	// Rebuild restores run r's adapter after its replica was lost.
	Rebuild(ctx context.Context, r *trainrun.Run[O]) error
}

// Slots keeps the backend's adapters within its slots.
type Slots[O any] interface {
	// Admit makes r's adapter resident and pins it; ErrNoSlot when every slot is pinned,
	// ErrMoveNeeded when it must be moved first. No I/O.
	Admit(ctx context.Context, r *trainrun.Run[O]) error
	// Park makes r ready again once a slot frees (after Admit answered ErrNoSlot).
	Park(r *trainrun.Run[O])
	// Move restores r's adapter, or offloads another to make room, and reserves a pin for
	// r's next Admit. Backend and file I/O.
	Move(ctx context.Context, r *trainrun.Run[O]) error
	// Keep reserves the pin Admit just took for r's next Admit (r's head did not run).
	Keep(r *trainrun.Run[O])
}

// Counter counts work in progress (the core's shutdown waits for it).
type Counter interface {
	Add()
	Done()
}

// Config configures a lane.
type Config struct {
	// Model is the base model the lane schedules.
	Model string
	// MaxBatchTokens caps the tokens of one batch (a single larger piece runs alone).
	MaxBatchTokens int
	// Concurrency is how many batches run at once (default 2); a workspace has at most one.
	Concurrency int
	// ExpressTokens (0: none) sizes the express batch: one more batch, of at most this many
	// tokens, that runs beside the Concurrency batches for workspaces whose waiting pieces
	// are all this small, so that a workspace sending small steps is not held up by several
	// workspaces flooding the model (nor put in the same batch as a flood's big pieces).
	ExpressTokens int
	// Life owns the lane's goroutines; the lane stops when its context ends.
	Life *lifecycle.Stopper
	// Busy counts the lane's work in progress.
	Busy Counter
	// Draining reports a shutdown: a task part-way through its pieces then fails with
	// ErrStopping at its next piece.
	Draining func() bool
	// ErrStopping is the error of work the lane fails because the server is shutting down.
	ErrStopping error
}

// Lane is the scheduler of one base model.
type Lane[O any] struct {
	cfg    Config
	runner Runner[O]
	slots  Slots[O]
	plan   *Planner // the loop's goroutine only
	fast   *Planner // the express batch's (nil without one); the loop's goroutine only

	mu       lockorder.Mutex[RankLane]
	ready    []*trainrun.Run[O]
	cont     []Item[O]       // tasks with pieces left, waiting for their next batch
	busyWS   map[string]bool // workspaces with a batch in flight
	inflight int             // batches in flight (not counting the express batch)
	express  bool            // the express batch is in flight
	wake     chan struct{}
	// waits says why the runs the last plan put off wait (Wait); rebuilt every plan.
	waits map[*trainrun.Run[O]]Waiting
	// batchEWMA is the recent mean duration of a batch, in seconds (Wait's estimate), over
	// batches batches.
	batchEWMA float64
	batches   int
}

// Waiting says why a ready run's head waits in the lane.
type Waiting struct {
	// Capacity is true when it waits for the model's shared capacity (a free batch, its
	// share of the next one); false when it is next in line (or waits for its own
	// workspace's batch in flight).
	Capacity bool
	Reason   string
}

// New starts the scheduler of one base model; it fails once cfg.Life quiesces.
func New[O any](cfg Config, runner Runner[O], slots Slots[O]) (*Lane[O], error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2
	}
	if cfg.Draining == nil {
		cfg.Draining = func() bool { return false }
	}
	l := &Lane[O]{
		cfg: cfg, runner: runner, slots: slots, plan: NewPlanner(cfg.MaxBatchTokens),
		busyWS: map[string]bool{}, wake: make(chan struct{}, 1), waits: map[*trainrun.Run[O]]Waiting{},
	}
	if cfg.ExpressTokens > 0 {
		l.fast = NewPlanner(cfg.ExpressTokens)
	}
	if err := cfg.Life.Go("lane "+cfg.Model, l.loop); err != nil {
		return nil, err
	}
	return l, nil
}

// MarkReady adds a run whose head task can run to the ready list (trainrun.Config.Ready).
func (l *Lane[O]) MarkReady(r *trainrun.Run[O]) {
	l.mu.Lock()
	l.ready = append(l.ready, r)
	l.mu.Unlock()
	l.signal()
}

func (l *Lane[O]) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// loop plans until there is nothing it can start, then waits for a run to become ready or
// a batch to return; it ends when the lifecycle owner stops, failing the tasks part-way
// through their pieces.
func (l *Lane[O]) loop(ctx context.Context) {
	defer l.failContinuing()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		for l.step(ctx) {
		}
	}
}

// failContinuing fails the tasks waiting for their next piece (the server stops).
func (l *Lane[O]) failContinuing() {
	l.mu.Lock()
	cont := l.cont
	l.cont = nil
	l.mu.Unlock()
	for _, it := range cont {
		l.runner.Fail(it.Run, it.Task, l.cfg.ErrStopping)
	}
}

// spawn runs f on a goroutine of the lifecycle owner, counted as work in progress; once the
// owner quiesces it runs nothing and returns false.
func (l *Lane[O]) spawn(name string, f func(ctx context.Context)) bool {
	l.cfg.Busy.Add()
	err := l.cfg.Life.Go(name, func(ctx context.Context) {
		defer l.cfg.Busy.Done()
		f(ctx)
	})
	if err != nil {
		l.cfg.Busy.Done()
		return false
	}
	return true
}

// step plans once over the ready runs and the continuing tasks, starts what it decided and
// puts the rest back; it reports whether it started anything (then the loop plans again).
func (l *Lane[O]) step(ctx context.Context) bool {
	l.cfg.Busy.Add()
	defer l.cfg.Busy.Done()
	l.mu.Lock()
	ready, cont := l.ready, l.cont
	l.ready, l.cont = nil, nil
	busy := maps.Clone(l.busyWS)
	canBatch := l.inflight < l.cfg.Concurrency
	canExpress := l.fast != nil && !l.express
	l.mu.Unlock()
	if l.cfg.Draining() && len(cont) > 0 {
		for _, it := range cont {
			l.runner.Fail(it.Run, it.Task, l.cfg.ErrStopping)
		}
		cont = nil
	}
	if len(ready)+len(cont) == 0 {
		return false
	}
	cands := make([]Candidate, 0, len(ready)+len(cont))
	for _, r := range ready {
		h := r.PeekHead()
		cands = append(cands, Candidate{Workspace: r.Workspace(), FB: h.FB, Tokens: h.Tokens})
	}
	for _, it := range cont {
		cands = append(cands, Candidate{Workspace: it.Run.Workspace(), FB: true, Tokens: it.Task.Piece().Tokens})
	}
	d := l.plan.Plan(cands, busy, canBatch)
	var fast []int
	if canExpress {
		d, fast = l.fast.Express(cands, busy, d)
	}
	started := false
	for _, i := range d.Barriers {
		if l.startHead(ctx, ready[i], false) != nil {
			started = true
		}
	}
	take := func(idx []int) []Item[O] {
		var batch []Item[O]
		for _, i := range idx {
			if i >= len(ready) {
				batch = append(batch, cont[i-len(ready)])
				continue
			}
			if it := l.startHead(ctx, ready[i], true); it != nil {
				batch = append(batch, *it)
			}
		}
		return batch
	}
	batch, expressBatch := take(d.Batch), take(fast)
	var laterReady []*trainrun.Run[O]
	var laterCont []Item[O]
	waits := make(map[*trainrun.Run[O]]Waiting, len(d.Later))
	active := map[string]bool{}
	for _, c := range cands {
		active[c.Workspace] = true
	}
	for _, i := range d.Later {
		var r *trainrun.Run[O]
		if i < len(ready) {
			r = ready[i]
			laterReady = append(laterReady, r)
		} else {
			r = cont[i-len(ready)].Run
			laterCont = append(laterCont, cont[i-len(ready)])
		}
		switch ws := cands[i].Workspace; {
		case busy[ws]:
			waits[r] = Waiting{Reason: "its workspace's previous batch on " + l.cfg.Model + " is running; it goes in the next one"}
		case !canBatch:
			waits[r] = Waiting{Capacity: true, Reason: fmt.Sprintf("all %d batches of %s are running (other workspaces' work)", l.cfg.Concurrency, l.cfg.Model)}
		default:
			waits[r] = Waiting{Capacity: true, Reason: fmt.Sprintf("%s is shared with %d other workspaces: it waits for its share of the next batch", l.cfg.Model, len(active)-1)}
		}
	}
	l.mu.Lock()
	l.ready = append(laterReady, l.ready...)
	l.cont = append(laterCont, l.cont...)
	l.waits = waits
	l.mu.Unlock()
	if len(batch) > 0 {
		l.startBatch(batch, false)
		started = true
	}
	if len(expressBatch) > 0 {
		l.startBatch(expressBatch, true)
		started = true
	}
	return started
}

// startHead admits run r's head: a barrier is started at once on a goroutine of its own; a
// forward/backward task is taken and prepared for the batch (returned). A run whose adapter
// must first be moved or rebuilt, or that waits for a slot, is handled here and nil is
// returned; nil is returned too when the head was failed or started.
func (l *Lane[O]) startHead(ctx context.Context, r *trainrun.Run[O], fb bool) *Item[O] {
	if err := l.slots.Admit(ctx, r); errors.Is(err, ErrNoSlot) {
		// Every slot is pinned: the run waits, and is made ready when one frees.
		r.Unqueue()
		l.slots.Park(r)
		return nil
	} else if errors.Is(err, ErrMoveNeeded) {
		// Its adapter moves on a goroutine of its own (the run held busy, so an unload waits
		// for it), then the run is ready again, its slot pinned.
		r.Hold()
		if !l.spawn("adapter move", func(ctx context.Context) {
			if err := l.slots.Move(ctx, r); err != nil && !errors.Is(err, ErrNoSlot) {
				l.runner.Fail(r, r.TakeHead(), err)
				return
			}
			l.runner.Resume(r) // ErrNoSlot: the next plan parks it
		}) {
			l.runner.Fail(r, r.TakeHead(), l.cfg.ErrStopping)
		}
		return nil
	} else if err != nil {
		l.runner.Fail(r, r.TakeHead(), err)
		return nil
	}
	if r.Lost() {
		// Its replica was lost: the adapter is rebuilt on a goroutine of its own (the run
		// held busy, its pin kept for the task that runs again), then it is ready.
		r.Hold()
		if !l.spawn("adapter rebuild", func(ctx context.Context) {
			if err := l.runner.Rebuild(ctx, r); err != nil {
				l.runner.Fail(r, r.TakeHead(), err)
				return
			}
			l.slots.Keep(r)
			l.runner.Resume(r)
		}) {
			l.runner.Fail(r, r.TakeHead(), l.cfg.ErrStopping)
		}
		return nil
	}
	t := r.TakeHead()
	if t == nil {
		l.runner.Fail(r, nil, nil)
		return nil
	}
	if t.Next == 0 { // a task kept for a retry part-way through its pieces is prepared already
		if err := l.runner.Prepare(ctx, r, t); err != nil {
			l.runner.Fail(r, t, err)
			return nil
		}
	}
	if t.FB != nil && fb {
		return &Item[O]{Run: r, Task: t}
	}
	if !l.spawn("task", func(ctx context.Context) { l.runner.Run(ctx, r, t) }) {
		l.runner.Fail(r, t, l.cfg.ErrStopping)
	}
	return nil
}

// startBatch runs one batch on a goroutine of its own (the express batch when express);
// its workspaces are busy until it returns, then the tasks with pieces left wait for their
// next batch.
func (l *Lane[O]) startBatch(batch []Item[O], express bool) {
	l.mu.Lock()
	for _, it := range batch {
		l.busyWS[it.Run.Workspace()] = true
	}
	if express {
		l.express = true
	} else {
		l.inflight++
	}
	l.mu.Unlock()
	done := func(more []bool) {
		l.mu.Lock()
		for _, it := range batch {
			delete(l.busyWS, it.Run.Workspace())
		}
		if express {
			l.express = false
		} else {
			l.inflight--
		}
		for i, it := range batch {
			if i < len(more) && more[i] {
				l.cont = append(l.cont, it)
			}
		}
		l.mu.Unlock()
		l.signal()
	}
	if !l.spawn("batch", func(ctx context.Context) {
		start := time.Now()
		more := l.runner.ForwardBackward(ctx, batch)
		took := time.Since(start).Seconds()
		l.mu.Lock()
		if !express { // the express batch is not one the waiting work waits for (Wait's estimate)
			if l.batches++; l.batches == 1 {
				l.batchEWMA = took
			} else {
				l.batchEWMA = 0.8*l.batchEWMA + 0.2*took
			}
		}
		l.mu.Unlock()
		done(more)
	}) {
		for _, it := range batch {
			l.runner.Fail(it.Run, it.Task, l.cfg.ErrStopping)
		}
		done(nil)
	}
}

// Wait says why run r's head waits in the lane, and how long a batch takes lately (0:
// no batch ran yet). ok is false when the lane holds r nowhere (it is not ready).
func (l *Lane[O]) Wait(r *trainrun.Run[O]) (w Waiting, batch time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	batch = time.Duration(l.batchEWMA * float64(time.Second))
	if w, ok := l.waits[r]; ok {
		return w, batch, true
	}
	if slices.Contains(l.ready, r) || slices.ContainsFunc(l.cont, func(it Item[O]) bool { return it.Run == r }) {
		return Waiting{Reason: "ready: it goes in the next batch of " + l.cfg.Model}, batch, true
	}
	return Waiting{}, batch, false
}

// Pending reports the runs in the ready list and the tasks waiting for their next piece
// (tests, metrics).
func (l *Lane[O]) Pending() (ready, continuing int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ready), len(l.cont)
}
