package core

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxWait caps how long WaitOperation holds a request (the tinker SDK times out at 45 s).
const maxWait = 30 * time.Second

// operation is an operation in memory. op is replaced, never mutated, once published, so a
// reader holding a snapshot needs no lock.
type operation struct {
	workspace string
	mu        sync.Mutex
	op        *loopsv1.Operation
	done      chan struct{}
}

func (o *operation) snapshot() *loopsv1.Operation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.op
}

// operations is the registry of live and recently finished operations.
type operations struct {
	core *Core
	mu   sync.Mutex
	byID map[string]*operation
}

func newOperations(c *Core) *operations {
	return &operations{core: c, byID: map[string]*operation{}}
}

// create registers a pending operation and persists it, so that a crash before it finishes
// is reported rather than lost.
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
	if err := ops.core.store.PutOperation(ctx, ws, op); err != nil {
		ops.core.policy.EndOp(op.Id)
		return nil, internal("recording operation", err)
	}
	o := &operation{workspace: ws, op: op, done: make(chan struct{})}
	ops.mu.Lock()
	ops.byID[op.Id] = o
	ops.mu.Unlock()
	ops.core.metrics.opsCreated.WithLabelValues(kindLabel(kind)).Inc()
	return o, nil
}

// setRunning marks an operation as started.
func (ops *operations) setRunning(o *operation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.op.State != loopsv1.OperationState_OPERATION_STATE_PENDING {
		return
	}
	next := proto.CloneOf(o.op)
	next.State = loopsv1.OperationState_OPERATION_STATE_RUNNING
	o.op = next
}

// finish records an operation's outcome, persists it and wakes every waiter. set fills in
// the result on a succeeded operation; err != nil fails it.
func (ops *operations) finish(o *operation, set func(*loopsv1.Operation), err error) {
	o.mu.Lock()
	if isDone(o.op) {
		o.mu.Unlock()
		return
	}
	next := proto.CloneOf(o.op)
	next.DoneTime = timestamppb.New(ops.core.now())
	if err != nil {
		next.State = loopsv1.OperationState_OPERATION_STATE_FAILED
		// Backend errors may name the server's folders; clients see store-relative paths.
		var errID string
		next.Error, errID = operationError(ops.core.ckpt.scrub(err))
		if next.Error.Category == loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER {
			ops.core.log.Error("operation failed", slog.String("op", next.Id), slog.String("kind", kindLabel(next.Kind)),
				slog.String("error_id", errID), slog.Any("err", err))
		}
	} else {
		next.State = loopsv1.OperationState_OPERATION_STATE_SUCCEEDED
		if set != nil {
			set(next)
		}
	}
	o.op = next
	o.mu.Unlock()
	ops.core.policy.EndOp(next.Id)
	// Persist before waking waiters: a result a client has seen is never lost by a crash.
	if perr := ops.core.store.PutOperation(context.WithoutCancel(context.Background()), o.workspace, next); perr != nil {
		ops.core.log.Error("persisting operation outcome", slog.String("op", next.Id), slog.Any("err", perr))
	}
	close(o.done)
	ops.core.metrics.opsFinished.WithLabelValues(kindLabel(next.Kind), stateLabel(next.State)).Inc()
	ops.core.metrics.opDuration.WithLabelValues(kindLabel(next.Kind)).Observe(next.DoneTime.AsTime().Sub(next.CreateTime.AsTime()).Seconds())
}

// lookup finds an operation of the workspace in memory, or a finished one in the store.
func (ops *operations) lookup(ctx context.Context, ws, id string) (*operation, error) {
	ops.mu.Lock()
	o, ok := ops.byID[id]
	ops.mu.Unlock()
	if ok {
		if o.workspace != ws {
			return nil, notFound("operation %q not found (it does not exist, or belongs to another API key's workspace)", id)
		}
		return o, nil
	}
	op, err := ops.core.store.GetOperation(ctx, ws, id)
	if err != nil {
		return nil, storeErr(err, "operation "+quote(id))
	}
	done := make(chan struct{})
	close(done) // an operation found only in the store is finished (unfinished ones were failed at start-up)
	return &operation{workspace: ws, op: op, done: done}, nil
}

// evictFinishedBefore drops finished operations from memory; they stay in the store.
func (ops *operations) evictFinishedBefore(t time.Time) {
	ops.mu.Lock()
	defer ops.mu.Unlock()
	for id, o := range ops.byID {
		op := o.snapshot()
		if isDone(op) && op.DoneTime.AsTime().Before(t) {
			delete(ops.byID, id)
		}
	}
}

func isDone(op *loopsv1.Operation) bool {
	return op.State == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED || op.State == loopsv1.OperationState_OPERATION_STATE_FAILED
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
	return o.snapshot(), nil
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
	return o.snapshot(), nil
}

func quote(s string) string { return "\"" + s + "\"" }
