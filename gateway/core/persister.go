package core

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// Write-behind persistence (docs/semantics.md, "Restart"). Operation records and training-run
// bookkeeping (last request time, last seq_id, the corrupted flag, last checkpoints) are not
// written by the goroutine that changes them: they are queued here and one goroutine commits
// everything queued so far in one store transaction (store.ApplyBatch), then the next group:
// a group commit whose batch is whatever arrived while the previous transaction ran. Nothing
// on the scheduler's path, and nothing under a run's or sampler's lock, waits for the store.
//
// Records are coalesced by id (an operation created and finished within one batch is written
// once, in its final state; a run touched by many steps is written once). An operation's
// outcome is published to its waiters only after the batch holding it has committed, so a
// client never sees an outcome that a crash then loses; everything queued before it (the
// run's bookkeeping of that step, say) is committed by then too, in the same or an earlier
// batch.

// maxPendingCreates is how many written-behind operation records may wait for the store
// before new operations are refused with ResourceExhausted (429, QUEUE_FULL): only a store
// far behind (stalled, or much slower than the backend) reaches it.
const maxPendingCreates = 4096

// A batch that fails is retried record by record, and what still fails is logged (and
// published: the server stays available when its store is broken, at the cost of
// durability). Writes run without a deadline (the store's own busy timeout bounds lock
// waits): a cancellable context would make the SQLite driver start a watcher goroutine per
// statement. A store that hangs stops the persister, and new operations are then refused
// once maxPendingCreates records wait.

type persister struct {
	st  store.Store
	log *slog.Logger

	mu      sync.Mutex
	cond    *sync.Cond
	ops     map[string]store.OwnedOperation
	runs    map[string]store.OwnedTrainingRun
	after   []func() // run once everything queued before them has committed
	closing bool
	stopped bool // the loop has taken its last batch
	crashed bool // tests: the process "died"; nothing more is written or published
	started bool // the goroutine starts with the first write
	done    chan struct{}

	// batches and records count commits (tests, logs).
	batches, records int
}

func newPersister(st store.Store, log *slog.Logger) *persister {
	p := &persister{st: st, log: log, ops: map[string]store.OwnedOperation{}, runs: map[string]store.OwnedTrainingRun{}, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// wakeLocked starts the goroutine on first use and wakes it.
func (p *persister) wakeLocked() {
	if !p.started {
		p.started = true
		go p.loop()
	}
	p.cond.Signal()
}

// errWriteQueueFull refuses a new operation while the store is far behind.
func errWriteQueueFull() error {
	return errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull,
		fmt.Errorf("the server's store is behind (%d operation records waiting to be written): retry later", maxPendingCreates))
}

// create queues a new operation's record. It never waits: it is called under a run's or a
// sampler's lock. When the queue is full it refuses with ResourceExhausted.
func (p *persister) create(ws string, op *loopsv1.Operation) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errShuttingDown()
	}
	if len(p.ops) >= maxPendingCreates {
		return errWriteQueueFull()
	}
	p.ops[op.GetId()] = store.OwnedOperation{Workspace: ws, Operation: op}
	p.wakeLocked()
	return nil
}

// finish queues an operation's final record and calls publish once it has committed (on
// the persister's goroutine; publish must not block). It never refuses and never waits.
func (p *persister) finish(ws string, op *loopsv1.Operation, publish func()) {
	p.mu.Lock()
	if p.crashed {
		p.mu.Unlock()
		return
	}
	if p.stopped {
		// After Close: write it here rather than lose it (shutdown, off every hot path).
		p.mu.Unlock()
		if err := p.st.PutOperation(context.Background(), ws, op); err != nil {
			p.log.Error("persisting operation outcome", slog.String("op", op.GetId()), slog.Any("err", err))
		}
		publish()
		return
	}
	p.ops[op.GetId()] = store.OwnedOperation{Workspace: ws, Operation: op}
	p.after = append(p.after, publish)
	p.wakeLocked()
	p.mu.Unlock()
}

// run queues a training run's record (its latest version wins).
func (p *persister) run(ws string, r *loopsv1.TrainingRun) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return // after Close: bookkeeping only (last request time), not worth a write
	}
	p.runs[r.GetId()] = store.OwnedTrainingRun{Workspace: ws, Run: r}
	p.wakeLocked()
}

func (p *persister) emptyLocked() bool {
	return len(p.ops) == 0 && len(p.runs) == 0 && len(p.after) == 0
}

// take waits for queued writes and takes all of them; stop is true when the persister is
// closing and nothing is left.
func (p *persister) take() (b store.Batch, after []func(), stop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.emptyLocked() && !p.closing {
		p.cond.Wait()
	}
	if p.crashed || (p.closing && p.emptyLocked()) {
		p.stopped = true
		return store.Batch{}, nil, true
	}
	for _, r := range p.runs {
		b.TrainingRuns = append(b.TrainingRuns, r)
	}
	for _, o := range p.ops {
		b.Operations = append(b.Operations, o)
	}
	after = p.after
	p.ops, p.runs, p.after = map[string]store.OwnedOperation{}, map[string]store.OwnedTrainingRun{}, nil
	return b, after, false
}

func (p *persister) loop() {
	defer close(p.done)
	for {
		b, after, stop := p.take()
		if stop {
			return
		}
		p.write(b)
		p.mu.Lock()
		crashed := p.crashed
		p.batches++
		p.records += b.Len()
		p.mu.Unlock()
		if crashed {
			return
		}
		for _, f := range after {
			f()
		}
	}
}

// write commits one batch, falling back to one record at a time if the batch fails.
func (p *persister) write(b store.Batch) {
	if b.Len() == 0 {
		return
	}
	ctx := context.Background()
	err := p.st.ApplyBatch(ctx, b)
	if err == nil {
		return
	}
	p.log.Error("persisting a batch failed; writing its records one by one", slog.Int("records", b.Len()), slog.Any("err", err))
	for _, r := range b.TrainingRuns {
		if err := p.st.PutTrainingRun(ctx, r.Workspace, r.Run); err != nil {
			p.log.Error("persisting training run", slog.String("run", r.Run.GetId()), slog.Any("err", err))
		}
	}
	for _, o := range b.Operations {
		if err := p.st.PutOperation(ctx, o.Workspace, o.Operation); err != nil {
			p.log.Error("persisting operation", slog.String("op", o.Operation.GetId()), slog.Any("err", err))
		}
	}
}

// flush waits until everything queued so far is committed and published (Drain: the work
// it failed is answered before long-polls are released).
func (p *persister) flush() {
	p.mu.Lock()
	if p.stopped || p.crashed || (!p.started && p.emptyLocked()) {
		p.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	p.after = append(p.after, func() { close(ch) })
	p.wakeLocked()
	p.mu.Unlock()
	<-ch
}

// close writes what is queued, publishes it and stops the goroutine.
func (p *persister) close() {
	p.mu.Lock()
	p.closing = true
	if !p.started {
		p.stopped = true
		p.mu.Unlock()
		return
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	<-p.done
}

// crash (tests) stops the persister as a process crash would: what is queued, and the
// outcomes of a batch being written, are never published, and nothing more is written.
func (p *persister) crash() {
	p.mu.Lock()
	p.crashed, p.closing = true, true
	p.ops, p.runs, p.after = map[string]store.OwnedOperation{}, map[string]store.OwnedTrainingRun{}, nil
	p.cond.Broadcast()
	p.mu.Unlock()
}
