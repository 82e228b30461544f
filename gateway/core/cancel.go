package core

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// MaxBatchGet caps the ids of one BatchGetOperations.
const MaxBatchGet = 100

// maxOperationIDBytes bounds one operation id on the wire (ours are much shorter).
const maxOperationIDBytes = 128

// errRemovedFromQueue is the cause of a cancelled operation taken out of its queue before
// it ran.
var errRemovedFromQueue = errors.New("cancelled by its client before it ran: it was removed from its queue and had no effect (its seq_id was consumed, so the run went on with the next one)")

// cancelError is the error a cancelled operation ends with: removed from its queue (cause
// errRemovedFromQueue), or finished with its result dropped (any other cause).
func cancelError(cause error) error {
	if errors.Is(cause, errRemovedFromQueue) {
		return connect.NewError(connect.CodeCanceled, cause)
	}
	return connect.NewError(connect.CodeCanceled, errors.New("cancelled by its client while it ran: it finished (its effect, such as accumulated gradients or an optimizer step, is kept) and its result was dropped"))
}

// cancel records a client's cancel of operation o: a queued one is taken out of its queue
// and ends CANCELLED at once; a running one ends CANCELLED when it finishes, its result
// dropped (finish); a finished one is unchanged. The creation and the unloading of a
// training run cannot be cancelled (the run's adapter depends on them).
func (ops *operations) cancel(o *operation) (removed bool, err error) {
	o.mu.Lock()
	op := o.op
	if o.finishing || isDone(op) || o.cancelled {
		o.mu.Unlock()
		return false, nil
	}
	switch op.GetKind() {
	case loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN, loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN:
		o.mu.Unlock()
		return false, failedPrecondition("operation %s is a %s, which cannot be cancelled (the training run's adapter depends on it); wait for it, then unload the run if you no longer need it", op.GetId(), kindName(op.GetKind()))
	}
	o.cancelled = true
	next := proto.CloneOf(op)
	next.CancelTime = timestamppb.New(ops.core.now())
	o.op = next
	pending := next.GetState() == loopsv1.OperationState_OPERATION_STATE_PENDING
	o.mu.Unlock()
	if !pending {
		return false, nil // it runs: finish drops its result
	}
	switch {
	case next.GetKind() == loopsv1.OperationKind_OPERATION_KIND_SAMPLE:
		if j := ops.core.samplers.queue.remove(o); j != nil {
			j.adapter.Release()
			ops.finish(o, nil, errRemovedFromQueue)
			return true, nil
		}
	case next.GetTrainingRunId() != "" && next.GetSeqId() > 0:
		if r := ops.core.runs.peek(next.GetTrainingRunId()); r != nil {
			if t := r.Cancel(next.GetSeqId()); t != nil {
				ops.finish(t.Op, nil, errRemovedFromQueue)
				return true, nil
			}
		}
	}
	// Not found in its queue: it was taken to run meanwhile, and finish drops its result.
	return false, nil
}

// CancelOperation cancels an operation of the caller's workspace (see cancel) and returns
// it as it stands after the call.
func (s OperationService) CancelOperation(ctx context.Context, req *loopsv1.CancelOperationRequest) (*loopsv1.Operation, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkOperationID(req.GetId()); err != nil {
		return nil, err
	}
	o, err := s.c.ops.lookup(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	removed, err := s.c.ops.cancel(o)
	if err != nil {
		return nil, err
	}
	if removed { // its outcome is decided: answer it once committed (a moment)
		t := time.NewTimer(maxWait)
		defer t.Stop()
		select {
		case <-o.done:
		case <-t.C:
		case <-s.c.drain:
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
	return s.c.ops.view(o)
}

// checkOperationID refuses an empty or oversized operation id.
func checkOperationID(id string) error {
	switch {
	case id == "":
		return invalidArgument("id is required: the operation's id (request_id)")
	case len(id) > maxOperationIDBytes:
		return invalidArgument("operation id is %d bytes, more than any operation id (%d): send the id an operation was answered with", len(id), maxOperationIDBytes)
	}
	return nil
}

// BatchGetOperations returns up to MaxBatchGet operations of the caller's workspace without
// their large results; an id it does not know (or another workspace's) is answered NOT_FOUND
// in its place.
func (s OperationService) BatchGetOperations(ctx context.Context, req *loopsv1.BatchGetOperationsRequest) (*loopsv1.BatchGetOperationsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ids := req.GetIds()
	switch {
	case len(ids) == 0:
		return nil, invalidArgument("ids is empty: name the operations to read (at most %d)", MaxBatchGet)
	case len(ids) > MaxBatchGet:
		return nil, invalidArgument("%d ids asked for, more than %d in one batch: split the request", len(ids), MaxBatchGet)
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if err := checkOperationID(id); err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, invalidArgument("id %q is asked for twice: name each operation once", id)
		}
		seen[id] = true
	}
	out := &loopsv1.BatchGetOperationsResponse{Results: make([]*loopsv1.OperationLookup, len(ids))}
	for i, id := range ids {
		res := &loopsv1.OperationLookup{Id: id}
		out.Results[i] = res
		o, err := s.c.ops.lookup(ctx, ws, id)
		if connect.CodeOf(err) == connect.CodeNotFound {
			res.Error, _ = operationError(err)
			continue
		}
		if err != nil {
			return nil, err
		}
		op := o.snapshot() // a finished one holds its small copy: no large result
		if !isDone(op) {
			if op, err = s.c.ops.view(o); err != nil {
				return nil, err
			}
		}
		res.Operation = op
	}
	return out, nil
}

// Completions returns the samples of sampler samplerID (of the caller's workspace) that
// finished after cursor after, in the order they finished (their small copies: no large
// result), waiting up to wait for the first when there is none yet; and the cursor to pass
// next time. Only samples finished in
// the last minute or so are in memory to report (a client polls while it waits for
// them). At most limit are returned.
func (s OperationService) Completions(ctx context.Context, samplerID string, after int64, wait time.Duration, limit int) ([]*loopsv1.Operation, int64, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, 0, err
	}
	if err := s.c.samplers.owned(ctx, ws, samplerID); err != nil {
		return nil, 0, err
	}
	ops := s.c.ops
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		ch := *ops.published.Load()
		out, cursor := ops.completions(ws, samplerID, after, limit)
		if len(out) > 0 || wait <= 0 {
			return out, cursor, nil
		}
		select {
		case <-ch:
		case <-t.C:
			return nil, after, nil
		case <-s.c.drain:
			return nil, after, nil
		case <-ctx.Done():
			return nil, after, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

// completions lists sampler's samples finished after cursor after (see Completions).
func (ops *operations) completions(ws, sampler string, after int64, limit int) ([]*loopsv1.Operation, int64) {
	ops.mu.Lock()
	done := ops.samplerDone[sampler]
	ops.mu.Unlock()
	cursor := after
	var out []*loopsv1.Operation
	for _, o := range done {
		if o.workspace != ws {
			continue
		}
		o.mu.Lock()
		op, fin := o.op, o.fin
		o.mu.Unlock()
		if fin <= after {
			continue
		}
		if len(out) == limit {
			break
		}
		out = append(out, op)
		cursor = max(cursor, fin)
	}
	return out, cursor
}

// owned checks that sampler id exists and belongs to workspace ws (in memory or in the
// store), without loading it.
func (ss *samplers) owned(ctx context.Context, ws, id string) error {
	ss.mu.Lock()
	s, ok := ss.byID[id]
	ss.mu.Unlock()
	if ok && s.ws == ws {
		return nil
	}
	if !ok {
		if _, err := ss.c.store.GetSampler(ctx, ws, id); err == nil {
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return storeErr(err, "sampler "+quote(id))
		}
	}
	return notFound("sampler %q not found (it does not exist, or belongs to another API key's workspace)", id)
}
