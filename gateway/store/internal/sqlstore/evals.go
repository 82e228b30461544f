package sqlstore

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Evals, their attachments and results (migration 0012).
const (
	ListEvals      = `SELECT workspace, data FROM evals WHERE workspace = $1 ORDER BY name`
	GetEvalDataset = `SELECT dataset FROM evals WHERE workspace = $1 AND id = $2`
	// DeleteEval and DeleteEvalAttachments take (workspace, id); run both in one
	// transaction.
	DeleteEval            = `DELETE FROM evals WHERE workspace = $1 AND id = $2`
	DeleteEvalAttachments = `DELETE FROM eval_attachments WHERE workspace = $1 AND eval_id = $2`
	ListEvalAttachments   = `SELECT workspace, data FROM eval_attachments WHERE workspace = $1 AND run_id = $2 ORDER BY create_time, eval_id`
	// ListEvalResults takes (workspace, run id or '', eval id or '', limit, checkpoint id
	// or '').
	ListEvalResults = `SELECT workspace, data FROM eval_results WHERE workspace = $1
		AND ($2 = '' OR run_id = $2) AND ($3 = '' OR eval_id = $3) AND ($2 <> '' OR $3 <> '')
		AND ($5 = '' OR checkpoint_id = $5)
		ORDER BY create_time DESC, checkpoint_id DESC, eval_id DESC LIMIT $4`
	DeleteEvalResults = `DELETE FROM eval_results WHERE workspace = $1 AND run_id = $2 AND checkpoint_id = $3`
)

// GetEval is the lookup of an eval by id.
func GetEval(workspace, id string) Get[*loopsv1.Eval] {
	return get("eval", id, NewEval, `SELECT data FROM evals WHERE workspace = $1 AND id = $2`, workspace, id)
}

// GetEvalByName is the lookup of an eval by name.
func GetEvalByName(workspace, name string) Get[*loopsv1.Eval] {
	return get("eval", name, NewEval, `SELECT data FROM evals WHERE workspace = $1 AND name = $2`, workspace, name)
}

// CreateEval is the insert of an eval; it changes no row when its name or id is taken.
func CreateEval(workspace string, e *loopsv1.Eval, dataset []byte) (Query, error) {
	if e.GetId() == "" || e.GetName() == "" {
		return Query{}, fmt.Errorf("create eval: missing id or name")
	}
	data, err := proto.Marshal(e)
	if err != nil {
		return Query{}, fmt.Errorf("create eval %s: encode: %w", e.GetName(), err)
	}
	if dataset == nil {
		dataset = []byte{}
	}
	return Query{SQL: `INSERT INTO evals (id, workspace, name, create_time, data, dataset) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT DO NOTHING`, Args: []any{e.GetId(), workspace, e.GetName(), Nanos(e.GetCreateTime()), data, dataset}}, nil
}

// PutEvalAttachment is the upsert of an attachment; it changes no row when another
// workspace owns the key.
func PutEvalAttachment(workspace string, a *loopsv1.EvalAttachment) (Query, error) {
	if a.GetTrainingRunId() == "" || a.GetEvalId() == "" {
		return Query{}, fmt.Errorf("put eval attachment: missing training_run_id or eval_id")
	}
	data, err := proto.Marshal(a)
	if err != nil {
		return Query{}, fmt.Errorf("put eval attachment: encode: %w", err)
	}
	return Query{SQL: `INSERT INTO eval_attachments (run_id, eval_id, workspace, create_time, data) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (run_id, eval_id) DO UPDATE SET data = excluded.data, create_time = excluded.create_time
		WHERE eval_attachments.workspace = excluded.workspace`,
		Args: []any{a.GetTrainingRunId(), a.GetEvalId(), workspace, Nanos(a.GetCreateTime()), data}}, nil
}

// PutEvalResult is the upsert of a result; it changes no row when another workspace owns
// the key.
func PutEvalResult(workspace string, r *loopsv1.EvalResult) (Query, error) {
	if r.GetTrainingRunId() == "" || r.GetCheckpointId() == "" || r.GetEvalId() == "" {
		return Query{}, fmt.Errorf("put eval result: missing training_run_id, checkpoint_id or eval_id")
	}
	data, err := proto.Marshal(r)
	if err != nil {
		return Query{}, fmt.Errorf("put eval result: encode: %w", err)
	}
	return Query{SQL: `INSERT INTO eval_results (run_id, checkpoint_id, eval_id, workspace, create_time, data) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (run_id, checkpoint_id, eval_id) DO UPDATE SET data = excluded.data, create_time = excluded.create_time
		WHERE eval_results.workspace = excluded.workspace`,
		Args: []any{r.GetTrainingRunId(), r.GetCheckpointId(), r.GetEvalId(), workspace, Nanos(r.GetCreateTime()), data}}, nil
}

// NewEval, NewEvalAttachment and NewEvalResult are the constructors of the messages.
func NewEval() *loopsv1.Eval                     { return &loopsv1.Eval{} }
func NewEvalAttachment() *loopsv1.EvalAttachment { return &loopsv1.EvalAttachment{} }
func NewEvalResult() *loopsv1.EvalResult         { return &loopsv1.EvalResult{} }
