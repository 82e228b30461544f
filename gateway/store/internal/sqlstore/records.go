package sqlstore

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The upserts. Each updates a row only when it belongs to the same workspace; otherwise it
// changes no row (Write.Check fails).
const (
	upsertSession = `INSERT INTO sessions (id, workspace, create_time, project, status, owner, display_name, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (id) DO UPDATE SET create_time = excluded.create_time, project = excluded.project,
		  status = excluded.status, owner = excluded.owner, display_name = excluded.display_name, data = excluded.data
		WHERE sessions.workspace = excluded.workspace`
	upsertTrainingRun = `INSERT INTO training_runs (id, workspace, session_id, create_time, data) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET session_id = excluded.session_id,
		  create_time = excluded.create_time, data = excluded.data
		WHERE training_runs.workspace = excluded.workspace`
	upsertCheckpoint = `INSERT INTO checkpoints (training_run_id, id, workspace, create_time, public, expire_time, size_bytes, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (training_run_id, id) DO UPDATE SET create_time = excluded.create_time,
		  public = excluded.public, expire_time = excluded.expire_time, size_bytes = excluded.size_bytes, data = excluded.data
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
	upsertJob = `INSERT INTO jobs (id, workspace, create_time, state, data) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET create_time = excluded.create_time, state = excluded.state, data = excluded.data
		WHERE jobs.workspace = excluded.workspace`
)

// Write is one upsert of a record: its statement and arguments (the marshalled message
// last), and what it writes, for errors.
type Write struct {
	Kind, ID string
	SQL      string
	Args     []any
}

// Check returns the error of an upsert that changed rows rows: none means the id belongs
// to another workspace.
func (w Write) Check(rows int64) error {
	if rows == 0 {
		return fmt.Errorf("put %s %s: id belongs to another workspace", w.Kind, w.ID)
	}
	return nil
}

// Err wraps an error of running w.
func (w Write) Err(err error) error { return fmt.Errorf("put %s %s: %w", w.Kind, w.ID, err) }

// write marshals m and returns its upsert with args and the message.
func write(kind, id, sql string, m proto.Message, args ...any) (Write, error) {
	data, err := proto.Marshal(m)
	if err != nil {
		return Write{}, fmt.Errorf("put %s %s: encode: %w", kind, id, err)
	}
	return Write{Kind: kind, ID: id, SQL: sql, Args: append(args, data)}, nil
}

// PutSession is the upsert of a session.
func PutSession(workspace string, m *loopsv1.Session) (Write, error) {
	if m == nil || m.GetId() == "" {
		return Write{}, errors.New("put session: missing id")
	}
	return write("session", m.GetId(), upsertSession, m, m.GetId(), workspace, Nanos(m.GetCreateTime()),
		noNUL(cmp.Or(m.GetProjectId(), store.DefaultProject)), noNUL(store.SessionStatus(m)), noNUL(m.GetOwner()), noNUL(m.GetDisplayName()))
}

// PutTrainingRun is the upsert of a training run.
func PutTrainingRun(workspace string, m *loopsv1.TrainingRun) (Write, error) {
	if m == nil || m.GetId() == "" {
		return Write{}, errors.New("put training run: missing id")
	}
	return write("training run", m.GetId(), upsertTrainingRun, m,
		m.GetId(), workspace, m.GetSessionId(), Nanos(m.GetCreateTime()))
}

// PutCheckpoint is the upsert of a checkpoint, keyed by (training_run_id, id).
func PutCheckpoint(workspace string, m *loopsv1.Checkpoint) (Write, error) {
	if m == nil || m.GetId() == "" || m.GetTrainingRunId() == "" {
		return Write{}, errors.New("put checkpoint: missing id or training_run_id")
	}
	return write("checkpoint", m.GetTrainingRunId()+"/"+m.GetId(), upsertCheckpoint, m,
		m.GetTrainingRunId(), m.GetId(), workspace, Nanos(m.GetCreateTime()), m.GetPublic(),
		NullNanos(m.GetExpireTime()), max(m.GetSizeBytes(), 0))
}

// PutSampler is the upsert of a sampler.
func PutSampler(workspace string, m *loopsv1.Sampler) (Write, error) {
	if m == nil || m.GetId() == "" {
		return Write{}, errors.New("put sampler: missing id")
	}
	return write("sampler", m.GetId(), upsertSampler, m,
		m.GetId(), workspace, m.GetSessionId(), Nanos(m.GetCreateTime()))
}

// PutOperation is the upsert of an operation.
func PutOperation(workspace string, m *loopsv1.Operation) (Write, error) {
	if m == nil || m.GetId() == "" {
		return Write{}, errors.New("put operation: missing id")
	}
	return write("operation", m.GetId(), upsertOperation, m,
		m.GetId(), workspace, store.OperationOwner(m), Nanos(m.GetCreateTime()),
		int32(m.GetState()), IsDone(m.GetState()), NullNanos(m.GetDoneTime()))
}

// PutJob is the upsert of a job.
func PutJob(workspace string, m *loopsv1.Job) (Write, error) {
	if m == nil || m.GetId() == "" {
		return Write{}, errors.New("put job: missing id")
	}
	return write("job", m.GetId(), upsertJob, m, m.GetId(), workspace, Nanos(m.GetCreateTime()), int32(m.GetState()))
}

// BatchWrites returns the upserts of a batch's training runs, then of its operations, each
// kind in id order (duplicates in their given order, so that the later one wins): concurrent
// batches lock rows in the same order and cannot deadlock one another. Its step metrics are
// planned apart (PlanStepMetrics).
func BatchWrites(b store.Batch) ([]Write, error) {
	writes := make([]Write, 0, len(b.TrainingRuns)+len(b.Operations))
	runs := slices.Clone(b.TrainingRuns)
	slices.SortStableFunc(runs, func(x, y store.OwnedTrainingRun) int { return cmp.Compare(x.Run.GetId(), y.Run.GetId()) })
	for _, r := range runs {
		w, err := PutTrainingRun(r.Workspace, r.Run)
		if err != nil {
			return nil, err
		}
		writes = append(writes, w)
	}
	ops := slices.Clone(b.Operations)
	slices.SortStableFunc(ops, func(x, y store.OwnedOperation) int {
		return cmp.Compare(x.Operation.GetId(), y.Operation.GetId())
	})
	for _, o := range ops {
		w, err := PutOperation(o.Workspace, o.Operation)
		if err != nil {
			return nil, err
		}
		writes = append(writes, w)
	}
	return writes, nil
}

// Nanos returns ts in unix nanoseconds, 0 when unset.
func Nanos(ts *timestamppb.Timestamp) int64 {
	if ts == nil {
		return 0
	}
	return ts.AsTime().UnixNano()
}

// NullNanos returns ts in unix nanoseconds, nil (NULL) when unset.
func NullNanos(ts *timestamppb.Timestamp) *int64 {
	if ts == nil {
		return nil
	}
	n := Nanos(ts)
	return &n
}

// IsDone reports whether an operation in state st has finished.
func IsDone(st loopsv1.OperationState) bool {
	return st == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED ||
		st == loopsv1.OperationState_OPERATION_STATE_FAILED ||
		st == loopsv1.OperationState_OPERATION_STATE_CANCELLED
}

// noNUL drops NUL characters from a copy of a field kept in a text column (PostgreSQL's text
// refuses them; the record itself keeps the field as it is).
func noNUL(s string) string { return strings.ReplaceAll(s, "\x00", "") }
