package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	rows, err := s.exec(ctx, sqlstore.Query{SQL: w.SQL, Args: w.Args}, labels)
	if err == nil {
		err = w.Check(rows[0])
	} else {
		err = w.Err(err)
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// GetSession returns a session of the workspace.
func (s *Store) GetSession(ctx context.Context, workspace, id string) (*loopsv1.Session, error) {
	return get(ctx, s, sqlstore.GetSession(workspace, id))
}

// ListSessions lists the workspace's sessions, newest first, and the total count.
func (s *Store) ListSessions(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.Session, int64, error) {
	return list(ctx, s, "sessions", sqlstore.NewSession, sqlstore.ListSessions, page, workspace)
}

// PutTrainingRun inserts or replaces a training run.
func (s *Store) PutTrainingRun(ctx context.Context, workspace string, m *loopsv1.TrainingRun) error {
	return put(ctx, s, sqlstore.PutTrainingRun, workspace, m)
}

// GetTrainingRun returns a training run of the workspace.
func (s *Store) GetTrainingRun(ctx context.Context, workspace, id string) (*loopsv1.TrainingRun, error) {
	return get(ctx, s, sqlstore.GetTrainingRun(workspace, id))
}

// ListTrainingRuns lists the workspace's training runs, newest first, and the total count.
func (s *Store) ListTrainingRuns(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.TrainingRun, int64, error) {
	return list(ctx, s, "training runs", sqlstore.NewTrainingRun, sqlstore.ListTrainingRuns, page, workspace)
}

// ListAllTrainingRuns lists every run of every workspace, newest first.
func (s *Store) ListAllTrainingRuns(ctx context.Context) ([]store.OwnedTrainingRun, error) {
	var out []store.OwnedTrainingRun
	err := s.query(ctx, "list all training runs", sqlstore.ListAllTrainingRuns, nil, func(rows pgx.Rows) error {
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
	return get(ctx, s, sqlstore.GetCheckpoint(workspace, runID, checkpointID))
}

// GetCheckpointAnyWorkspace returns a checkpoint and its owner's workspace.
func (s *Store) GetCheckpointAnyWorkspace(ctx context.Context, runID, checkpointID string) (*loopsv1.Checkpoint, string, error) {
	var workspace string
	var data []byte
	err := s.pool.QueryRow(ctx, sqlstore.GetCheckpointAnyWorkspace, runID, checkpointID).Scan(&workspace, &data)
	m, err := sqlstore.GetCheckpoint(workspace, runID, checkpointID).Decode(data, errors.Is(err, pgx.ErrNoRows), err)
	if err != nil {
		return nil, "", err
	}
	return m, workspace, nil
}

// ListCheckpoints lists the workspace's checkpoints, of one run when runID is not empty,
// newest first, and the total count.
func (s *Store) ListCheckpoints(ctx context.Context, workspace, runID string, page store.Page) ([]*loopsv1.Checkpoint, int64, error) {
	if runID == "" {
		return list(ctx, s, "checkpoints", sqlstore.NewCheckpoint, sqlstore.ListCheckpoints, page, workspace)
	}
	return list(ctx, s, "checkpoints", sqlstore.NewCheckpoint, sqlstore.ListRunCheckpoints, page, workspace, runID)
}

// DeleteCheckpoint removes a checkpoint record of the workspace.
func (s *Store) DeleteCheckpoint(ctx context.Context, workspace, runID, checkpointID string) error {
	return s.deleteOne(ctx, "checkpoint "+runID+"/"+checkpointID, sqlstore.DeleteCheckpoint, runID, checkpointID, workspace)
}

// ListExpiredCheckpoints lists checkpoints of all workspaces whose expire_time is before now,
// newest first.
func (s *Store) ListExpiredCheckpoints(ctx context.Context, now time.Time) ([]store.OwnedCheckpoint, error) {
	var out []store.OwnedCheckpoint
	err := s.query(ctx, "list expired checkpoints", sqlstore.ListExpiredCheckpoints, []any{now.UnixNano()}, func(rows pgx.Rows) error {
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
	return get(ctx, s, sqlstore.GetSampler(workspace, id))
}

// PutOperation inserts or replaces an operation.
func (s *Store) PutOperation(ctx context.Context, workspace string, m *loopsv1.Operation) error {
	return put(ctx, s, sqlstore.PutOperation, workspace, m)
}

// GetOperation returns an operation of the workspace.
func (s *Store) GetOperation(ctx context.Context, workspace, id string) (*loopsv1.Operation, error) {
	return get(ctx, s, sqlstore.GetOperation(workspace, id))
}

// ApplyBatch writes the batch's training runs, then its operations, then its step metrics
// (downsampling runs over the bound, after the batch), in one transaction: BEGIN and every
// write go to the server as one pipelined batch, and the fence check and COMMIT as a second
// one (sqlstore.BatchWrites: in id order, so that concurrent batches cannot deadlock).
func (s *Store) ApplyBatch(ctx context.Context, b store.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	writes, err := sqlstore.BatchWrites(b)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	receipts, err := sqlstore.ReceiptStepWrites(sqlstore.Postgres, b.ReceiptSteps)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	writes = append(writes, receipts...)
	metrics, metricRuns, err := sqlstore.PlanStepMetrics(&s.metricsCheck, b.StepMetrics)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	err = s.tx(ctx, func(tx *writeTx) error {
		var pb pgx.Batch
		for _, w := range writes {
			pb.Queue(w.SQL, w.Args...)
		}
		for _, args := range metrics {
			pb.Queue(sqlstore.Postgres.InsertStepMetrics, args...)
		}
		for _, id := range metricRuns {
			pb.Queue(sqlstore.CountStepMetrics, id)
		}
		br := tx.SendBatch(ctx, &pb)
		for _, w := range writes {
			tag, err := br.Exec()
			if err == nil {
				err = w.Check(tag.RowsAffected())
			} else {
				err = w.Err(err)
			}
			if err != nil {
				_ = br.Close()
				return err
			}
		}
		for _, args := range metrics {
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return fmt.Errorf("put step metrics %s/%d: %w", args[0], args[1], err)
			}
		}
		counts := make([]int, len(metricRuns))
		for i, id := range metricRuns {
			if err := br.QueryRow().Scan(&counts[i]); err != nil {
				_ = br.Close()
				return fmt.Errorf("count step metrics of %s: %w", id, err)
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
		for i, id := range metricRuns {
			if err := compactStepMetrics(ctx, tx, id, counts[i]); err != nil {
				return fmt.Errorf("downsample step metrics of %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	return nil
}

// FailUnfinishedOperations marks every operation that is not done as failed with error e
// and done_time now, in the stored message as well as in the columns, and returns how many
// it changed.
func (s *Store) FailUnfinishedOperations(ctx context.Context, e *loopsv1.OperationError, now time.Time) (int, error) {
	n, err := s.updateRows(ctx, sqlstore.Postgres.SelectUnfinishedOperations(), nil, func(r sqlstore.Row) (sqlstore.Query, error) {
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
	rows, err := s.exec(ctx, sqlstore.Query{SQL: sqlstore.DeleteOperationsDoneBefore, Args: []any{t.UnixNano()}})
	if err != nil {
		return 0, fmt.Errorf("store: delete operations done before %s: %w", t, err)
	}
	return int(rows[0]), nil
}

// updateRows selects (id, data) rows with query (which locks them) in a write transaction,
// and runs the update that update returns for each, pipelined; it returns how many it
// updated.
func (s *Store) updateRows(ctx context.Context, query string, args []any, update func(sqlstore.Row) (sqlstore.Query, error)) (int, error) {
	n := 0
	err := s.tx(ctx, func(tx *writeTx) error {
		rows, err := tx.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		selected, err := sqlstore.ScanRows(rows)
		rows.Close()
		if err != nil {
			return err
		}
		var b pgx.Batch
		for _, r := range selected {
			q, err := update(r)
			if err != nil {
				return err
			}
			queue(&b, q)
		}
		n = len(selected) // a transaction run again counts again
		if n == 0 {
			return nil
		}
		return tx.SendBatch(ctx, &b).Close()
	})
	return n, err
}

// put writes m with the upsert that write returns for it; when it changes no row, the id
// belongs to another workspace and put fails (having changed nothing).
func put[M any](ctx context.Context, s *Store, write func(string, M) (sqlstore.Write, error), workspace string, m M) error {
	w, err := write(workspace, m)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	rows, err := s.exec(ctx, sqlstore.Query{SQL: w.SQL, Args: w.Args})
	if err == nil {
		err = w.Check(rows[0])
	} else {
		err = w.Err(err)
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// deleteOne runs a delete of one record of a workspace: store.ErrNotFound when it deletes
// none.
func (s *Store) deleteOne(ctx context.Context, what, query string, args ...any) error {
	rows, err := s.exec(ctx, sqlstore.Query{SQL: query, Args: args})
	if err == nil && rows[0] == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("store: delete %s: %w", what, err)
	}
	return nil
}

// get runs g's lookup.
func get[M proto.Message](ctx context.Context, s *Store, g sqlstore.Get[M]) (M, error) {
	var data []byte
	err := s.pool.QueryRow(ctx, g.SQL, g.Args...).Scan(&data)
	return g.Decode(data, errors.Is(err, pgx.ErrNoRows), err)
}

// list runs q's count and q's page (with the page's keyset condition, the list's order and
// LIMIT, and OFFSET only when the page asks for one) in one read-only repeatable-read
// transaction, so the rows and the total agree, sent as one pipelined batch: one round trip.
func list[M proto.Message](ctx context.Context, s *Store, kind string, newMsg func() M, q sqlstore.ListQuery, page store.Page, args ...any) ([]M, int64, error) {
	query, qargs, limit, offset := q.Page(page, args)

	var pb pgx.Batch
	pb.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
	pb.Queue(q.Count, args...)
	pb.Queue(query, qargs...)
	pb.Queue(`COMMIT`)
	br := s.pool.SendBatch(ctx, &pb)
	out, total, err := func() ([]M, int64, error) {
		if _, err := br.Exec(); err != nil {
			return nil, 0, fmt.Errorf("begin: %w", err)
		}
		var total int64
		if err := br.QueryRow().Scan(&total); err != nil {
			return nil, 0, fmt.Errorf("count: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			return nil, 0, err
		}
		out, err := sqlstore.ScanData(rows, newMsg, make([]M, 0, sqlstore.PageCap(limit, offset, total)))
		rows.Close()
		if err != nil {
			return nil, 0, err
		}
		if _, err := br.Exec(); err != nil {
			return nil, 0, fmt.Errorf("commit: %w", err)
		}
		return out, total, nil
	}()
	// An error leaves the connection inside the transaction; the pool then discards it.
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s: %w", kind, err)
	}
	return out, total, nil
}

// query runs a read and hands its rows to scan.
func (s *Store) query(ctx context.Context, what, query string, args []any, scan func(pgx.Rows) error) error {
	rows, err := s.pool.Query(ctx, query, args...)
	if err == nil {
		err = scan(rows)
		rows.Close()
	}
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return nil
}

// messages runs a read of (workspace, data) rows of one workspace's records.
func messages[M proto.Message](ctx context.Context, s *Store, what string, newMsg func() M, query string, args ...any) ([]M, error) {
	var out []M
	err := s.query(ctx, what, query, args, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanMessages(rows, newMsg)
		return err
	})
	return out, err
}
