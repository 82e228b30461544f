package store

import (
	"context"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// MaxEvalResultsListed bounds a list of eval results.
const MaxEvalResultsListed = 1000

// EvalStore keeps evals (loops.v1 Eval with its dataset), their attachments to training
// runs and their results, one per (run, checkpoint, eval). Every record belongs to one
// workspace; another workspace's lookups return ErrNotFound and its lists leave them out.
type EvalStore interface {
	// CreateEval inserts an eval of the workspace with its dataset; ErrExists when the
	// workspace has an eval of that name (or one with that id). e.Id and e.Name must not
	// be empty.
	CreateEval(ctx context.Context, workspace string, e *loopsv1.Eval, dataset []byte) error
	// GetEval returns an eval of the workspace by id.
	GetEval(ctx context.Context, workspace, id string) (*loopsv1.Eval, error)
	// GetEvalByName returns an eval of the workspace by name.
	GetEvalByName(ctx context.Context, workspace, name string) (*loopsv1.Eval, error)
	// GetEvalDataset returns an eval's dataset as uploaded.
	GetEvalDataset(ctx context.Context, workspace, id string) ([]byte, error)
	// ListEvals lists the workspace's evals by name.
	ListEvals(ctx context.Context, workspace string) ([]*loopsv1.Eval, error)
	// DeleteEval removes an eval of the workspace and its attachments (its results stay).
	DeleteEval(ctx context.Context, workspace, id string) error
	// PutEvalAttachment inserts or replaces the attachment of an eval to a run, keyed by
	// (training_run_id, eval_id).
	PutEvalAttachment(ctx context.Context, workspace string, a *loopsv1.EvalAttachment) error
	// ListEvalAttachments lists the evals attached to a run of the workspace, oldest first.
	ListEvalAttachments(ctx context.Context, workspace, runID string) ([]*loopsv1.EvalAttachment, error)
	// PutEvalResult inserts or replaces a result, keyed by (training_run_id,
	// checkpoint_id, eval_id).
	PutEvalResult(ctx context.Context, workspace string, r *loopsv1.EvalResult) error
	// ListEvalResults lists the workspace's results of a run (of one of its checkpoints
	// when checkpointID is not empty), of an eval, or of both (an empty runID, checkpointID
	// or evalID does not filter; runID and evalID both empty lists nothing), newest first (by
	// create_time, then checkpoint id, then eval id, descending), at most limit (1 to
	// MaxEvalResultsListed).
	ListEvalResults(ctx context.Context, workspace, runID, checkpointID, evalID string, limit int) ([]*loopsv1.EvalResult, error)
	// DeleteEvalResults removes the results of one checkpoint of a run (when the
	// checkpoint is deleted); none is not an error.
	DeleteEvalResults(ctx context.Context, workspace, runID, checkpointID string) error
}
