package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PutSession inserts or replaces a session.
// Its labels (store.SessionLabels) are written in the same transaction.
func (s *Store) PutSession(ctx context.Context, workspace string, m *loopsv1.Session) error {
	labels, ok := sqlstore.PutSessionLabels(workspace, m)
	if !ok {
		return put(ctx, s, sqlstore.PutSession, workspace, m)
	}
	w, err := sqlstore.PutSession(workspace, m)
	if err == nil {
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			if err := execWrite(ctx, tx, w); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, labels.SQL, labels.Args...); err != nil {
				return w.Err(fmt.Errorf("labels: %w", err))
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// GetSession returns a session of the workspace.
func (s *Store) GetSession(ctx context.Context, workspace, id string) (*loopsv1.Session, error) {
	return get(ctx, s.r, sqlstore.GetSession(workspace, id))
}

// ListSessions lists the workspace's sessions, newest first, and the total count.
func (s *Store) ListSessions(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.Session, int64, error) {
	return list(ctx, s.r, "sessions", sqlstore.NewSession, sqlstore.ListSessions, page, workspace)
}

// PutTrainingRun inserts or replaces a training run.
func (s *Store) PutTrainingRun(ctx context.Context, workspace string, m *loopsv1.TrainingRun) error {
	return put(ctx, s, sqlstore.PutTrainingRun, workspace, m)
}

// GetTrainingRun returns a training run of the workspace.
func (s *Store) GetTrainingRun(ctx context.Context, workspace, id string) (*loopsv1.TrainingRun, error) {
	return get(ctx, s.r, sqlstore.GetTrainingRun(workspace, id))
}

// ListTrainingRuns lists the workspace's training runs, newest first, and the total count.
func (s *Store) ListTrainingRuns(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.TrainingRun, int64, error) {
	return list(ctx, s.r, "training runs", sqlstore.NewTrainingRun, sqlstore.ListTrainingRuns, page, workspace)
}

// ListAllTrainingRuns lists every run of every workspace, newest first.
func (s *Store) ListAllTrainingRuns(ctx context.Context) ([]store.OwnedTrainingRun, error) {
	var out []store.OwnedTrainingRun
	err := s.query(ctx, "list all training runs", sqlstore.ListAllTrainingRuns, nil, func(rows *sql.Rows) error {
		return sqlstore.ScanOwned(rows, sqlstore.NewTrainingRun, func(ws string, m *loopsv1.TrainingRun) {
			out = append(out, store.OwnedTrainingRun{Workspace: ws, Run: m})
		})
	})
	return out, err
}

// ListSessionTrainingRuns lists the training runs of one session of the workspace, oldest
// first.
func (s *Store) ListSessionTrainingRuns(ctx context.Context, workspace, sessionID string) ([]*loopsv1.TrainingRun, error) {
	return messages(ctx, s, "list a session's training runs", sqlstore.NewTrainingRun,
		sqlstore.ListSessionTrainingRuns, workspace, sessionID)
}

// PutCheckpoint inserts or replaces a checkpoint, keyed by (training_run_id, id).
func (s *Store) PutCheckpoint(ctx context.Context, workspace string, m *loopsv1.Checkpoint) error {
	return put(ctx, s, sqlstore.PutCheckpoint, workspace, m)
}

// GetCheckpoint returns a checkpoint of the workspace by run and checkpoint id.
func (s *Store) GetCheckpoint(ctx context.Context, workspace, runID, checkpointID string) (*loopsv1.Checkpoint, error) {
	return get(ctx, s.r, sqlstore.GetCheckpoint(workspace, runID, checkpointID))
}

// GetCheckpointAnyWorkspace returns a checkpoint and its owner's workspace.
func (s *Store) GetCheckpointAnyWorkspace(ctx context.Context, runID, checkpointID string) (*loopsv1.Checkpoint, string, error) {
	var workspace string
	var data []byte
	err := s.r.QueryRowContext(ctx, sqlstore.GetCheckpointAnyWorkspace, runID, checkpointID).Scan(&workspace, &data)
	m, err := sqlstore.GetCheckpoint(workspace, runID, checkpointID).Decode(data, errors.Is(err, sql.ErrNoRows), err)
	if err != nil {
		return nil, "", err
	}
	return m, workspace, nil
}

// ListCheckpoints lists the workspace's checkpoints, of one run when runID is not empty,
// newest first, and the total count.
func (s *Store) ListCheckpoints(ctx context.Context, workspace, runID string, page store.Page) ([]*loopsv1.Checkpoint, int64, error) {
	if runID == "" {
		return list(ctx, s.r, "checkpoints", sqlstore.NewCheckpoint, sqlstore.ListCheckpoints, page, workspace)
	}
	return list(ctx, s.r, "checkpoints", sqlstore.NewCheckpoint, sqlstore.ListRunCheckpoints, page, workspace, runID)
}

// DeleteCheckpoint removes a checkpoint record of the workspace.
func (s *Store) DeleteCheckpoint(ctx context.Context, workspace, runID, checkpointID string) error {
	return s.deleteOne(ctx, "checkpoint "+runID+"/"+checkpointID, sqlstore.DeleteCheckpoint, runID, checkpointID, workspace)
}

// ListExpiredCheckpoints lists checkpoints of all workspaces whose expire_time is before now,
// newest first.
func (s *Store) ListExpiredCheckpoints(ctx context.Context, now time.Time) ([]store.OwnedCheckpoint, error) {
	var out []store.OwnedCheckpoint
	err := s.query(ctx, "list expired checkpoints", sqlstore.ListExpiredCheckpoints, []any{now.UnixNano()}, func(rows *sql.Rows) error {
		return sqlstore.ScanOwned(rows, sqlstore.NewCheckpoint, func(ws string, m *loopsv1.Checkpoint) {
			out = append(out, store.OwnedCheckpoint{Workspace: ws, Checkpoint: m})
		})
	})
	return out, err
}

// PutSampler inserts or replaces a sampler.
func (s *Store) PutSampler(ctx context.Context, workspace string, m *loopsv1.Sampler) error {
	return put(ctx, s, sqlstore.PutSampler, workspace, m)
}

// GetSampler returns a sampler of the workspace.
func (s *Store) GetSampler(ctx context.Context, workspace, id string) (*loopsv1.Sampler, error) {
	return get(ctx, s.r, sqlstore.GetSampler(workspace, id))
}

// PutOperation inserts or replaces an operation.
func (s *Store) PutOperation(ctx context.Context, workspace string, m *loopsv1.Operation) error {
	return put(ctx, s, sqlstore.PutOperation, workspace, m)
}

// GetOperation returns an operation of the workspace.
func (s *Store) GetOperation(ctx context.Context, workspace, id string) (*loopsv1.Operation, error) {
	return get(ctx, s.r, sqlstore.GetOperation(workspace, id))
}

// ApplyBatch writes the batch's training runs, then its operations, then its step metrics
// (downsampling runs over the bound), in one transaction.
func (s *Store) ApplyBatch(ctx context.Context, b store.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	writes, err := sqlstore.BatchWrites(b)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	receipts, err := sqlstore.ReceiptStepWrites(sqlstore.SQLite, b.ReceiptSteps)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	writes = append(writes, receipts...)
	metrics, metricRuns, err := sqlstore.PlanStepMetrics(&s.metricsCheck, b.StepMetrics)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		p := &preparedTx{tx: tx, stmts: map[string]*sql.Stmt{}}
		for _, w := range writes {
			if err := execWrite(ctx, p, w); err != nil {
				return err
			}
		}
		return s.putStepMetrics(ctx, tx, metrics, metricRuns)
	})
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	return nil
}

// preparedTx runs a query that a batch uses more than once through a statement prepared once
// per transaction (the statements close with it); a query used once runs as is.
type preparedTx struct {
	tx    *sql.Tx
	stmts map[string]*sql.Stmt // nil value: used once so far
}

func (p *preparedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, ok := p.stmts[query]
	if !ok {
		p.stmts[query] = nil
		return p.tx.ExecContext(ctx, query, args...)
	}
	if st == nil {
		var err error
		if st, err = p.tx.PrepareContext(ctx, query); err != nil {
			return nil, err
		}
		p.stmts[query] = st
	}
	return st.ExecContext(ctx, args...)
}

// FailUnfinishedOperations marks every operation that is not done as failed with error e
// and done_time now, in the stored message as well as in the columns, and returns how many
// it changed.
func (s *Store) FailUnfinishedOperations(ctx context.Context, e *loopsv1.OperationError, now time.Time) (int, error) {
	n, err := s.updateRows(ctx, sqlstore.SQLite.SelectUnfinishedOperations(), nil, func(r sqlstore.Row) (sqlstore.Query, error) {
		return sqlstore.FailOperation(r, e, now)
	})
	if err != nil {
		return 0, fmt.Errorf("store: fail unfinished operations: %w", err)
	}
	return n, nil
}

// DeleteOperationsDoneBefore removes finished operations whose done_time is before t and
// returns how many it removed. Operations that are not done, or done without a done_time,
// are kept.
func (s *Store) DeleteOperationsDoneBefore(ctx context.Context, t time.Time) (int, error) {
	n, err := s.exec(ctx, sqlstore.DeleteOperationsDoneBefore, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: delete operations done before %s: %w", t, err)
	}
	return int(n), nil
}

// inTx runs fn in a transaction on the writer connection and commits it.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// updateRows selects (id, data) rows with query in a transaction, and runs the update that
// update returns for each; it returns how many it updated.
func (s *Store) updateRows(ctx context.Context, query string, args []any, update func(sqlstore.Row) (sqlstore.Query, error)) (int, error) {
	n := 0
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		selected, err := sqlstore.ScanRows(rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		for _, r := range selected {
			q, err := update(r)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q.SQL, q.Args...); err != nil {
				return fmt.Errorf("update %s: %w", r.ID, err)
			}
		}
		n = len(selected)
		return nil
	})
	return n, err
}

// execer is the writer connection or a transaction on it.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// execWrite runs an upsert and checks that it changed its row.
func execWrite(ctx context.Context, w execer, wr sqlstore.Write) error {
	res, err := w.ExecContext(ctx, wr.SQL, wr.Args...)
	if err != nil {
		return wr.Err(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wr.Err(err)
	}
	return wr.Check(n)
}

// put writes m with the upsert that write returns for it.
func put[M any](ctx context.Context, s *Store, write func(string, M) (sqlstore.Write, error), workspace string, m M) error {
	w, err := write(workspace, m)
	if err == nil {
		err = execWrite(ctx, s.w, w)
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// exec runs one statement on the writer connection and returns how many rows it changed.
func (s *Store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.w.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// deleteOne runs a delete of one record of a workspace: store.ErrNotFound when it deletes
// none.
func (s *Store) deleteOne(ctx context.Context, what, query string, args ...any) error {
	n, err := s.exec(ctx, query, args...)
	if err == nil && n == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("store: delete %s: %w", what, err)
	}
	return nil
}

// get runs g's lookup on db.
func get[M proto.Message](ctx context.Context, db *sql.DB, g sqlstore.Get[M]) (M, error) {
	var data []byte
	err := db.QueryRowContext(ctx, g.SQL, g.Args...).Scan(&data)
	return g.Decode(data, errors.Is(err, sql.ErrNoRows), err)
}

// list runs, in one read transaction, q's count and q's page, both with args.
func list[M proto.Message](ctx context.Context, db *sql.DB, kind string, newMsg func() M, q sqlstore.ListQuery, page store.Page, args ...any) ([]M, int64, error) {
	query, qargs, limit, offset := q.Page(page, args)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s: begin: %w", kind, err)
	}
	defer func() { _ = tx.Rollback() }()

	var total int64
	if err := tx.QueryRowContext(ctx, q.Count, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: list %s: count: %w", kind, err)
	}
	rows, err := tx.QueryContext(ctx, query, qargs...)
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s: %w", kind, err)
	}
	defer func() { _ = rows.Close() }()
	out, err := sqlstore.ScanData(rows, newMsg, make([]M, 0, sqlstore.PageCap(limit, offset, total)))
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s: %w", kind, err)
	}
	return out, total, nil
}

// query runs a read on the readers' pool and hands its rows to scan.
func (s *Store) query(ctx context.Context, what, query string, args []any, scan func(*sql.Rows) error) error {
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err == nil {
		err = scan(rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return nil
}

// messages runs a read of (workspace, data) rows of one workspace's records.
func messages[M proto.Message](ctx context.Context, s *Store, what string, newMsg func() M, query string, args ...any) ([]M, error) {
	var out []M
	err := s.query(ctx, what, query, args, func(rows *sql.Rows) error {
		var err error
		out, err = sqlstore.ScanMessages(rows, newMsg)
		return err
	})
	return out, err
}
