package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
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

// The upserts. Each updates a row only when it belongs to the same workspace; otherwise it
// changes no row and put fails.
const (
	upsertSession = `INSERT INTO sessions (id, workspace, create_time, data) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO UPDATE SET create_time = excluded.create_time, data = excluded.data
		WHERE sessions.workspace = excluded.workspace`
	upsertTrainingRun = `INSERT INTO training_runs (id, workspace, session_id, create_time, data) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET session_id = excluded.session_id,
		  create_time = excluded.create_time, data = excluded.data
		WHERE training_runs.workspace = excluded.workspace`
	upsertCheckpoint = `INSERT INTO checkpoints (training_run_id, id, workspace, create_time, public, expire_time, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (training_run_id, id) DO UPDATE SET create_time = excluded.create_time,
		  public = excluded.public, expire_time = excluded.expire_time, data = excluded.data
		WHERE checkpoints.workspace = excluded.workspace`
	upsertSampler = `INSERT INTO samplers (id, workspace, session_id, create_time, data) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET session_id = excluded.session_id,
		  create_time = excluded.create_time, data = excluded.data
		WHERE samplers.workspace = excluded.workspace`
	upsertOperation = `INSERT INTO operations (id, workspace, training_run_id, create_time, state, done, done_time, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (id) DO UPDATE SET training_run_id = excluded.training_run_id,
		  create_time = excluded.create_time, state = excluded.state, done = excluded.done,
		  done_time = excluded.done_time, data = excluded.data
		WHERE operations.workspace = excluded.workspace`
)

// PutSession inserts or replaces a session.
func (s *Store) PutSession(ctx context.Context, workspace string, m *loopsv1.Session) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put session: missing id")
	}
	return s.put(ctx, "session", m.GetId(), m, upsertSession, m.GetId(), workspace, nanos(m.GetCreateTime()))
}

// GetSession returns a session of the workspace.
func (s *Store) GetSession(ctx context.Context, workspace, id string) (*loopsv1.Session, error) {
	return get(ctx, s, "session", id, newSession,
		`SELECT data FROM sessions WHERE id = $1 AND workspace = $2`, id, workspace)
}

// ListSessions lists the workspace's sessions, newest first, and the total count.
func (s *Store) ListSessions(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.Session, int64, error) {
	return list(ctx, s, "sessions", newSession, listQuery{
		from:  `SELECT data FROM sessions WHERE workspace = $1`,
		count: `SELECT count(*) FROM sessions WHERE workspace = $1`,
	}, page, workspace)
}

// PutTrainingRun inserts or replaces a training run.
func (s *Store) PutTrainingRun(ctx context.Context, workspace string, m *loopsv1.TrainingRun) error {
	if err := checkTrainingRun(m); err != nil {
		return err
	}
	return s.put(ctx, "training run", m.GetId(), m, upsertTrainingRun, trainingRunArgs(workspace, m)...)
}

func checkTrainingRun(m *loopsv1.TrainingRun) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put training run: missing id")
	}
	return nil
}

func trainingRunArgs(workspace string, m *loopsv1.TrainingRun) []any {
	return []any{m.GetId(), workspace, m.GetSessionId(), nanos(m.GetCreateTime())}
}

// GetTrainingRun returns a training run of the workspace.
func (s *Store) GetTrainingRun(ctx context.Context, workspace, id string) (*loopsv1.TrainingRun, error) {
	return get(ctx, s, "training run", id, newTrainingRun,
		`SELECT data FROM training_runs WHERE id = $1 AND workspace = $2`, id, workspace)
}

// ListTrainingRuns lists the workspace's training runs, newest first, and the total count.
func (s *Store) ListTrainingRuns(ctx context.Context, workspace string, page store.Page) ([]*loopsv1.TrainingRun, int64, error) {
	return list(ctx, s, "training runs", newTrainingRun, listQuery{
		from:  `SELECT data FROM training_runs WHERE workspace = $1`,
		count: `SELECT count(*) FROM training_runs WHERE workspace = $1`,
	}, page, workspace)
}

// ListAllTrainingRuns lists every run of every workspace, newest first.
func (s *Store) ListAllTrainingRuns(ctx context.Context) ([]store.OwnedTrainingRun, error) {
	var out []store.OwnedTrainingRun
	err := s.scanOwned(ctx, "list all training runs",
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
	err := s.scanOwned(ctx, "list a session's training runs",
		`SELECT workspace, data FROM training_runs WHERE workspace = $1 AND session_id = $2 ORDER BY create_time, id`,
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
	return s.put(ctx, "checkpoint", m.GetTrainingRunId()+"/"+m.GetId(), m, upsertCheckpoint,
		m.GetTrainingRunId(), m.GetId(), workspace, nanos(m.GetCreateTime()), m.GetPublic(),
		nullNanos(m.GetExpireTime()))
}

// GetCheckpoint returns a checkpoint of the workspace by run and checkpoint id.
func (s *Store) GetCheckpoint(ctx context.Context, workspace, runID, checkpointID string) (*loopsv1.Checkpoint, error) {
	return get(ctx, s, "checkpoint", runID+"/"+checkpointID, newCheckpoint,
		`SELECT data FROM checkpoints WHERE training_run_id = $1 AND id = $2 AND workspace = $3`,
		runID, checkpointID, workspace)
}

// GetCheckpointAnyWorkspace returns a checkpoint and its owner's workspace.
func (s *Store) GetCheckpointAnyWorkspace(ctx context.Context, runID, checkpointID string) (*loopsv1.Checkpoint, string, error) {
	var workspace string
	var data []byte
	err := s.pool.QueryRow(ctx,
		`SELECT workspace, data FROM checkpoints WHERE training_run_id = $1 AND id = $2`,
		runID, checkpointID).Scan(&workspace, &data)
	if errors.Is(err, pgx.ErrNoRows) {
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
		return list(ctx, s, "checkpoints", newCheckpoint, listQuery{
			from:    `SELECT data FROM checkpoints WHERE workspace = $1`,
			count:   `SELECT count(*) FROM checkpoints WHERE workspace = $1`,
			withRun: true,
		}, page, workspace)
	}
	return list(ctx, s, "checkpoints", newCheckpoint, listQuery{
		from:  `SELECT data FROM checkpoints WHERE workspace = $1 AND training_run_id = $2`,
		count: `SELECT count(*) FROM checkpoints WHERE workspace = $1 AND training_run_id = $2`,
	}, page, workspace, runID)
}

// DeleteCheckpoint removes a checkpoint record of the workspace.
func (s *Store) DeleteCheckpoint(ctx context.Context, workspace, runID, checkpointID string) error {
	tag, err := s.pool.Exec(ctx,
		`DELETE FROM checkpoints WHERE training_run_id = $1 AND id = $2 AND workspace = $3`,
		runID, checkpointID, workspace)
	if err != nil {
		return fmt.Errorf("store: delete checkpoint %s/%s: %w", runID, checkpointID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: delete checkpoint %s/%s: %w", runID, checkpointID, store.ErrNotFound)
	}
	return nil
}

// ListExpiredCheckpoints lists checkpoints of all workspaces whose expire_time is before now,
// newest first.
func (s *Store) ListExpiredCheckpoints(ctx context.Context, now time.Time) ([]store.OwnedCheckpoint, error) {
	var out []store.OwnedCheckpoint
	err := s.scanOwned(ctx, "list expired checkpoints",
		`SELECT workspace, data FROM checkpoints
		 WHERE expire_time IS NOT NULL AND expire_time < $1
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
	return s.put(ctx, "sampler", m.GetId(), m, upsertSampler,
		m.GetId(), workspace, m.GetSessionId(), nanos(m.GetCreateTime()))
}

// GetSampler returns a sampler of the workspace.
func (s *Store) GetSampler(ctx context.Context, workspace, id string) (*loopsv1.Sampler, error) {
	return get(ctx, s, "sampler", id, newSampler,
		`SELECT data FROM samplers WHERE id = $1 AND workspace = $2`, id, workspace)
}

// PutOperation inserts or replaces an operation.
func (s *Store) PutOperation(ctx context.Context, workspace string, m *loopsv1.Operation) error {
	if err := checkOperation(m); err != nil {
		return err
	}
	return s.put(ctx, "operation", m.GetId(), m, upsertOperation, operationArgs(workspace, m)...)
}

func checkOperation(m *loopsv1.Operation) error {
	if m == nil || m.GetId() == "" {
		return errors.New("store: put operation: missing id")
	}
	return nil
}

func operationArgs(workspace string, m *loopsv1.Operation) []any {
	return []any{m.GetId(), workspace, m.GetTrainingRunId(), nanos(m.GetCreateTime()),
		int32(m.GetState()), isDone(m.GetState()), nullNanos(m.GetDoneTime())}
}

// GetOperation returns an operation of the workspace.
func (s *Store) GetOperation(ctx context.Context, workspace, id string) (*loopsv1.Operation, error) {
	return get(ctx, s, "operation", id, newOperation,
		`SELECT data FROM operations WHERE id = $1 AND workspace = $2`, id, workspace)
}

// ApplyBatch writes the batch's training runs, then its operations, then its step metrics
// (downsampling runs over the bound, after the batch), in one transaction,
// sent to the server as one pipelined batch. Within each kind, records are written in id
// order (duplicates in their given order, so the later one wins): concurrent batches lock
// rows in the same order and cannot deadlock one another.
func (s *Store) ApplyBatch(ctx context.Context, b store.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	type write struct {
		kind, id string
		query    string
		args     []any
	}
	writes := make([]write, 0, b.Len())
	runs := slices.Clone(b.TrainingRuns)
	slices.SortStableFunc(runs, func(x, y store.OwnedTrainingRun) int { return cmp.Compare(x.Run.GetId(), y.Run.GetId()) })
	for _, r := range runs {
		if err := checkTrainingRun(r.Run); err != nil {
			return fmt.Errorf("store: apply batch: %w", err)
		}
		data, err := proto.Marshal(r.Run)
		if err != nil {
			return fmt.Errorf("store: apply batch: encode training run %s: %w", r.Run.GetId(), err)
		}
		writes = append(writes, write{"training run", r.Run.GetId(), upsertTrainingRun,
			append(trainingRunArgs(r.Workspace, r.Run), data)})
	}
	ops := slices.Clone(b.Operations)
	slices.SortStableFunc(ops, func(x, y store.OwnedOperation) int {
		return cmp.Compare(x.Operation.GetId(), y.Operation.GetId())
	})
	for _, o := range ops {
		if err := checkOperation(o.Operation); err != nil {
			return fmt.Errorf("store: apply batch: %w", err)
		}
		data, err := proto.Marshal(o.Operation)
		if err != nil {
			return fmt.Errorf("store: apply batch: encode operation %s: %w", o.Operation.GetId(), err)
		}
		writes = append(writes, write{"operation", o.Operation.GetId(), upsertOperation,
			append(operationArgs(o.Workspace, o.Operation), data)})
	}
	metrics, metricRuns, err := stepMetricsWrites(&s.metricsCheck, b.StepMetrics)
	if err != nil {
		return fmt.Errorf("store: apply batch: %w", err)
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var pb pgx.Batch
		for _, w := range writes {
			pb.Queue(w.query, w.args...)
		}
		for _, args := range metrics {
			pb.Queue(insertStepMetrics, args...)
		}
		for _, id := range metricRuns {
			pb.Queue(countStepMetrics, id)
		}
		br := tx.SendBatch(ctx, &pb)
		for _, w := range writes {
			tag, err := br.Exec()
			if err != nil {
				_ = br.Close()
				return fmt.Errorf("put %s %s: %w", w.kind, w.id, err)
			}
			if tag.RowsAffected() == 0 {
				_ = br.Close()
				return fmt.Errorf("put %s %s: id belongs to another workspace", w.kind, w.id)
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
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		type row struct {
			id   string
			data []byte
		}
		rows, err := tx.Query(ctx, `SELECT id, data FROM operations WHERE NOT done ORDER BY id FOR UPDATE`)
		if err != nil {
			return err
		}
		pending, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.data)
			return x, err
		})
		if err != nil {
			return err
		}
		doneTime := timestamppb.New(now)
		var pb pgx.Batch
		for _, r := range pending {
			op := &loopsv1.Operation{}
			if err := proto.Unmarshal(r.data, op); err != nil {
				return fmt.Errorf("decode %s: %w", r.id, err)
			}
			op.State = loopsv1.OperationState_OPERATION_STATE_FAILED
			op.Error = proto.CloneOf(e)
			op.DoneTime = doneTime
			data, err := proto.Marshal(op)
			if err != nil {
				return fmt.Errorf("encode %s: %w", r.id, err)
			}
			pb.Queue(`UPDATE operations SET state = $1, done = true, done_time = $2, data = $3 WHERE id = $4`,
				int32(op.GetState()), now.UnixNano(), data, r.id)
		}
		if len(pending) > 0 {
			if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
				return err
			}
		}
		n = len(pending)
		return nil
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
	tag, err := s.pool.Exec(ctx,
		`DELETE FROM operations WHERE done AND done_time IS NOT NULL AND done_time < $1`, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: delete operations done before %s: %w", t, err)
	}
	return int(tag.RowsAffected()), nil
}

// put marshals m and runs the upsert query with args followed by the marshalled message.
// When the upsert changes no row, the id belongs to another workspace and put fails.
func (s *Store) put(ctx context.Context, kind, id string, m proto.Message, query string, args ...any) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("store: put %s %s: encode: %w", kind, id, err)
	}
	tag, err := s.pool.Exec(ctx, query, append(args, data)...)
	if err != nil {
		return fmt.Errorf("store: put %s %s: %w", kind, id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: put %s %s: id belongs to another workspace", kind, id)
	}
	return nil
}

// get runs query, which selects one data column, and unmarshals the row into a new message.
func get[M proto.Message](ctx context.Context, s *Store, kind, id string, newMsg func() M, query string, args ...any) (M, error) {
	var zero M
	var data []byte
	err := s.pool.QueryRow(ctx, query, args...).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
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

// list runs q.count and q.from (with the page's keyset condition, the list's order and
// LIMIT, and OFFSET only when the page asks for one) in one read-only repeatable-read
// transaction, so the rows and the total agree, sent as one pipelined batch: one round trip.
func list[M proto.Message](ctx context.Context, s *Store, kind string, newMsg func() M, q listQuery, page store.Page, args ...any) ([]M, int64, error) {
	limit := page.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxLimit)
	offset := max(page.Offset, 0)

	query, qargs := listSQL(q, page, limit, offset, args)

	var pb pgx.Batch
	pb.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
	pb.Queue(q.count, args...)
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
		out := make([]M, 0, min(limit, max(int(total)-offset, 0)))
		for rows.Next() {
			m := newMsg()
			if err := proto.Unmarshal(rows.RawValues()[0], m); err != nil {
				rows.Close()
				return nil, 0, fmt.Errorf("decode: %w", err)
			}
			out = append(out, m)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
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

// listSQL returns q.from with the page's keyset condition, the list's order, LIMIT, and
// OFFSET only when offset is positive, and its arguments: args then the page's.
func listSQL(q listQuery, page store.Page, limit, offset int, args []any) (string, []any) {
	query, qargs := q.from, slices.Clone(args)
	next := func(v any) string {
		qargs = append(qargs, v)
		return "$" + strconv.Itoa(len(qargs))
	}
	if c := page.After; c != nil {
		if q.withRun {
			query += ` AND (create_time, training_run_id, id) < (` +
				next(c.CreateTime.UnixNano()) + `, ` + next(c.TrainingRunID) + `, ` + next(c.ID) + `)`
		} else {
			query += ` AND (create_time, id) < (` + next(c.CreateTime.UnixNano()) + `, ` + next(c.ID) + `)`
		}
	}
	if q.withRun {
		query += ` ORDER BY create_time DESC, training_run_id DESC, id DESC`
	} else {
		query += ` ORDER BY create_time DESC, id DESC`
	}
	query += ` LIMIT ` + next(int64(limit))
	if offset > 0 {
		query += ` OFFSET ` + next(int64(offset))
	}
	return query, qargs
}

// scanOwned runs query, which selects workspace and data columns, and calls fn for each row.
func (s *Store) scanOwned(ctx context.Context, what, query string, args []any, fn func(workspace string, data []byte) error) error {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	defer rows.Close()
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

// nullNanos returns ts in unix nanoseconds, nil (NULL) when unset.
func nullNanos(ts *timestamppb.Timestamp) *int64 {
	if ts == nil {
		return nil
	}
	n := nanos(ts)
	return &n
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
