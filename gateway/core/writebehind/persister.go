package writebehind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/lockorder"
)

// maxPendingCreates is how many written-behind operation records may wait for the store
// (queued, or journaled and not yet committed) before new operations are refused with
// ResourceExhausted (429, QUEUE_FULL): only a store far behind (stalled, or much slower than
// the backend) reaches it.
const maxPendingCreates = 4096

// A store batch that fails is retried record by record, and what still fails is logged
// (the server stays available when its store is broken; the journal files are then kept,
// and replayed at the next start). Writes run without a deadline (the store's own busy
// timeout bounds lock waits): a cancellable context would make the SQLite driver start a
// watcher goroutine per statement. A store that hangs stops the committing goroutine, and
// new operations are then refused once maxPendingCreates records wait.

// The committing goroutine coalesces: once a record is journaled it waits up to
// commitDelay, or until commitMaxRecords records are waiting, and commits them all in one
// store transaction. Nothing waits for it (outcomes are published once journaled), and reads
// see the records it holds (ReadStore), so the delay is not observable; it makes a
// transaction per tens of operations instead of one per operation.
const (
	commitDelay      = 50 * time.Millisecond
	commitMaxRecords = 1024
)

// journalRotateBytes is the journal file size after which the committing goroutine starts a
// new file, so that the old one can be removed once its records are committed.
const journalRotateBytes = 4 << 20

// Ranks of the persister's locks in the core's lock order (gateway/core/doc.go): after the
// workspace policy's (700), before a run's (1000, trainrun.Run.mu).

// rankJournal: Persister.jmu (the journal's order). Under it: the persister's lock.
type rankJournal struct{}

func (rankJournal) Rank() (int, string) { return 800, "writebehind.Persister.jmu" }

// rankPersister: Persister.mu (the records waiting to be written). Under it: a run's lock
// (the newest record of a changed run is taken when a group is written,
// RecordSource.TakeRecord).
type rankPersister struct{}

func (rankPersister) Rank() (int, string) { return 810, "writebehind.Persister.mu" }

// ErrStopped refuses a new operation once the persister has stopped: after Close, or once
// the store refused a write because another gateway leads now (store.ErrFenced).
var ErrStopped = errors.New("writebehind: the persister has stopped")

// Persister writes operation records, training-run records and step metrics behind the
// goroutines that change them (see the package doc). Its methods are safe for concurrent
// use; none of them waits for the store except Recover, Sync, Settle, Flush and Close (and
// Finish once Close has run).
type Persister struct {
	st  Writer
	log *slog.Logger

	mu   lockorder.Mutex[rankPersister]
	cond *sync.Cond
	ops  map[string]store.OwnedOperation
	// runs are the runs whose record changed: the newest record is taken when the group
	// is written (RecordSource.TakeRecord), so a run's versions are written in order
	// without anything being queued under the run's lock.
	runs    map[string]RecordSource
	metrics []store.OwnedStepMetrics
	// receipts are receipt steps, appended like metrics.
	receipts []store.OwnedReceiptStep
	after    []func() // run once everything queued before them is durable
	closing  bool
	stopped  bool // the loop has taken its last batch
	crashed  bool // the process "died" (Crash): nothing more is written or published
	started  bool // the goroutines start with the first write
	done     chan struct{}

	// jmu orders the journal: held while a group is appended and handed to the committer,
	// and while the committer takes what was handed to it (and rotates the file), so a
	// file never holds a record that the committer has not taken.
	jmu lockorder.Mutex[rankJournal]
	j   *journal // nil until Recover has run, or when the journal cannot be written
	// Journaled records waiting for the store, coalesced by id (under mu).
	jops      map[string]store.OwnedOperation
	jruns     map[string]store.OwnedTrainingRun
	jmetrics  []store.OwnedStepMetrics
	jreceipts []store.OwnedReceiptStep
	jcond     *sync.Cond
	jclosing  bool
	jdone     chan struct{}
	// The batch being committed (nil when none), for reads (ReadStore): by the committer
	// (cops, cruns) and by the loop itself when there is no journal (lops, lruns).
	cops  map[string]store.OwnedOperation
	cruns map[string]store.OwnedTrainingRun
	lops  map[string]store.OwnedOperation
	lruns map[string]store.OwnedTrainingRun
	// settlers counts callers waiting for the store to catch up (no coalescing delay then).
	settlers int
	// keepJournal: a store write failed, so journal files are no longer removed.
	keepJournal bool

	// beforeJournal (tests, BeforeJournal; under mu) is called with each group before it
	// is journaled.
	beforeJournal func(store.Batch)

	// batches and records count store commits (tests, logs).
	batches, records int
}

// RecordSource is a training run whose record the persister writes (a trainrun.Run). Its
// methods may take the source's own lock, which must come after the persister's in the
// lock order (TakeRecord is called under Persister.mu).
type RecordSource interface {
	// ID is the run's id.
	ID() string
	// Workspace is the workspace that owns the run.
	Workspace() string
	// Record is the newest record; TakeRecord also marks it written, and reports whether it
	// changed since it was last taken.
	Record() *loopsv1.TrainingRun
	TakeRecord() (*loopsv1.TrainingRun, bool)
}

// Writer is the store as a Persister writes to it: groups of records in one transaction
// (ApplyBatch) and, when a group fails, one record at a time.
type Writer interface {
	store.BatchWriter
	store.RunWriter
	// PutOperation inserts or replaces an operation (as store.OperationStore's).
	PutOperation(ctx context.Context, workspace string, op *loopsv1.Operation) error
}

// New returns a persister that writes to st. Its goroutines start with the first write;
// call Recover first to replay a journal a previous process left and open a new one, and
// Close to stop.
func New(st Writer, log *slog.Logger) *Persister {
	p := &Persister{
		st: st, log: log, done: make(chan struct{}), jdone: make(chan struct{}),
		ops: map[string]store.OwnedOperation{}, runs: map[string]RecordSource{},
		jops: map[string]store.OwnedOperation{}, jruns: map[string]store.OwnedTrainingRun{},
	}
	p.cond = sync.NewCond(&p.mu)
	p.jcond = sync.NewCond(&p.mu)
	return p
}

// Recover replays the journal files that a previous process left in dataDir into the store
// and opens a new journal there (the core calls it at start-up, before it fails unfinished
// operations). When the journal cannot be opened, outcomes wait for the store instead. A
// replay that fails leaves the files for the next start, and the new journal opens beside
// them; its error is returned (the persister works all the same). Without journal (the
// core's Options.PublishAfterCommit: a store shared with a standby gateway, which could not
// replay a journal on this host's disk) no journal is opened and every group is committed
// to the store before its outcomes are published.
func (p *Persister) Recover(ctx context.Context, dataDir string, journal bool) error {
	rerr := replayJournal(ctx, dataDir, p.st, p.log)
	if !journal {
		p.log.Info("no outcome journal: outcomes are published once committed to the store, which other gateways share")
		return rerr
	}
	j, err := openJournal(dataDir)
	if err != nil {
		p.log.Error("the journal cannot be written; outcomes are published once committed to the store", slog.Any("err", err))
		return rerr
	}
	p.jmu.Lock()
	p.j = j
	p.jmu.Unlock()
	return rerr
}

// wakeLocked starts the goroutines on first use and wakes the loop.
func (p *Persister) wakeLocked() {
	if !p.started {
		p.started = true
		go p.loop()
		go p.commitLoop()
	}
	p.cond.Signal()
}

// errWriteQueueFull refuses a new operation while the store is far behind.
func errWriteQueueFull() error {
	return errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull,
		fmt.Errorf("the server's store is behind (%d operation records waiting to be written): retry later", maxPendingCreates))
}

// Create queues a new operation's record. It never waits: it is called under a run's or a
// sampler's lock. When too many records wait for the store it refuses with
// ResourceExhausted (QUEUE_FULL); once the persister has stopped, with ErrStopped.
func (p *Persister) Create(ws string, op *loopsv1.Operation) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return ErrStopped
	}
	if len(p.ops)+len(p.jops) >= maxPendingCreates {
		return errWriteQueueFull()
	}
	p.ops[op.GetId()] = store.OwnedOperation{Workspace: ws, Operation: op}
	p.wakeLocked()
	return nil
}

// Finish queues an operation's final record and calls publish once it is durable (on the
// persister's goroutine; publish must not block). It never refuses and never waits.
func (p *Persister) Finish(ws string, op *loopsv1.Operation, publish func()) {
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

// RunChanged queues a training run whose record changed: its newest record is written with the
// next group. Call it after the change, never under the run's lock.
func (p *Persister) RunChanged(r RecordSource) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return // after Close: bookkeeping only (last request time), not worth a write
	}
	p.runs[r.ID()] = r
	p.wakeLocked()
}

// StepMetrics queues a step metrics record of a run. Like RunChanged, it never waits; after
// Close it is dropped.
func (p *Persister) StepMetrics(ws, runID string, m *loopsv1.StepMetrics) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.metrics = append(p.metrics, store.OwnedStepMetrics{Workspace: ws, RunID: runID, Metrics: m})
	p.wakeLocked()
}

// ReceiptStep queues a receipt step of a run (its training_run_id names the run). Like
// StepMetrics, it never waits; after Close it is dropped.
func (p *Persister) ReceiptStep(ws string, m *loopsv1.ReceiptStep) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.receipts = append(p.receipts, store.OwnedReceiptStep{Workspace: ws, Step: m})
	p.wakeLocked()
}

func (p *Persister) emptyLocked() bool {
	return len(p.ops) == 0 && len(p.runs) == 0 && len(p.metrics) == 0 && len(p.receipts) == 0 && len(p.after) == 0
}

// take waits for queued writes and takes all of them; stop is true when the persister is
// closing and nothing is left.
func (p *Persister) take() (b store.Batch, after []func(), stop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.emptyLocked() && !p.closing {
		p.cond.Wait()
	}
	if p.crashed || (p.closing && p.emptyLocked()) {
		p.stopped = true
		return store.Batch{}, nil, true
	}
	b = batchOf(takeRecords(p.runs), p.ops, p.metrics)
	b.ReceiptSteps = p.receipts
	after = p.after
	p.ops, p.runs, p.metrics, p.receipts, p.after = map[string]store.OwnedOperation{}, map[string]RecordSource{}, nil, nil, nil
	return b, after, false
}

// takeRecords takes the newest record of each changed run (the run's lock comes after the
// persister's in the lock order).
func takeRecords(srcs map[string]RecordSource) map[string]store.OwnedTrainingRun {
	runs := make(map[string]store.OwnedTrainingRun, len(srcs))
	for id, src := range srcs {
		if rec, changed := src.TakeRecord(); changed {
			runs[id] = store.OwnedTrainingRun{Workspace: src.Workspace(), Run: rec}
		}
	}
	return runs
}

func batchOf(runs map[string]store.OwnedTrainingRun, ops map[string]store.OwnedOperation, metrics []store.OwnedStepMetrics) store.Batch {
	b := store.Batch{StepMetrics: metrics}
	for _, r := range runs {
		b.TrainingRuns = append(b.TrainingRuns, r)
	}
	for _, o := range ops {
		b.Operations = append(b.Operations, o)
	}
	return b
}

// loop makes each group durable, in the journal (or, without one, in the store), and then
// publishes its outcomes.
func (p *Persister) loop() {
	defer close(p.done)
	for {
		b, after, stop := p.take()
		if stop {
			return
		}
		if !p.journal(b) {
			p.commitInLoop(b)
		}
		p.mu.Lock()
		crashed := p.crashed
		p.mu.Unlock()
		if crashed {
			return
		}
		for _, f := range after {
			f()
		}
	}
}

// commitInLoop commits a group that is not journaled before its outcomes are published;
// reads see its records meanwhile (ReadStore).
func (p *Persister) commitInLoop(b store.Batch) {
	if b.Len() == 0 {
		return
	}
	ops, runs := make(map[string]store.OwnedOperation, len(b.Operations)), make(map[string]store.OwnedTrainingRun, len(b.TrainingRuns))
	for _, o := range b.Operations {
		ops[o.Operation.GetId()] = o
	}
	for _, r := range b.TrainingRuns {
		runs[r.Run.GetId()] = r
	}
	p.mu.Lock()
	p.lops, p.lruns = ops, runs
	p.mu.Unlock()
	p.commit(b)
	p.mu.Lock()
	p.lops, p.lruns = nil, nil
	p.mu.Unlock()
}

// journal appends a group to the journal and hands it to the committer; false when there is
// no journal or it could not be written (the caller commits the group to the store itself).
func (p *Persister) journal(b store.Batch) bool {
	if b.Len() == 0 {
		return true
	}
	p.mu.Lock()
	hook := p.beforeJournal
	p.mu.Unlock()
	if hook != nil {
		hook(b)
	}
	p.jmu.Lock()
	defer p.jmu.Unlock()
	if p.j == nil {
		return false
	}
	p.mu.Lock()
	crashed := p.crashed
	p.mu.Unlock()
	if crashed {
		return true // the process is "dead": nothing is written (loop publishes nothing)
	}
	if err := p.j.append(b); err != nil {
		p.log.Error("appending to the journal failed; committing to the store before publishing", slog.Any("err", err))
		return false
	}
	p.mu.Lock()
	wasEmpty := p.jemptyLocked()
	for _, r := range b.TrainingRuns {
		p.jruns[r.Run.GetId()] = r
	}
	for _, o := range b.Operations {
		p.jops[o.Operation.GetId()] = o
	}
	p.jmetrics = append(p.jmetrics, b.StepMetrics...)
	p.jreceipts = append(p.jreceipts, b.ReceiptSteps...)
	if wasEmpty || p.jlenLocked() >= commitMaxRecords {
		p.jcond.Broadcast()
	}
	p.mu.Unlock()
	return true
}

// jemptyLocked reports whether no journaled record waits for the store.
func (p *Persister) jemptyLocked() bool {
	return len(p.jops) == 0 && len(p.jruns) == 0 && len(p.jmetrics) == 0 && len(p.jreceipts) == 0
}

// jlenLocked is how many journaled records wait for the store.
func (p *Persister) jlenLocked() int {
	return len(p.jops) + len(p.jruns) + len(p.jmetrics) + len(p.jreceipts)
}

// commitLoop commits journaled records to the store, whatever has been journaled since its
// previous commit (coalesced for up to commitDelay) in one batch, and removes journal files
// whose records are all committed.
func (p *Persister) commitLoop() {
	defer close(p.jdone)
	for {
		p.mu.Lock()
		for p.jemptyLocked() && !p.jclosing && !p.crashed {
			p.jcond.Wait()
		}
		if !p.jclosing && !p.crashed && p.settlers == 0 && p.jlenLocked() < commitMaxRecords {
			deadline := time.Now().Add(commitDelay)
			t := time.AfterFunc(commitDelay, func() {
				p.mu.Lock()
				p.jcond.Broadcast()
				p.mu.Unlock()
			})
			for !p.jclosing && !p.crashed && p.settlers == 0 && p.jlenLocked() < commitMaxRecords && time.Now().Before(deadline) {
				p.jcond.Wait()
			}
			t.Stop()
		}
		if p.crashed || p.jemptyLocked() {
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()

		p.jmu.Lock()
		p.mu.Lock()
		p.cops, p.cruns = p.jops, p.jruns
		b := batchOf(p.cruns, p.cops, p.jmetrics)
		b.ReceiptSteps = p.jreceipts
		p.jops, p.jruns, p.jmetrics, p.jreceipts = map[string]store.OwnedOperation{}, map[string]store.OwnedTrainingRun{}, nil, nil
		p.mu.Unlock()
		// Every record in the file being appended to is in b or committed before: when the
		// file is large, the next records go to a new one and this one goes once b commits.
		var full string
		if p.j != nil && p.j.size >= journalRotateBytes {
			var err error
			if full, err = p.j.rotate(); err != nil {
				p.log.Error("starting a new journal file", slog.Any("err", err))
			}
		}
		p.jmu.Unlock()

		ok := p.commit(b)
		p.mu.Lock()
		if !ok {
			p.keepJournal = true
		}
		p.cops, p.cruns = nil, nil
		keep, crashed := p.keepJournal, p.crashed
		p.jcond.Broadcast()
		p.mu.Unlock()
		if crashed {
			return
		}
		if full != "" && !keep {
			if err := os.Remove(full); err != nil {
				p.log.Error("removing a committed journal file", slog.String("file", full), slog.Any("err", err))
			}
		}
	}
}

// commit writes one batch to the store, falling back to one record at a time if the batch
// fails; ok is false when a record could not be written.
func (p *Persister) commit(b store.Batch) (ok bool) {
	if b.Len() == 0 {
		return true
	}
	defer func() {
		p.mu.Lock()
		p.batches++
		p.records += b.Len()
		p.mu.Unlock()
	}()
	ctx := context.Background()
	err := p.st.ApplyBatch(ctx, b)
	if err == nil {
		return true
	}
	if p.leaseLost(err) {
		return false
	}
	p.log.Error("persisting a batch failed; writing its records one by one", slog.Int("records", b.Len()), slog.Any("err", err))
	ok = true
	for _, r := range b.TrainingRuns {
		if err := p.st.PutTrainingRun(ctx, r.Workspace, r.Run); err != nil {
			if p.leaseLost(err) {
				return false
			}
			p.log.Error("persisting training run", slog.String("run", r.Run.GetId()), slog.Any("err", err))
			ok = false
		}
	}
	for _, o := range b.Operations {
		if err := p.st.PutOperation(ctx, o.Workspace, o.Operation); err != nil {
			if p.leaseLost(err) {
				return false
			}
			p.log.Error("persisting operation", slog.String("op", o.Operation.GetId()), slog.Any("err", err))
			ok = false
		}
	}
	for _, m := range b.StepMetrics {
		if err := p.st.ApplyBatch(ctx, store.Batch{StepMetrics: []store.OwnedStepMetrics{m}}); err != nil {
			if p.leaseLost(err) {
				return false
			}
			p.log.Error("persisting step metrics", slog.String("run", m.RunID), slog.Int64("seq_id", m.Metrics.GetSeqId()), slog.Any("err", err))
			ok = false
		}
	}
	for _, m := range b.ReceiptSteps {
		if err := p.st.ApplyBatch(ctx, store.Batch{ReceiptSteps: []store.OwnedReceiptStep{m}}); err != nil {
			if p.leaseLost(err) {
				return false
			}
			p.log.Error("persisting receipt step", slog.String("run", m.Step.GetTrainingRunId()), slog.Int64("seq_id", m.Step.GetSeqId()), slog.Any("err", err))
			ok = false
		}
	}
	return ok
}

// leaseLost reports whether err is the store's refusal of a write because another gateway
// leads now (store.ErrFenced). Nothing more can be committed then: the persister stops as
// a crashed process would (Crash), publishing nothing it had not committed, and the gateway
// steps down (the store told the lease).
func (p *Persister) leaseLost(err error) bool {
	if !errors.Is(err, store.ErrFenced) {
		return false
	}
	p.log.Error("the store refused a batch: another gateway leads now; nothing more is written or published", slog.Any("err", err))
	p.Crash()
	p.mu.Lock()
	p.stopped = true // new work is refused
	p.mu.Unlock()
	return true
}

// pendingOp returns the newest record of operation id that the store may not hold yet
// (queued, journaled or being committed).
func (p *Persister) pendingOp(id string) (store.OwnedOperation, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range []map[string]store.OwnedOperation{p.ops, p.jops, p.cops, p.lops} {
		if o, ok := m[id]; ok {
			return o, true
		}
	}
	return store.OwnedOperation{}, false
}

// pendingRun is pendingOp for a training run.
func (p *Persister) pendingRun(id string) (store.OwnedTrainingRun, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if src, ok := p.runs[id]; ok {
		return store.OwnedTrainingRun{Workspace: src.Workspace(), Run: src.Record()}, true
	}
	for _, m := range []map[string]store.OwnedTrainingRun{p.jruns, p.cruns, p.lruns} {
		if r, ok := m[id]; ok {
			return r, true
		}
	}
	return store.OwnedTrainingRun{}, false
}

// Uncommitted reports whether operation id has a record that the store may not hold yet:
// memory must keep it until then.
func (p *Persister) Uncommitted(id string) bool {
	_, ok := p.pendingOp(id)
	return ok
}

// Sync waits until the store holds every record queued so far (before a read that the
// records held here cannot answer: a list), or until ctx ends: a store that hangs then
// answers the read with ctx's error instead of holding it.
func (p *Persister) Sync(ctx context.Context) error {
	if err := p.Flush(ctx); err != nil {
		return err
	}
	return p.Settle(ctx)
}

// Settle waits until every record journaled so far is committed to the store, or until
// ctx ends.
func (p *Persister) Settle(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { // wake the wait below when ctx ends
		p.mu.Lock()
		p.jcond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settlers++
	defer func() { p.settlers-- }()
	p.jcond.Broadcast()
	for (!p.jemptyLocked() || p.cops != nil) && !p.crashed && p.started && !p.stoppedCommitting() {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.jcond.Wait()
	}
	return nil
}

// stoppedCommitting reports whether the committing goroutine has ended (after close or a
// crash). Called with mu held.
func (p *Persister) stoppedCommitting() bool {
	select {
	case <-p.jdone:
		return true
	default:
		return false
	}
}

// Flush waits until everything queued so far is durable and published (the core's Drain:
// the work it failed is answered before long-polls are released), or until ctx ends.
func (p *Persister) Flush(ctx context.Context) error {
	p.mu.Lock()
	if p.stopped || p.crashed || (!p.started && p.emptyLocked()) {
		p.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	p.after = append(p.after, func() { close(ch) })
	p.wakeLocked()
	p.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close makes what is queued durable, publishes it, commits everything to the store, stops
// the goroutines and removes the journal.
func (p *Persister) Close() {
	p.mu.Lock()
	p.closing = true
	if !p.started {
		p.stopped = true
		p.mu.Unlock()
		p.closeJournal()
		return
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	<-p.done
	p.mu.Lock()
	p.jclosing = true
	p.jcond.Broadcast()
	p.mu.Unlock()
	<-p.jdone
	p.closeJournal()
}

// closeJournal closes the journal and, when everything in it is committed, removes it.
func (p *Persister) closeJournal() {
	p.mu.Lock()
	keep := p.keepJournal || p.crashed
	p.mu.Unlock()
	p.jmu.Lock()
	defer p.jmu.Unlock()
	if p.j != nil {
		p.j.close(!keep)
		p.j = nil
	}
}

// Crash stops the persister as a process crash would (tests; and a lost lease, see
// leaseLost): what is queued, and the outcomes of a group being journaled, are never
// published, and nothing more is written (the journal stays as it is, for the next start
// to replay).
func (p *Persister) Crash() {
	p.mu.Lock()
	p.crashed, p.closing = true, true
	p.ops, p.runs, p.metrics, p.receipts, p.after = map[string]store.OwnedOperation{}, map[string]RecordSource{}, nil, nil, nil
	p.cond.Broadcast()
	p.jcond.Broadcast()
	p.mu.Unlock()
}

// BeforeJournal sets a hook (tests) that is called with each group before it is journaled;
// it may block, holding the group back as a slow disk would. nil removes it.
func (p *Persister) BeforeJournal(f func(store.Batch)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.beforeJournal = f
}
