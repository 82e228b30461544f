package core

import (
	"context"
	"errors"

	"github.com/loops-dev/loops/internal/lifecycle"
	"github.com/loops-dev/loops/internal/lockorder"
)

// The per-model scheduler. A lane executes the ready work of every run on one base model:
// each round it takes the head task of each ready run (a run is ready when its sequencer
// has the next seq_id and nothing of it runs), gets it an adapter slot, and sends the
// forward/backward heads of several runs to the backend in batches of at most
// maxBatchTokens, shared fairly between workspaces (fair.go). A run's other tasks (create,
// save, load, optim_step, unload) are barriers for that run only: each runs on its own
// goroutine beside the batches, and the run becomes ready again when it is done.
//
// A run whose adapter must first be restored from host memory or disk, or whose admission
// needs another run's adapter offloaded (slots.go), does that on a goroutine of its own too:
// the lane never waits for a backend call other than its forward/backward batch.
//
// The lane knows nothing of operations, stores or backends: what runs a task is a
// taskRunner, and what holds the backend's adapter slots a slotKeeper; the core provides
// both (coreRunner, slots).

// taskRunner runs the work a lane schedules. Each of run, forwardBackward and fail
// finishes the task's operation and then releases the run (run.taskDone).
type taskRunner interface {
	// prepare readies run r to execute its head task t (marks the operation running and
	// recreates a lost adapter). An error fails t.
	prepare(ctx context.Context, r *run, t *task) error
	// run executes a task that is not batched.
	run(ctx context.Context, r *run, t *task)
	// forwardBackward sends forward/backward tasks of several runs to the backend in one call.
	forwardBackward(ctx context.Context, batch []runTask)
	// fail ends task t (nil: none was taken) of run r with err.
	fail(r *run, t *task, err error)
	// resume releases run r after its adapter was moved (slotKeeper.move) or rebuilt,
	// keeping the slot's pin for its head task.
	resume(r *run)
	// rebuild restores run r's adapter after its replica was lost (recovery.go). Backend
	// calls: the lane runs it on a goroutine of its own while r is held busy.
	rebuild(ctx context.Context, r *run) error
}

// slotKeeper keeps the backend's adapters within its slots (slots.go).
type slotKeeper interface {
	// admit makes r's adapter resident and pins it; errNoSlot when every slot is pinned.
	admit(ctx context.Context, r *run) error
	// park makes r ready again once a slot frees (after admit answered errNoSlot).
	park(r *run)
	// move restores r's adapter, or offloads another to make room (after admit answered
	// errMoveNeeded), and reserves a pin for r's next admit. Backend and file I/O: the lane
	// calls it on a goroutine of its own.
	move(ctx context.Context, r *run) error
	// keep reserves the pin admit just took for r's next admit (r's head did not run).
	keep(r *run)
}

// runTask is a run's head task, taken for execution.
type runTask struct {
	r *run
	t *task
}

// lane is the scheduler of one base model. Its loop and every goroutine it starts belong to
// the core's lifecycle owner (life): they run with its context and none starts after it
// quiesces.
type lane struct {
	model          string
	life           *lifecycle.Stopper
	runner         taskRunner
	slots          slotKeeper
	running        *busy // counts rounds and tasks in progress (shutdown.go)
	maxBatchTokens int

	mu    lockorder.Mutex[rankLane]
	ready []*run
	wake  chan struct{}
	// deficit is each workspace's unused token credit (fair.go); only workspaces with
	// deferred work have an entry. Used by the lane's goroutine only.
	deficit map[string]int
}

// newLane starts the scheduler of one base model; it fails once life quiesces.
func newLane(life *lifecycle.Stopper, model string, runner taskRunner, slots slotKeeper, running *busy, maxBatchTokens int) (*lane, error) {
	l := &lane{
		model: model, life: life, runner: runner, slots: slots, running: running, maxBatchTokens: maxBatchTokens,
		wake: make(chan struct{}, 1), deficit: map[string]int{},
	}
	if err := life.Go("lane "+model, l.loop); err != nil {
		return nil, err
	}
	return l, nil
}

// laneFor returns the lane of a base model, starting it on first use; it fails with
// Unavailable once the core is shutting down.
func (c *Core) laneFor(model string) (*lane, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.lanes[model]; ok {
		return l, nil
	}
	l, err := newLane(c.life, model, coreRunner{c}, c.slots, c.running, c.opts.MaxBatchTokens)
	if err != nil {
		return nil, errShuttingDown()
	}
	c.lanes[model] = l
	return l, nil
}

// markReady adds a run whose head task can run to the ready list.
func (l *lane) markReady(r *run) {
	l.mu.Lock()
	l.ready = append(l.ready, r)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// loop runs rounds until the lifecycle owner stops.
func (l *lane) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		for {
			l.mu.Lock()
			rs := l.ready
			l.ready = nil
			l.mu.Unlock()
			if len(rs) == 0 {
				break
			}
			l.round(ctx, rs)
		}
	}
}

// spawn runs f for run r on a goroutine of the lifecycle owner, counted as work in
// progress; once the owner quiesces it runs nothing and returns false.
func (l *lane) spawn(name string, f func(ctx context.Context)) bool {
	l.running.add()
	err := l.life.Go(name, func(ctx context.Context) {
		defer l.running.done()
		f(ctx)
	})
	if err != nil {
		l.running.done()
		return false
	}
	return true
}

// round executes one head task of each ready run.
func (l *lane) round(ctx context.Context, rs []*run) {
	l.running.add()
	defer l.running.done()
	rs, later := l.fairShare(rs)
	l.requeue(later)
	var fbs, others []runTask
	for _, r := range rs {
		if err := l.slots.admit(ctx, r); errors.Is(err, errNoSlot) {
			// Every slot is pinned: the run waits, and is made ready when one frees.
			r.Unqueue()
			l.slots.park(r)
			continue
		} else if errors.Is(err, errMoveNeeded) {
			// Its adapter moves on a goroutine of its own (the run held busy, so an unload
			// waits for it), then the run is ready again, its slot pinned.
			r.Hold()
			if !l.spawn("adapter move", func(ctx context.Context) {
				if err := l.slots.move(ctx, r); err != nil && !errors.Is(err, errNoSlot) {
					l.runner.fail(r, r.TakeHead(), err)
					return
				}
				l.runner.resume(r) // errNoSlot: the next round parks it
			}) {
				l.runner.fail(r, r.TakeHead(), errShuttingDown())
			}
			continue
		} else if err != nil {
			l.runner.fail(r, r.TakeHead(), err)
			continue
		}
		if r.Lost() {
			// Its replica was lost: the adapter is rebuilt on a goroutine of its own (the
			// run held busy, its pin kept for the task that runs again), then it is ready.
			r.Hold()
			if !l.spawn("adapter rebuild", func(ctx context.Context) {
				if err := l.runner.rebuild(ctx, r); err != nil {
					l.runner.fail(r, r.TakeHead(), err)
					return
				}
				l.slots.keep(r)
				l.runner.resume(r)
			}) {
				l.runner.fail(r, r.TakeHead(), errShuttingDown())
			}
			continue
		}
		t := r.TakeHead()
		if t == nil {
			l.runner.fail(r, nil, nil)
			continue
		}
		if err := l.runner.prepare(ctx, r, t); err != nil {
			l.runner.fail(r, t, err)
			continue
		}
		if t.FB != nil {
			fbs = append(fbs, runTask{r, t})
		} else {
			others = append(others, runTask{r, t})
		}
	}
	for _, rt := range others {
		if !l.spawn("task", func(ctx context.Context) { l.runner.run(ctx, rt.r, rt.t) }) {
			l.runner.fail(rt.r, rt.t, errShuttingDown())
		}
	}
	for len(fbs) > 0 {
		n, tokens := 0, 0
		for n < len(fbs) && (n == 0 || tokens+fbs[n].t.Tokens <= l.maxBatchTokens) {
			tokens += fbs[n].t.Tokens
			n++
		}
		l.runner.forwardBackward(ctx, fbs[:n])
		fbs = fbs[n:]
	}
}
