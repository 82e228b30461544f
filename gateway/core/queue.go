package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// task is one unit of ordered work on a run. A task with a nil op is a consumed seq_id (its
// request was rejected) and is skipped. fb is set for forward/backward work, which the lane
// batches across runs; everything else runs through exec.
type task struct {
	seq    int64
	op     *operation
	fb     *backendv1.ForwardBackwardItem
	tokens int
	exec   func(ctx context.Context) (func(*loopsv1.Operation), error)
	// creates is true for the task that creates the run's adapter.
	creates bool
}

// resyncSeq as a run's next seq_id means "take the next request's seq_id as the start"
// (a run recovered after a restart).
const resyncSeq = -1

// MaxSeqID is the largest seq_id a client may send (2^62). The tinker SDK's sampling
// clients use large ones (a pickled sampling client starts near 2.6·10^17), so the range is
// wide; it stops short of int64's end, so "the next seq_id" can never overflow.
const MaxSeqID = 1 << 62

// checkSeqID range-checks a seq_id from the wire.
func checkSeqID(seq int64) error {
	if seq < 0 || seq > MaxSeqID {
		return invalidArgument("seq_id %d is out of range: use 0 to %d", seq, int64(MaxSeqID))
	}
	return nil
}

// seenSeq is what a run remembers of a used seq_id: the operation it created ("" for a
// request that was rejected) and the kind of request, so that a repeat of another kind is
// refused instead of silently answered with the first one's operation.
type seenSeq struct {
	op   string
	kind loopsv1.OperationKind
}

// kindName is an operation kind as clients name the call (forward_backward, optim_step, …).
func kindName(k loopsv1.OperationKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "OPERATION_KIND_"))
}

// run is a training run in memory: its ordered queue and whether its adapter is on the backend.
type run struct {
	c    *Core
	id   string
	ws   string
	lane *lane

	mu           sync.Mutex
	info         *loopsv1.TrainingRun
	nextSeq      int64
	maxSeen      int64
	pending      map[int64]*task
	seen         map[int64]seenSeq
	busy         bool
	queued       bool
	gapTimer     *time.Timer
	adapterReady bool
	unloaded     string // why the run takes no more work; "" while it does
	// freeWhenIdle: the run was unloaded while a task ran; taskDone frees the adapter.
	freeWhenIdle bool
	// adapterStale: a backend call on the adapter passed its deadline; the backend may
	// still hold (and change) it, so it is deleted before being recreated.
	adapterStale bool
}

func (c *Core) newRun(ws string, info *loopsv1.TrainingRun, nextSeq int64, adapterReady bool) *run {
	return &run{
		c: c, id: info.GetId(), ws: ws, lane: c.laneFor(info.GetBaseModel()),
		info: info, nextSeq: nextSeq, maxSeen: nextSeq - 1,
		pending: map[int64]*task{}, seen: map[int64]seenSeq{}, adapterReady: adapterReady,
	}
}

// snapshot returns the run's current record.
func (r *run) snapshot() *loopsv1.TrainingRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info
}

// update changes the run's record under its lock and queues it for the store (write-behind,
// persister.go: it never waits for the store; queued under the lock so versions keep order).
func (r *run) update(_ context.Context, f func(*loopsv1.TrainingRun)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := proto.CloneOf(r.info)
	f(next)
	r.info = next
	r.c.ops.persist.run(r.ws, next)
}

// submit places work of the given kind at seq (0: after everything submitted so far). mk
// validates the request and builds the task; a client error from mk consumes the seq_id so
// the run does not stall on it. A repeated seq_id of the same kind returns the operation of
// its first submission; one of another kind is refused.
func (r *run) submit(ctx context.Context, seq int64, kind loopsv1.OperationKind, mk func(seq int64) (*task, error)) (*loopsv1.Operation, error) {
	if err := checkSeqID(seq); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nextSeq == resyncSeq {
		r.nextSeq = max(seq, 1)
		r.maxSeen = r.nextSeq - 1
	}
	if seq == 0 {
		seq = max(r.maxSeen, r.nextSeq-1) + 1
		if seq > MaxSeqID {
			return nil, invalidArgument("training run %s has used every seq_id up to %d: start a new run from its last checkpoint", r.id, int64(MaxSeqID))
		}
	}
	if used, ok := r.seen[seq]; ok {
		if used.kind != kind {
			return nil, invalidArgument("seq_id %d of training run %s was already used by a %s request; this %s needs a seq_id of its own (the next one)", seq, r.id, kindName(used.kind), kindName(kind))
		}
		if used.op == "" {
			return nil, invalidArgument("seq_id %d of training run %s was already used by a request that was rejected; use the next seq_id", seq, r.id)
		}
		o, err := r.c.ops.lookup(ctx, r.ws, used.op)
		if err != nil {
			return nil, err
		}
		return o.snapshot(), nil
	}
	if seq < r.nextSeq {
		return nil, failedPrecondition("seq_id %d of training run %s arrived after the run had moved past it (next expected seq_id is %d); requests of a run must be sent in seq_id order", seq, r.id, r.nextSeq)
	}
	if r.unloaded != "" {
		return nil, failedPrecondition("training run %s takes no more work: %s", r.id, r.unloaded)
	}
	if r.c.draining() {
		return nil, errShuttingDown()
	}
	if err := r.roomForTask(); err != nil { // refused without using seq: the retry is accepted
		return nil, err
	}
	t, err := mk(seq)
	if err != nil {
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeNotFound, connect.CodeOutOfRange, connect.CodePermissionDenied:
			r.seen[seq] = seenSeq{kind: kind}
			r.pending[seq] = &task{seq: seq}
			r.maxSeen = max(r.maxSeen, seq)
			r.kick()
		}
		return nil, err
	}
	t.seq = seq
	r.pending[seq] = t
	r.seen[seq] = seenSeq{op: t.op.op.GetId(), kind: kind}
	r.maxSeen = max(r.maxSeen, seq)
	r.kick()
	return t.op.snapshot(), nil
}

// kick makes the run's head runnable if it is. Called with r.mu held.
func (r *run) kick() {
	for {
		t, ok := r.pending[r.nextSeq]
		if !ok || t.op != nil {
			break
		}
		delete(r.pending, r.nextSeq)
		r.nextSeq++
	}
	if r.busy || r.queued {
		return
	}
	if _, ok := r.pending[r.nextSeq]; ok {
		if r.gapTimer != nil {
			r.gapTimer.Stop()
			r.gapTimer = nil
		}
		r.queued = true
		r.lane.markReady(r)
		return
	}
	if len(r.pending) > 0 && r.gapTimer == nil {
		expected := r.nextSeq
		r.gapTimer = time.AfterFunc(r.c.opts.GapTimeout, func() { r.skipGap(expected) })
	}
	// Forget old de-duplication entries; retries come within minutes, not thousands of steps.
	if len(r.seen) > 8192 {
		for s := range r.seen {
			if s < r.nextSeq-4096 {
				delete(r.seen, s)
			}
		}
	}
}

// skipGap gives up on a seq_id that never arrived and moves on to the next one that did.
func (r *run) skipGap(expected int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gapTimer = nil
	if r.nextSeq != expected || r.busy || r.queued || len(r.pending) == 0 {
		return
	}
	if _, ok := r.pending[r.nextSeq]; ok {
		r.kick()
		return
	}
	next := slices.Min(mapKeys(r.pending))
	r.c.log.Warn("skipping seq_ids that never arrived", slog.String("run", r.id), slog.Int64("from", r.nextSeq), slog.Int64("to", next-1))
	r.nextSeq = next
	r.kick()
}

// takeHead removes the head task for execution and marks the run busy.
func (r *run) takeHead() *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queued = false
	t, ok := r.pending[r.nextSeq]
	if !ok {
		return nil
	}
	delete(r.pending, r.nextSeq)
	r.nextSeq++
	r.busy = true
	return t
}

// taskDone releases the run after its head task finished, and frees its adapter if the
// run was unloaded while the task ran.
func (r *run) taskDone() {
	r.mu.Lock()
	r.busy = false
	free := r.freeWhenIdle
	r.freeWhenIdle = false
	r.kick()
	r.mu.Unlock()
	if free {
		r.c.freeAdapter(r.c.ctx, r)
	}
	r.c.slots.unpin(r)
}

// takePendingLocked removes every queued task of the run and returns those with an
// operation to fail. Called with r.mu held.
func (r *run) takePendingLocked() []*task {
	tasks := make([]*task, 0, len(r.pending))
	for s, t := range r.pending {
		if t.op != nil {
			tasks = append(tasks, t)
		}
		delete(r.pending, s)
	}
	return tasks
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// lane executes the ready work of every run on one base model. Forward/backward heads of
// several runs go to the backend in one call; other tasks run beside it, one per run.
type lane struct {
	c     *Core
	model string
	mu    sync.Mutex
	ready []*run
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{}
	// tasks counts the non-batched tasks running beside the lane's loop.
	tasks sync.WaitGroup
	// deficit is each workspace's unused token credit (fair.go); only workspaces with
	// deferred work have an entry. Used by the lane's goroutine only.
	deficit map[string]int
}

func (c *Core) laneFor(model string) *lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.lanes[model]; ok {
		return l
	}
	l := &lane{c: c, model: model, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), deficit: map[string]int{}}
	c.lanes[model] = l
	go l.loop()
	return l
}

func (l *lane) markReady(r *run) {
	l.mu.Lock()
	l.ready = append(l.ready, r)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *lane) stop() {
	close(l.quit)
	<-l.done
	l.tasks.Wait()
}

func (l *lane) loop() {
	defer close(l.done)
	for {
		select {
		case <-l.quit:
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
			l.round(rs)
		}
	}
}

type runTask struct {
	r *run
	t *task
}

// round executes one head task of each ready run.
func (l *lane) round(rs []*run) {
	ctx := l.c.ctx
	l.c.running.add()
	defer l.c.running.done()
	rs, later := l.fairShare(rs)
	l.requeue(later)
	var fbs, others []runTask
	for _, r := range rs {
		if err := l.c.slots.admit(ctx, r); errors.Is(err, errNoSlot) {
			// Every slot is pinned: the run waits, and is made ready when one frees.
			r.mu.Lock()
			r.queued = false
			r.mu.Unlock()
			l.c.slots.park(r)
			continue
		} else if err != nil {
			if t := r.takeHead(); t != nil {
				l.c.ops.finish(t.op, nil, err)
			}
			r.taskDone()
			continue
		}
		t := r.takeHead()
		if t == nil {
			r.taskDone()
			continue
		}
		l.c.ops.setRunning(t.op)
		if err := l.c.ensureAdapter(ctx, r, t); err != nil {
			l.c.ops.finish(t.op, nil, err)
			r.taskDone()
			continue
		}
		if t.fb != nil {
			fbs = append(fbs, runTask{r, t})
		} else {
			others = append(others, runTask{r, t})
		}
	}
	// A run's non-batched task (create, save, load, optim_step, unload) is a barrier for
	// that run only: it runs on its own goroutine and the lane goes on batching the other
	// runs' forward/backward work; the run becomes ready again when the task is done.
	for _, rt := range others {
		l.tasks.Add(1)
		l.c.running.add()
		go func() {
			defer l.tasks.Done()
			defer l.c.running.done()
			set, err := l.c.execTask(ctx, rt.t)
			if err == nil {
				switch rt.t.op.op.GetKind() {
				case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
					l.c.slots.setGrads(rt.r, false) // applied, or replaced by the loaded state
				}
			}
			l.c.ops.finish(rt.t.op, set, err)
			rt.r.touch(ctx, rt.t.seq)
			rt.r.taskDone()
		}()
	}
	for len(fbs) > 0 {
		n, tokens := 0, 0
		for n < len(fbs) && (n == 0 || tokens+fbs[n].t.tokens <= l.c.opts.MaxBatchTokens) {
			tokens += fbs[n].t.tokens
			n++
		}
		l.forwardBackward(ctx, fbs[:n])
		fbs = fbs[n:]
	}
}

// execTask runs a task's work. A panic in it (backend calls are already guarded; this
// covers the core's own part) fails the task's operation with an internal error and keeps
// the lane and the process running.
func (c *Core) execTask(ctx context.Context, t *task) (set func(*loopsv1.Operation), err error) {
	defer func() {
		if v := recover(); v != nil {
			id := errs.NewID()
			c.log.Error("operation panicked", slog.String("operation", t.op.op.GetId()), slog.String("incident", id),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			set, err = nil, errs.Incident(id, fmt.Sprintf("the server failed unexpectedly (incident %s); the operation's effect is unknown: load the run's last checkpoint to continue", id))
		}
	}()
	return t.exec(ctx)
}

// forwardBackward sends one batch of forward/backward items to the backend and finishes
// each item's operation with its own outcome.
func (l *lane) forwardBackward(ctx context.Context, batch []runTask) {
	req := &backendv1.ForwardBackwardRequest{Items: make([]*backendv1.ForwardBackwardItem, len(batch))}
	tokens := 0
	for i, rt := range batch {
		req.Items[i] = rt.t.fb
		tokens += rt.t.tokens
	}
	l.c.metrics.batchItems.Observe(float64(len(batch)))
	resp, err := l.c.backend.Trainer().ForwardBackward(ctx, req)
	if err == nil && len(resp.GetResults()) != len(batch) {
		err = connect.NewError(connect.CodeInternal, errors.New("backend returned a result count that does not match the batch"))
	}
	for i, rt := range batch {
		var itemErr error
		var res *loopsv1.ForwardBackwardResult
		switch {
		case err != nil:
			itemErr = rt.r.adapterLost(err)
		case resp.GetResults()[i].GetError() != nil:
			e := resp.GetResults()[i].GetError()
			itemErr = rt.r.adapterLost(connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage())))
		default:
			res = resp.GetResults()[i].GetResult()
		}
		if itemErr == nil {
			if !rt.t.fb.GetForwardOnly() {
				l.c.slots.setGrads(rt.r, true)
			}
			l.c.metrics.tokens.WithLabelValues("train").Add(float64(rt.t.tokens))
			info := rt.r.snapshot()
			l.c.recordUsage(rt.r.ws, info.GetBaseModel(), info.GetSessionId(), store.UsageTraining, int64(rt.t.tokens))
		}
		l.c.ops.finish(rt.t.op, func(op *loopsv1.Operation) {
			op.Result = &loopsv1.Operation_ForwardBackward{ForwardBackward: res}
		}, itemErr)
		rt.r.touch(ctx, rt.t.seq)
		rt.r.taskDone()
	}
}

// adapterLost handles a backend error for the run: NotFound means the backend no longer has
// the run's adapter (a worker restarted), so the next request recreates it and marks the run
// corrupted (ensureAdapter). Other errors pass through.
//
// DeadlineExceeded means the backend did not answer in time (backends.WithDeadlines): the
// adapter's state is unknown and the backend may still be working on it, so it is treated
// like a lost adapter, and the next request deletes whatever the backend holds before
// recreating it.
func (r *run) adapterLost(err error) error {
	if err != nil && connect.CodeOf(err) == connect.CodeDeadlineExceeded {
		r.mu.Lock()
		r.adapterReady, r.adapterStale = false, true
		r.mu.Unlock()
		r.c.log.Error("a backend call on a run passed its deadline", slog.String("run", r.id), slog.Any("err", err))
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s; training run %s's adapter state is unknown: the next request recreates it (the run is marked corrupted), so load the run's last checkpoint (load_state) to continue", connectMessage(err), r.id))
	}
	if err == nil || connect.CodeOf(err) != connect.CodeNotFound {
		return err
	}
	r.mu.Lock()
	r.adapterReady = false
	r.mu.Unlock()
	r.c.log.Warn("the backend lost a run's adapter", slog.String("run", r.id), slog.Any("err", err))
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the backend lost training run %s's adapter (%s); the next request recreates it, so load the run's last checkpoint (load_state) to continue", r.id, connectMessage(err)))
}

// touch records that the run did work now.
func (r *run) touch(ctx context.Context, seq int64) {
	r.update(ctx, func(info *loopsv1.TrainingRun) {
		info.LastRequestTime = timestamppb.New(r.c.now())
		info.LastSeqId = max(info.LastSeqId, seq)
	})
}

// ensureAdapter recreates the adapter of a run recovered after a restart. Its unsaved state
// is gone, so the run is marked corrupted until a checkpoint is loaded.
func (c *Core) ensureAdapter(ctx context.Context, r *run, t *task) error {
	r.mu.Lock()
	ready, stale := r.adapterReady, r.adapterStale
	r.mu.Unlock()
	if ready || t.creates {
		return nil
	}
	if stale {
		// A call that passed its deadline may have left the adapter on the backend.
		if _, err := c.backend.Trainer().DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.id}); err != nil {
			return connect.NewError(connect.CodeUnavailable, errors.New("the run's adapter could not be reset after a backend call passed its deadline: "+connectMessage(err)))
		}
	}
	info := r.snapshot()
	_, err := c.backend.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{
		AdapterId: r.id, BaseModel: info.GetBaseModel(), Lora: info.GetLora(),
	})
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, errors.New("the run's adapter could not be restored after a server restart: "+err.Error()))
	}
	r.mu.Lock()
	r.adapterReady, r.adapterStale = true, false
	r.mu.Unlock()
	r.update(ctx, func(i *loopsv1.TrainingRun) { i.Corrupted = true })
	c.log.Warn("recreated a lost adapter; the run is marked corrupted until a checkpoint is loaded", slog.String("run", r.id))
	return nil
}
