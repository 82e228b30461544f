package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Paging limits; see store.Page.
const (
	defaultLimit = 100
	maxLimit     = 1000
)

// PutSession inserts or replaces a session.
func (s *Store) PutSession(ctx context.Context, workspace string, m *loopsv1.Session) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put session: missing id")
	}
	return s.put(ctx, "session", m.GetId(), m,
		`INSERT INTO sessions (id, workspace, create_time, data) VALUES (?, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET create_time = excluded.create_time, data = excluded.data
		 WHERE sessions.workspace = excluded.workspace`,
		m.GetId(), workspace, nanos(m.GetCreateTime()))
}

// GetSession returns a session of the workspace.
func (s *Store) GetSession(ctx context.Context, workspace, id string) (*loopsv1.Session, error) {
	return get(ctx, s.r, "session", id, newSession,
		`SELECT data FROM sessions WHERE id = ? AND workspace = ?`, id, workspace)
}

// ListSessions lists the workspace's sessions, newest first, and the total count.
func (s *Store) ListSessions(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.Session, int64, error) {
	return list(ctx, s.r, "sessions", newSession, listQuery{
		from:  `SELECT data FROM sessions WHERE workspace = ?`,
		count: `SELECT COUNT(*) FROM sessions WHERE workspace = ?`,
	}, page, workspace)
}

// PutTrainingRun inserts or replaces a training run.
func (s *Store) PutTrainingRun(ctx context.Context, workspace string, m *loopsv1.TrainingRun) error {
	return putTrainingRun(ctx, s.w, workspace, m)
}

func putTrainingRun(ctx context.Context, w execer, workspace string, m *loopsv1.TrainingRun) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put training run: missing id")
	}
	return put(ctx, w, "training run", m.GetId(), m,
		`INSERT INTO training_runs (id, workspace, session_id, create_time, data) VALUES (?, ?, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET session_id = excluded.session_id,
		   create_time = excluded.create_time, data = excluded.data
		 WHERE training_runs.workspace = excluded.workspace`,
		m.GetId(), workspace, m.GetSessionId(), nanos(m.GetCreateTime()))
}

// GetTrainingRun returns a training run of the workspace.
func (s *Store) GetTrainingRun(ctx context.Context, workspace, id string) (*loopsv1.TrainingRun, error) {
	return get(ctx, s.r, "training run", id, newTrainingRun,
		`SELECT data FROM training_runs WHERE id = ? AND workspace = ?`, id, workspace)
}

// ListTrainingRuns lists the workspace's training runs, newest first, and the total count.
func (s *Store) ListTrainingRuns(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.TrainingRun, int64, error) {
	return list(ctx, s.r, "training runs", newTrainingRun, listQuery{
		from:  `SELECT data FROM training_runs WHERE workspace = ?`,
		count: `SELECT COUNT(*) FROM training_runs WHERE workspace = ?`,
	}, page, workspace)
}

// ListAllTrainingRuns lists every run of every workspace, newest first.
func (s *Store) ListAllTrainingRuns(ctx context.Context) ([]store.OwnedTrainingRun, error) {
	var out []store.OwnedTrainingRun
	err := scanOwned(ctx, s.r, "list all training runs",
		`SELECT workspace, data FROM training_runs ORDER BY create_time DESC, id DESC`, nil,
		func(workspace string, data []byte) error {
			m := &loopsv1.TrainingRun{}
			if err := proto.Unmarshal(data, m); err != nil {
				return err
			}
			out = append(out, store.OwnedTrainingRun{Workspace: workspace, Run: m})
			return nil
		})
	return out, err
}

// ListSessionTrainingRuns lists the training runs of one session of the workspace, oldest
// first.
func (s *Store) ListSessionTrainingRuns(ctx context.Context, workspace, sessionID string) ([]*loopsv1.TrainingRun, error) {
	var out []*loopsv1.TrainingRun
	err := scanOwned(ctx, s.r, "list a session's training runs",
		`SELECT workspace, data FROM training_runs WHERE workspace = ? AND session_id = ? ORDER BY create_time, id`,
		[]any{workspace, sessionID},
		func(_ string, data []byte) error {
			m := &loopsv1.TrainingRun{}
			if err := proto.Unmarshal(data, m); err != nil {
				return err
			}
			out = append(out, m)
			return nil
		})
	return out, err
}

// PutCheckpoint inserts or replaces a checkpoint, keyed by (training_run_id, id).
func (s *Store) PutCheckpoint(ctx context.Context, workspace string, m *loopsv1.Checkpoint) error {
	if m == nil || m.GetId() == "" || m.GetTrainingRunId() == "" {
		return errors.New("store: put checkpoint: missing id or training_run_id")
	}
	var expire sql.NullInt64
	if m.GetExpireTime() != nil {
		expire = sql.NullInt64{Int64: nanos(m.GetExpireTime()), Valid: true}
	}
	return s.put(ctx, "checkpoint", m.GetTrainingRunId()+"/"+m.GetId(), m,
		`INSERT INTO checkpoints (training_run_id, id, workspace, create_time, public, expire_time, data)
		 VALUES (?, ?, ?, ?, ?, ?, ?)
		 ON CONFLICT (training_run_id, id) DO UPDATE SET create_time = excluded.create_time,
		   public = excluded.public, expire_time = excluded.expire_time, data = excluded.data
		 WHERE checkpoints.workspace = excluded.workspace`,
		m.GetTrainingRunId(), m.GetId(), workspace, nanos(m.GetCreateTime()), m.GetPublic(), expire)
}

// GetCheckpoint returns a checkpoint of the workspace by run and checkpoint id.
func (s *Store) GetCheckpoint(ctx context.Context, workspace, runID, checkpointID string) (*loopsv1.Checkpoint, error) {
	return get(ctx, s.r, "checkpoint", runID+"/"+checkpointID, newCheckpoint,
		`SELECT data FROM checkpoints WHERE training_run_id = ? AND id = ? AND workspace = ?`,
		runID, checkpointID, workspace)
}

// GetCheckpointAnyWorkspace returns a checkpoint and its owner's workspace.
func (s *Store) GetCheckpointAnyWorkspace(ctx context.Context, runID, checkpointID string) (*loopsv1.Checkpoint, string, error) {
	var workspace string
	var data []byte
	err := s.r.QueryRowContext(ctx,
		`SELECT workspace, data FROM checkpoints WHERE training_run_id = ? AND id = ?`,
		runID, checkpointID).Scan(&workspace, &data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", fmt.Errorf("store: get checkpoint %s/%s: %w", runID, checkpointID, store.ErrNotFound)
	}
	if err != nil {
		return nil, "", fmt.Errorf("store: get checkpoint %s/%s: %w", runID, checkpointID, err)
	}
	m := &loopsv1.Checkpoint{}
	if err := proto.Unmarshal(data, m); err != nil {
		return nil, "", fmt.Errorf("store: get checkpoint %s/%s: decode: %w", runID, checkpointID, err)
	}
	return m, workspace, nil
}

// ListCheckpoints lists the workspace's checkpoints, of one run when runID is not empty,
// newest first, and the total count.
func (s *Store) ListCheckpoints(ctx context.Context, workspace, runID string, page store.Page) ([]*loopsv1.Checkpoint, int64, error) {
	if runID == "" {
		return list(ctx, s.r, "checkpoints", newCheckpoint, listQuery{
			from:    `SELECT data FROM checkpoints WHERE workspace = ?`,
			count:   `SELECT COUNT(*) FROM checkpoints WHERE workspace = ?`,
			withRun: true,
		}, page, workspace)
	}
	return list(ctx, s.r, "checkpoints", newCheckpoint, listQuery{
		from:  `SELECT data FROM checkpoints WHERE workspace = ? AND training_run_id = ?`,
		count: `SELECT COUNT(*) FROM checkpoints WHERE workspace = ? AND training_run_id = ?`,
	}, page, workspace, runID)
}

// DeleteCheckpoint removes a checkpoint record of the workspace.
func (s *Store) DeleteCheckpoint(ctx context.Context, workspace, runID, checkpointID string) error {
	res, err := s.w.ExecContext(ctx,
		`DELETE FROM checkpoints WHERE training_run_id = ? AND id = ? AND workspace = ?`,
		runID, checkpointID, workspace)
	if err != nil {
		return fmt.Errorf("store: delete checkpoint %s/%s: %w", runID, checkpointID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: delete checkpoint %s/%s: %w", runID, checkpointID, err)
	}
	if n == 0 {
		return fmt.Errorf("store: delete checkpoint %s/%s: %w", runID, checkpointID, store.ErrNotFound)
	}
	return nil
}

// ListExpiredCheckpoints lists checkpoints of all workspaces whose expire_time is before now,
// newest first.
func (s *Store) ListExpiredCheckpoints(ctx context.Context, now time.Time) ([]store.OwnedCheckpoint, error) {
	var out []store.OwnedCheckpoint
	err := scanOwned(ctx, s.r, "list expired checkpoints",
		`SELECT workspace, data FROM checkpoints
		 WHERE expire_time IS NOT NULL AND expire_time < ?
		 ORDER BY create_time DESC, training_run_id DESC, id DESC`, []any{now.UnixNano()},
		func(workspace string, data []byte) error {
			m := &loopsv1.Checkpoint{}
			if err := proto.Unmarshal(data, m); err != nil {
				return err
			}
			out = append(out, store.OwnedCheckpoint{Workspace: workspace, Checkpoint: m})
			return nil
		})
	return out, err
}

// PutSampler inserts or replaces a sampler.
func (s *Store) PutSampler(ctx context.Context, workspace string, m *loopsv1.Sampler) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put sampler: missing id")
	}
	return s.put(ctx, "sampler", m.GetId(), m,
		`INSERT INTO samplers (id, workspace, session_id, create_time, data) VALUES (?, ?, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET session_id = excluded.session_id,
		   create_time = excluded.create_time, data = excluded.data
		 WHERE samplers.workspace = excluded.workspace`,
		m.GetId(), workspace, m.GetSessionId(), nanos(m.GetCreateTime()))
}

// GetSampler returns a sampler of the workspace.
func (s *Store) GetSampler(ctx context.Context, workspace, id string) (*loopsv1.Sampler, error) {
	return get(ctx, s.r, "sampler", id, newSampler,
		`SELECT data FROM samplers WHERE id = ? AND workspace = ?`, id, workspace)
}

// PutOperation inserts or replaces an operation.
func (s *Store) PutOperation(ctx context.Context, workspace string, m *loopsv1.Operation) error {
	return putOperation(ctx, s.w, workspace, m)
}

func putOperation(ctx context.Context, w execer, workspace string, m *loopsv1.Operation) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put operation: missing id")
	}
	return put(ctx, w, "operation", m.GetId(), m,
		`INSERT INTO operations (id, workspace, training_run_id, create_time, state, done, done_time, data)
		 VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET training_run_id = excluded.training_run_id,
		   create_time = excluded.create_time, state = excluded.state, done = excluded.done,
		   done_time = excluded.done_time, data = excluded.data
		 WHERE operations.workspace = excluded.workspace`,
		m.GetId(), workspace, m.GetTrainingRunId(), nanos(m.GetCreateTime()),
		int64(m.GetState()), isDone(m.GetState()), nullNanos(m.GetDoneTime()))
}

// ApplyBatch writes the batch's training runs, then its operations, then its step metrics
// (downsampling runs over the bound), in one transaction.
func (s *Store) ApplyBatch(ctx context.Context, b store.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: apply batch: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	w := &preparedTx{tx: tx, stmts: map[string]*sql.Stmt{}}
	for _, r := range b.TrainingRuns {
		if err := putTrainingRun(ctx, w, r.Workspace, r.Run); err != nil {
			return fmt.Errorf("store: apply batch: %w", err)
		}
	}
	for _, o := range b.Operations {
		if err := putOperation(ctx, w, o.Workspace, o.Operation); err != nil {
			return fmt.Errorf("store: apply batch: %w", err)
		}
	}
	if err := s.putStepMetrics(ctx, tx, b.StepMetrics); err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: apply batch: commit: %w", err)
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

// GetOperation returns an operation of the workspace.
func (s *Store) GetOperation(ctx context.Context, workspace, id string) (*loopsv1.Operation, error) {
	return get(ctx, s.r, "operation", id, newOperation,
		`SELECT data FROM operations WHERE id = ? AND workspace = ?`, id, workspace)
}

// FailUnfinishedOperations marks every operation that is not done as failed with error e
// and done_time now, in the stored message as well as in the columns, and returns how many
// it changed.
func (s *Store) FailUnfinishedOperations(ctx context.Context, e *loopsv1.OperationError, now time.Time) (int, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: fail unfinished operations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()

	type row struct {
		id   string
		data []byte
	}
	var pending []row
	rows, err := tx.QueryContext(ctx, `SELECT id, data FROM operations WHERE done = 0`)
	if err != nil {
		return 0, fmt.Errorf("store: fail unfinished operations: %w", err)
	}
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.data); err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("store: fail unfinished operations: %w", err)
		}
		pending = append(pending, r)
	}
	if err := rows.Close(); err != nil {
		return 0, fmt.Errorf("store: fail unfinished operations: %w", err)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("store: fail unfinished operations: %w", err)
	}

	doneTime := timestamppb.New(now)
	for _, r := range pending {
		op := &loopsv1.Operation{}
		if err := proto.Unmarshal(r.data, op); err != nil {
			return 0, fmt.Errorf("store: fail unfinished operations: decode %s: %w", r.id, err)
		}
		op.State = loopsv1.OperationState_OPERATION_STATE_FAILED
		op.Error = proto.CloneOf(e)
		op.DoneTime = doneTime
		data, err := proto.Marshal(op)
		if err != nil {
			return 0, fmt.Errorf("store: fail unfinished operations: encode %s: %w", r.id, err)
		}
		if _, err := tx.ExecContext(ctx,
			`UPDATE operations SET state = ?, done = 1, done_time = ?, data = ? WHERE id = ?`,
			int64(op.GetState()), now.UnixNano(), data, r.id); err != nil {
			return 0, fmt.Errorf("store: fail unfinished operations: update %s: %w", r.id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: fail unfinished operations: commit: %w", err)
	}
	return len(pending), nil
}

// DeleteOperationsDoneBefore removes finished operations whose done_time is before t and
// returns how many it removed. Operations that are not done, or done without a done_time,
// are kept.
func (s *Store) DeleteOperationsDoneBefore(ctx context.Context, t time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx,
		`DELETE FROM operations WHERE done = 1 AND done_time IS NOT NULL AND done_time < ?`, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: delete operations done before %s: %w", t, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("store: delete operations done before %s: %w", t, err)
	}
	return int(n), nil
}

// put marshals m and runs the upsert query with args followed by the marshalled message.
// The upsert must only update a row of the same workspace; when it changes no row, the id
// belongs to another workspace and put fails.
func (s *Store) put(ctx context.Context, kind, id string, m proto.Message, query string, args ...any) error {
	return put(ctx, s.w, kind, id, m, query, args...)
}

// execer is the writer connection or a transaction on it.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// put is Store.put on w.
func put(ctx context.Context, w execer, kind, id string, m proto.Message, query string, args ...any) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("store: put %s %s: encode: %w", kind, id, err)
	}
	res, err := w.ExecContext(ctx, query, append(args, data)...)
	if err != nil {
		return fmt.Errorf("store: put %s %s: %w", kind, id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: put %s %s: %w", kind, id, err)
	}
	if n == 0 {
		return fmt.Errorf("store: put %s %s: id belongs to another workspace", kind, id)
	}
	return nil
}

// get runs query, which selects one data column, and unmarshals the row into a new message.
func get[M proto.Message](ctx context.Context, db *sql.DB, kind, id string, newMsg func() M, query string, args ...any) (M, error) {
	var zero M
	var data []byte
	err := db.QueryRowContext(ctx, query, args...).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return zero, fmt.Errorf("store: get %s %s: %w", kind, id, store.ErrNotFound)
	}
	if err != nil {
		return zero, fmt.Errorf("store: get %s %s: %w", kind, id, err)
	}
	m := newMsg()
	if err := proto.Unmarshal(data, m); err != nil {
		return zero, fmt.Errorf("store: get %s %s: decode: %w", kind, id, err)
	}
	return m, nil
}

// listQuery is a list's SQL: from selects one data column with a WHERE clause, count counts
// the whole list with the same arguments. withRun orders by training_run_id between
// create_time and id (checkpoints of every run).
type listQuery struct {
	from, count string
	withRun     bool
}

// list runs, in one read transaction, q.count and q.from (with the page's keyset condition,
// the list order, LIMIT and OFFSET), both with args.
func list[M proto.Message](ctx context.Context, db *sql.DB, kind string, newMsg func() M, q listQuery, page store.Page, args ...any) ([]M, int64, error) {
	limit := page.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxLimit)
	offset := max(page.Offset, 0)
	query, qargs := q.from, slices.Clone(args)
	if c := page.After; c != nil {
		if q.withRun {
			query += ` AND (create_time, training_run_id, id) < (?, ?, ?)`
			qargs = append(qargs, c.CreateTime.UnixNano(), c.TrainingRunID, c.ID)
		} else {
			query += ` AND (create_time, id) < (?, ?)`
			qargs = append(qargs, c.CreateTime.UnixNano(), c.ID)
		}
	}
	if q.withRun {
		query += ` ORDER BY create_time DESC, training_run_id DESC, id DESC`
	} else {
		query += ` ORDER BY create_time DESC, id DESC`
	}
	query += ` LIMIT ? OFFSET ?`

	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s: begin: %w", kind, err)
	}
	defer func() { _ = tx.Rollback() }()

	var total int64
	if err := tx.QueryRowContext(ctx, q.count, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: list %s: count: %w", kind, err)
	}
	rows, err := tx.QueryContext(ctx, query, append(qargs, limit, offset)...)
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s: %w", kind, err)
	}
	defer func() { _ = rows.Close() }()
	out := make([]M, 0, min(limit, max(int(total)-offset, 0)))
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, 0, fmt.Errorf("store: list %s: %w", kind, err)
		}
		m := newMsg()
		if err := proto.Unmarshal(data, m); err != nil {
			return nil, 0, fmt.Errorf("store: list %s: decode: %w", kind, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("store: list %s: %w", kind, err)
	}
	return out, total, nil
}

// scanOwned runs query, which selects workspace and data columns, and calls fn for each row.
func scanOwned(ctx context.Context, db *sql.DB, what, query string, args []any, fn func(workspace string, data []byte) error) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var workspace string
		var data []byte
		if err := rows.Scan(&workspace, &data); err != nil {
			return fmt.Errorf("store: %s: %w", what, err)
		}
		if err := fn(workspace, data); err != nil {
			return fmt.Errorf("store: %s: decode: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return nil
}

// nanos returns ts in unix nanoseconds, 0 when unset.
func nanos(ts *timestamppb.Timestamp) int64 {
	if ts == nil {
		return 0
	}
	return ts.AsTime().UnixNano()
}

// nullNanos returns ts in unix nanoseconds, NULL when unset.
func nullNanos(ts *timestamppb.Timestamp) sql.NullInt64 {
	if ts == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: nanos(ts), Valid: true}
}

// isDone reports whether an operation in state st has finished.
func isDone(st loopsv1.OperationState) bool {
	return st == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED ||
		st == loopsv1.OperationState_OPERATION_STATE_FAILED
}

func newSession() *loopsv1.Session         { return &loopsv1.Session{} }
func newTrainingRun() *loopsv1.TrainingRun { return &loopsv1.TrainingRun{} }
func newCheckpoint() *loopsv1.Checkpoint   { return &loopsv1.Checkpoint{} }
func newSampler() *loopsv1.Sampler         { return &loopsv1.Sampler{} }
func newOperation() *loopsv1.Operation     { return &loopsv1.Operation{} }
