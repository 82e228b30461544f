package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// CreateEval inserts an eval of the workspace with its dataset; store.ErrExists when its
// name or id is taken.
func (s *Store) CreateEval(ctx context.Context, workspace string, e *loopsv1.Eval, dataset []byte) error {
	q, err := sqlstore.CreateEval(workspace, e, dataset)
	var n int64
	if err == nil {
		n, err = s.exec(ctx, q.SQL, q.Args...)
	}
	if err == nil && n == 0 {
		err = store.ErrExists
	}
	if err != nil {
		return fmt.Errorf("store: create eval %s: %w", e.GetName(), err)
	}
	return nil
}

// GetEval returns an eval of the workspace by id.
func (s *Store) GetEval(ctx context.Context, workspace, id string) (*loopsv1.Eval, error) {
	return get(ctx, s.r, sqlstore.GetEval(workspace, id))
}

// GetEvalByName returns an eval of the workspace by name.
func (s *Store) GetEvalByName(ctx context.Context, workspace, name string) (*loopsv1.Eval, error) {
	return get(ctx, s.r, sqlstore.GetEvalByName(workspace, name))
}

// GetEvalDataset returns an eval's dataset.
func (s *Store) GetEvalDataset(ctx context.Context, workspace, id string) ([]byte, error) {
	var data []byte
	err := s.r.QueryRowContext(ctx, sqlstore.GetEvalDataset, workspace, id).Scan(&data)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("store: get eval dataset %s: %w", id, store.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("store: get eval dataset %s: %w", id, err)
	}
	return data, nil
}

// ListEvals lists the workspace's evals by name.
func (s *Store) ListEvals(ctx context.Context, workspace string) ([]*loopsv1.Eval, error) {
	return messages(ctx, s, "list evals", sqlstore.NewEval, sqlstore.ListEvals, workspace)
}

// DeleteEval removes an eval of the workspace and its attachments.
func (s *Store) DeleteEval(ctx context.Context, workspace, id string) error {
	err := func() error {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.ExecContext(ctx, sqlstore.DeleteEval, workspace, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return cmpErr(err, store.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, sqlstore.DeleteEvalAttachments, workspace, id); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err != nil {
		return fmt.Errorf("store: delete eval %s: %w", id, err)
	}
	return nil
}

// cmpErr is err, or def when err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// putOwned runs an upsert that changes no row when another workspace owns the key.
func (s *Store) putOwned(ctx context.Context, what string, q sqlstore.Query, err error) error {
	var n int64
	if err == nil {
		n, err = s.exec(ctx, q.SQL, q.Args...)
	}
	if err == nil && n == 0 {
		err = errors.New("the key belongs to another workspace")
	}
	if err != nil {
		return fmt.Errorf("store: put %s: %w", what, err)
	}
	return nil
}

// PutEvalAttachment inserts or replaces an attachment.
func (s *Store) PutEvalAttachment(ctx context.Context, workspace string, a *loopsv1.EvalAttachment) error {
	q, err := sqlstore.PutEvalAttachment(workspace, a)
	return s.putOwned(ctx, "eval attachment", q, err)
}

// ListEvalAttachments lists the evals attached to a run, oldest first.
func (s *Store) ListEvalAttachments(ctx context.Context, workspace, runID string) ([]*loopsv1.EvalAttachment, error) {
	return messages(ctx, s, "list eval attachments", sqlstore.NewEvalAttachment, sqlstore.ListEvalAttachments, workspace, runID)
}

// PutEvalResult inserts or replaces a result.
func (s *Store) PutEvalResult(ctx context.Context, workspace string, r *loopsv1.EvalResult) error {
	q, err := sqlstore.PutEvalResult(workspace, r)
	return s.putOwned(ctx, "eval result", q, err)
}

// ListEvalResults lists results of a run and/or an eval, newest first.
func (s *Store) ListEvalResults(ctx context.Context, workspace, runID, checkpointID, evalID string, limit int) ([]*loopsv1.EvalResult, error) {
	limit = min(max(limit, 1), store.MaxEvalResultsListed)
	return messages(ctx, s, "list eval results", sqlstore.NewEvalResult, sqlstore.ListEvalResults, workspace, runID, evalID, limit, checkpointID)
}

// DeleteEvalResults removes the results of one checkpoint.
func (s *Store) DeleteEvalResults(ctx context.Context, workspace, runID, checkpointID string) error {
	if _, err := s.exec(ctx, sqlstore.DeleteEvalResults, workspace, runID, checkpointID); err != nil {
		return fmt.Errorf("store: delete eval results: %w", err)
	}
	return nil
}
