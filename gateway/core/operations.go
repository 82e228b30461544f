package core

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/loops-dev/loops/internal/lockorder"
	"github.com/loops-dev/loops/internal/money"
	"github.com/loops-dev/loops/internal/telemetry"
	"go.opentelemetry.io/otel/trace"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/resultcache"
	"github.com/loops-dev/loops/gateway/core/writebehind"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxWait caps how long WaitOperation holds a request (the tinker SDK times out at 45 s).
const maxWait = 30 * time.Second

// operation is an operation in memory. op is replaced, never mutated, once published, so a
// reader holding a snapshot needs no lock. A finished operation holds its small copy (see
// resultcache.Small); its large result, if any, lives in the result cache.
type operation struct {
	id        string // the record's id, which never changes
	workspace string
	mu        lockorder.Mutex[rankOperation]
	op        *loopsv1.Operation
	// finishing is set when the outcome is decided; it is published (op, done) only once
	// the persister has committed it.
	finishing bool
	// started is when its work started (setRunning), and service its own work's time (the
	// backend's time on it: setService; else started to done), for the fairness metrics.
	started time.Time
	service time.Duration
	// cancelled: its client cancelled it (CancelOperation); it ends CANCELLED, its result
	// dropped. fin orders the finished ones of a sampler (Completions): set when published.
	cancelled bool
	fin       int64
	// backendStart, backendEnd, batchItems and pieces are its backend work so far
	// (noteBackend), for its timeline.
	backendStart, backendEnd time.Time
	batchItems, pieces       int
	done                     chan struct{}
	// span is its OpenTelemetry span (otel.go), set before it is shared; nil with tracing off.
	span trace.Span
	// cost is what its metered usage cost so far (cost.go); keyID the API key that
	// created it (auth.KeyIDOf; "" when unknown), which its usage is kept under.
	cost  opCost
	keyID string
	// reserved is the estimated cost held against the workspace's budgets until it
	// finishes (budget.go); budgetKey is the API key it is also held against ("" for
	// none), set before it is shared.
	reserved  money.USD
	budgetKey string
}

func (o *operation) snapshot() *loopsv1.Operation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.op
}

// operations is the registry of live and recently finished operations, with the
// write-behind persister (package writebehind) and the cache of large results (package
// resultcache).
type operations struct {
	core    *Core
	persist *writebehind.Persister
	results *resultcache.Cache
	mu      lockorder.Mutex[rankOperations]
	byID    map[string]*operation
	// samplerDone lists each sampler's finished samples in memory, in the order they were
	// published (Completions); they leave with the operations (evictFinishedBefore).
	samplerDone map[string][]*operation
	// finSeq numbers published outcomes from a base that grows across restarts (the start
	// time), and published is closed and replaced at each one (waiters of Completions).
	finSeq    atomic.Int64
	published atomic.Pointer[chan struct{}]
}

// newOperations is called by New before it fails unfinished operations and recovers runs:
// it first commits to the store what the journal of the previous process holds (outcomes
// acknowledged but not committed when it died, package writebehind), then opens a new
// journal. From then on the core reads operation and run records through the persister
// (writebehind.ReadStore), so a read never misses a record that is written behind.
func newOperations(c *Core) *operations {
	p := writebehind.New(c.store, c.log)
	if err := p.Recover(context.Background(), c.opts.DataDir, !c.opts.PublishAfterCommit); err != nil {
		c.log.Error("replaying the journal failed; it is kept for the next start", slog.Any("err", err))
	}
	c.store = writebehind.NewReadStore(c.store, p)
	ops := &operations{
		core: c, byID: map[string]*operation{}, samplerDone: map[string][]*operation{},
		persist: p,
		results: resultcache.New(c.opts.ResultCacheBytes, c.opts.ResultCacheTTL, c.now),
	}
	ops.finSeq.Store(time.Now().UnixNano())
	ch := make(chan struct{})
	ops.published.Store(&ch)
	return ops
}

// create registers a pending operation and queues its record for the store. It never
// waits for the store (it runs under a run's or a sampler's lock): a crash before the
// record is committed loses an operation the store never knew of, which a client asking
// for it after the restart is told (see lookup).
func (ops *operations) create(ctx context.Context, ws string, kind loopsv1.OperationKind, runID, samplerID string, seq int64) (*operation, error) {
	op := &loopsv1.Operation{
		Id:            newID("op"),
		Kind:          kind,
		State:         loopsv1.OperationState_OPERATION_STATE_PENDING,
		TrainingRunId: runID,
		SamplerId:     samplerID,
		SeqId:         seq,
		CreateTime:    timestamppb.New(ops.core.now()),
	}
	if err := ops.core.policy.StartOp(ws, op.Id, kind); err != nil { // the workspace's max_queued_operations
		return nil, err
	}
	estimate, priced := estimateOf(ctx) // the workspace's and the API key's budgets (budget.go)
	var budgetKey string
	if priced {
		var err error
		if budgetKey, err = ops.core.reserveBudget(ctx, ws, estimate); err != nil {
			ops.core.policy.EndOp(op.Id)
			return nil, err
		}
	}
	if err := ops.persist.Create(ws, op); err != nil {
		ops.core.releaseBudget(ws, budgetKey, estimate)
		ops.core.policy.EndOp(op.Id)
		if errors.Is(err, writebehind.ErrStopped) {
			err = errShuttingDown()
		}
		return nil, err
	}
	o := &operation{id: op.Id, workspace: ws, op: op, done: make(chan struct{}), keyID: auth.CallerOf(ctx).KeyID, reserved: estimate, budgetKey: budgetKey}
	ops.core.startOpSpan(ctx, o)
	ops.mu.Lock()
	ops.byID[op.Id] = o
	ops.mu.Unlock()
	ops.core.metrics.opsCreated.WithLabelValues(kindLabel(kind)).Inc()
	return o, nil
}

// setRunning marks an operation as started.
func (ops *operations) setRunning(o *operation) {
	o.mu.Lock()
	if o.op.State != loopsv1.OperationState_OPERATION_STATE_PENDING || o.finishing {
		o.mu.Unlock()
		return
	}
	next := proto.CloneOf(o.op)
	next.State = loopsv1.OperationState_OPERATION_STATE_RUNNING
	o.op = next
	o.started = ops.core.now()
	started := o.started
	o.mu.Unlock()
	o.traceQueued(next.GetCreateTime().AsTime(), started)
}

// noteBackend records a backend call that did (part of) o's work, from start to end, in a
// batch of items items (0: not a batch), for its timeline.
func (ops *operations) noteBackend(o *operation, start, end time.Time, items int) {
	o.mu.Lock()
	if o.backendStart.IsZero() {
		o.backendStart = start
	}
	o.backendEnd = end
	o.batchItems = items
	o.pieces++
	o.mu.Unlock()
}

// setService records the backend's time on an operation's work (its service time).
func (ops *operations) setService(o *operation, d time.Duration) {
	o.mu.Lock()
	o.service = d
	o.mu.Unlock()
}

// finish decides an operation's outcome and hands it to the persister; the outcome is
// published (waiters woken, GetOperation answers it, the large result enters the cache)
// once the persister has committed it, so a result a client has seen is never lost by a
// crash. finish itself never waits for the store: the lane moves on to its next batch.
// set fills in the result on a succeeded operation; err != nil fails it.
func (ops *operations) finish(o *operation, set func(*loopsv1.Operation), err error) {
	o.mu.Lock()
	if o.finishing || isDone(o.op) {
		o.mu.Unlock()
		return
	}
	o.finishing = true
	reserved := o.reserved
	o.reserved = 0
	next := proto.CloneOf(o.op)
	started, service, cancelled := o.started, o.service, o.cancelled
	next.Timeline = o.timelineLocked()
	next.Cost = o.costProtoLocked()
	o.mu.Unlock()
	ops.core.releaseBudget(o.workspace, o.budgetKey, reserved) // its exact cost is metered by now
	now := ops.core.now()
	next.DoneTime = timestamppb.New(now)
	if cancelled {
		set, err = nil, cancelError(err)
	}
	var errID string
	if err == nil && !started.IsZero() {
		if service <= 0 {
			service = now.Sub(started)
		}
		created := next.GetCreateTime().AsTime()
		ops.core.fair.Observe(o.spanCtx(context.Background()), o.workspace, kindLabel(next.Kind), started.Sub(created), now.Sub(created), service)
	}
	switch {
	case cancelled:
		next.State = loopsv1.OperationState_OPERATION_STATE_CANCELLED
		next.Error, _ = operationError(err)
	case err != nil:
		next.State = loopsv1.OperationState_OPERATION_STATE_FAILED
		// Backend errors may name the server's folders; clients see store-relative paths.
		next.Error, errID = operationError(ops.core.ckpt.Scrub(err))
		if next.Error.Category == loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER {
			ops.core.log.ErrorContext(o.spanCtx(context.Background()), "operation failed", slog.String("op", next.Id), slog.String("kind", kindLabel(next.Kind)),
				slog.String("error_id", errID), slog.Any("err", err))
		}
	default:
		next.State = loopsv1.OperationState_OPERATION_STATE_SUCCEEDED
		if set != nil {
			set(next)
		}
	}
	ops.core.policy.EndOp(next.Id)
	small := resultcache.Small(next)
	ops.persist.Finish(o.workspace, small, func() {
		published := timestamppb.New(ops.core.now())
		if small != next { // the persister holds small, not next
			next.Timeline.PersistTime = published
		}
		if small != next && !ops.results.Put(next) {
			ops.core.log.Warn("a result larger than the whole result cache is not kept", slog.String("op", next.Id),
				slog.Int64("result_cache_bytes", ops.results.MaxBytes()))
		}
		// The persister holds small: memory gets a copy with the time it was published.
		pub := proto.CloneOf(small)
		if pub.Timeline == nil {
			pub.Timeline = &loopsv1.OperationTimeline{}
		}
		pub.Timeline.PersistTime = published
		o.mu.Lock()
		o.op = pub
		o.fin = ops.finSeq.Add(1)
		o.mu.Unlock()
		close(o.done)
		if small.GetKind() == loopsv1.OperationKind_OPERATION_KIND_SAMPLE && small.GetSamplerId() != "" {
			ops.mu.Lock()
			ops.samplerDone[small.GetSamplerId()] = append(ops.samplerDone[small.GetSamplerId()], o)
			ops.mu.Unlock()
		}
		wake := make(chan struct{})
		close(*ops.published.Swap(&wake))
		ops.core.metrics.opsFinished.WithLabelValues(kindLabel(next.Kind), stateLabel(next.State)).Inc()
		o.traceFinished(next, errID, published.AsTime())
		telemetry.Observe(o.spanCtx(context.Background()), ops.core.metrics.opDuration.WithLabelValues(kindLabel(next.Kind)),
			next.DoneTime.AsTime().Sub(next.CreateTime.AsTime()).Seconds())
	})
}

// timelineLocked is o's timeline so far (o.mu held).
func (o *operation) timelineLocked() *loopsv1.OperationTimeline {
	tl := proto.CloneOf(o.op.GetTimeline())
	if tl == nil {
		tl = &loopsv1.OperationTimeline{}
	}
	if !o.started.IsZero() {
		tl.StartTime = timestamppb.New(o.started)
	}
	if !o.backendStart.IsZero() {
		tl.BackendStartTime = timestamppb.New(o.backendStart)
		tl.BackendEndTime = timestamppb.New(o.backendEnd)
		tl.BatchItems, tl.Pieces = int32(o.batchItems), int32(o.pieces)
	}
	return tl
}

// noteRetrieved records the first time a client read o's outcome, on its record too (a
// second write of the finished record, coalesced with the others by the persister).
func (ops *operations) noteRetrieved(o *operation) {
	o.mu.Lock()
	op := o.op
	if !isDone(op) || op.GetTimeline().GetRetrieveTime() != nil {
		o.mu.Unlock()
		return
	}
	next := proto.CloneOf(op)
	if next.Timeline == nil {
		next.Timeline = &loopsv1.OperationTimeline{}
	}
	next.Timeline.RetrieveTime = timestamppb.New(ops.core.now())
	o.op = next
	o.mu.Unlock()
	ops.persist.Finish(o.workspace, next, func() {})
}

// view returns what a client asking for the operation gets: the operation with its full
// result, or RESULT_EXPIRED when its large result is no longer kept; a pending one with
// where it waits and why (queueStatus).
func (ops *operations) view(o *operation) (*loopsv1.Operation, error) {
	op := o.snapshot()
	if !isDone(op) {
		if q := ops.core.queueStatus(o.workspace, op); q != nil {
			op = proto.CloneOf(op)
			op.Queue = q
		}
		return op, nil
	}
	return ops.full(op)
}

// current is o as it stands, for the answer to the request that created it (or a retry of
// that request): the work may have finished before the answer is written, and memory then
// holds the small copy, so a finished operation's full result comes from the result cache
// (never a SUCCEEDED operation without its outputs). It takes only leaf locks, so it may be
// called under a run's or a sampler's lock, unlike view.
func (ops *operations) current(o *operation) (*loopsv1.Operation, error) {
	op := o.snapshot()
	if !isDone(op) {
		return op, nil
	}
	return ops.full(op)
}

// full is the finished op (the small copy memory and the store hold) with its large
// result from the result cache, or the result-expired error once the cache dropped it.
func (ops *operations) full(op *loopsv1.Operation) (*loopsv1.Operation, error) {
	if !resultcache.HasLarge(op) {
		return op, nil
	}
	if full, ok := ops.results.Get(op.GetId()); ok {
		return full, nil
	}
	return nil, ops.results.ErrExpired(op, kindName(op.GetKind()))
}

// lookup finds an operation of the workspace in memory, or a finished one in the store.
func (ops *operations) lookup(ctx context.Context, ws, id string) (*operation, error) {
	ops.mu.Lock()
	o, ok := ops.byID[id]
	ops.mu.Unlock()
	if ok {
		if o.workspace != ws {
			return nil, errUnknownOperation(id)
		}
		return o, nil
	}
	op, err := ops.core.store.GetOperation(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errUnknownOperation(id)
	}
	if err != nil {
		return nil, storeErr(err, "operation "+quote(id))
	}
	done := make(chan struct{})
	close(done) // an operation found only in the store is finished (unfinished ones were failed at start-up)
	return &operation{id: op.GetId(), workspace: ws, op: op, done: done}, nil
}

// errUnknownOperation answers an operation id that neither memory nor the store knows.
func errUnknownOperation(id string) error {
	return notFound("unknown operation %q: it does not exist, belongs to another API key's workspace, finished too long ago, or the server restarted before recording it; resubmit the request", id)
}

// finishedInMemory is how long a finished operation stays in memory. Its record (state,
// error, metrics) is in the store and its large result in the result cache, so a lookup
// after that is answered the same, from there; memory holds only the recent ones.
const finishedInMemory = time.Minute

// evictFinishedBefore drops finished operations from memory (they stay in the store) and
// large results past their time budget. An operation whose final record the store does not
// hold yet (a store far behind the journal, package writebehind) stays.
func (ops *operations) evictFinishedBefore(t time.Time) {
	ops.results.Sweep()
	ops.mu.Lock()
	defer ops.mu.Unlock()
	for id, o := range ops.byID {
		op := o.snapshot()
		if isDone(op) && op.DoneTime.AsTime().Before(t) && !ops.persist.Uncommitted(id) {
			delete(ops.byID, id)
		}
	}
	for sampler, done := range ops.samplerDone {
		// A new slice: Completions reads the old one without the lock.
		var kept []*operation
		for _, o := range done {
			if ops.byID[o.id] != nil {
				kept = append(kept, o)
			}
		}
		if len(kept) == 0 {
			delete(ops.samplerDone, sampler)
		} else {
			ops.samplerDone[sampler] = kept
		}
	}
}

// flush waits until the outcomes decided so far are committed and published (Drain).
func (ops *operations) flush(ctx context.Context) error { return ops.persist.Flush(ctx) }

// close writes the outcomes still queued and stops the persister (Core.Close).
func (ops *operations) close() { ops.persist.Close() }

func isDone(op *loopsv1.Operation) bool {
	switch op.State {
	case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, loopsv1.OperationState_OPERATION_STATE_FAILED, loopsv1.OperationState_OPERATION_STATE_CANCELLED:
		return true
	}
	return false
}

// OperationService implements loops.v1 OperationService.
type OperationService struct{ c *Core }

// GetOperation returns an operation's current state.
func (s OperationService) GetOperation(ctx context.Context, req *loopsv1.GetOperationRequest) (*loopsv1.Operation, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	o, err := s.c.ops.lookup(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	linkRetrieval(ctx, o)
	return s.c.ops.retrieve(o)
}

// WaitOperation waits until the operation is done or the timeout passes.
func (s OperationService) WaitOperation(ctx context.Context, req *loopsv1.WaitOperationRequest) (*loopsv1.Operation, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	o, err := s.c.ops.lookup(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	linkRetrieval(ctx, o)
	wait := maxWait
	if d := req.GetTimeout().AsDuration(); d > 0 && d < maxWait {
		wait = d
	}
	if req.GetTimeout() != nil && req.GetTimeout().AsDuration() < 0 {
		return nil, invalidArgument("timeout must not be negative")
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	s.c.metrics.waiters.Inc()
	defer s.c.metrics.waiters.Dec()
	select {
	case <-o.done:
	case <-t.C:
	case <-s.c.drain: // shutting down: answer now with the operation as it stands
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	return s.c.ops.retrieve(o)
}

// retrieve is view for a client reading the operation's outcome: the first read of a
// finished one is recorded on its timeline.
func (ops *operations) retrieve(o *operation) (*loopsv1.Operation, error) {
	op, err := ops.view(o)
	if err == nil && isDone(op) {
		ops.noteRetrieved(o)
	}
	return op, err
}

// EncodedResult returns an encoding (format names it: "json", "proto", …) of the result of
// operation id, made by encode once while the result is in the result cache and kept with
// it (compat encodes a result once per wire format, not on every poll). A result not in the
// cache is encoded by each call.
func (s OperationService) EncodedResult(id, format string, encode func() ([]byte, error)) ([]byte, error) {
	return s.c.ops.results.Encoded(id, format, encode)
}

func quote(s string) string { return "\"" + s + "\"" }
