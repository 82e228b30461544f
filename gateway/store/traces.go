package store

import (
	"context"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TraceReader reads what a session's trace draws (gateway/core's TraceService): its
// samplers, and the operations of each of its training runs and samplers.
type TraceReader interface {
	// ListSessionSamplers lists up to limit samplers of one session of the workspace,
	// oldest first.
	ListSessionSamplers(ctx context.Context, workspace, sessionID string, limit int) ([]*loopsv1.Sampler, error)
	// ListOwnerOperations lists up to limit operations of the workspace that belong to
	// owner, a training run (training_run_id) or a sampler (sampler_id of an operation
	// without a training run), newest first.
	ListOwnerOperations(ctx context.Context, workspace, owner string, limit int) ([]*loopsv1.Operation, error)
}

// OperationOwner is the training run an operation belongs to or, for one without (a
// sample), its sampler: the operations table's training_run_id column holds it, so that
// ListOwnerOperations finds either by its index.
func OperationOwner(op *loopsv1.Operation) string {
	if id := op.GetTrainingRunId(); id != "" {
		return id
	}
	return op.GetSamplerId()
}

// MaxTraceListLimit caps a TraceReader list.
const MaxTraceListLimit = 10000

// TraceLimit clamps a TraceReader limit to [1, MaxTraceListLimit].
func TraceLimit(limit int) int { return min(max(limit, 1), MaxTraceListLimit) }
