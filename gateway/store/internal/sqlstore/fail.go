package sqlstore

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// SelectUnfinishedOperations selects (id, data) of the operations that are not done, in id
// order, locked with the dialect's LockRows.
func (d Dialect) SelectUnfinishedOperations() string {
	return `SELECT id, data FROM operations WHERE NOT done ORDER BY id` + d.LockRows
}

// SelectRunningJobs selects (id, data) of the running jobs ($1: the running state), in id
// order, locked with the dialect's LockRows.
func (d Dialect) SelectRunningJobs() string {
	return `SELECT id, data FROM jobs WHERE state = $1 ORDER BY id` + d.LockRows
}

// RunningJobState is SelectRunningJobs' argument.
const RunningJobState = int32(loopsv1.JobState_JOB_STATE_RUNNING)

// Row is a record's id and data.
type Row struct {
	ID   string
	Data []byte
}

// ScanRows reads rows of (id, data).
func ScanRows(rows Rows) ([]Row, error) {
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.ID, &r.Data); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// FailOperation returns the update that marks an unfinished operation's row failed with
// error e at now (store.Store.FailUnfinishedOperations).
func FailOperation(r Row, e *loopsv1.OperationError, now time.Time) (Query, error) {
	op := NewOperation()
	if err := proto.Unmarshal(r.Data, op); err != nil {
		return Query{}, fmt.Errorf("decode %s: %w", r.ID, err)
	}
	op.State = loopsv1.OperationState_OPERATION_STATE_FAILED
	op.Error = proto.CloneOf(e)
	op.DoneTime = timestamppb.New(now)
	data, err := proto.Marshal(op)
	if err != nil {
		return Query{}, fmt.Errorf("encode %s: %w", r.ID, err)
	}
	return Query{SQL: `UPDATE operations SET state = $1, done = TRUE, done_time = $2, data = $3 WHERE id = $4`,
		Args: []any{int32(op.GetState()), now.UnixNano(), data, r.ID}}, nil
}

// FailJob returns the update that marks a running job's row failed with reason at end
// (store.Store.FailRunningJobs).
func FailJob(r Row, reason string, end time.Time) (Query, error) {
	j := NewJob()
	if err := proto.Unmarshal(r.Data, j); err != nil {
		return Query{}, fmt.Errorf("decode %s: %w", r.ID, err)
	}
	store.FailJob(j, reason, timestamppb.New(end))
	data, err := proto.Marshal(j)
	if err != nil {
		return Query{}, fmt.Errorf("encode %s: %w", r.ID, err)
	}
	return Query{SQL: `UPDATE jobs SET state = $1, data = $2 WHERE id = $3`,
		Args: []any{int32(loopsv1.JobState_JOB_STATE_FAILED), data, r.ID}}, nil
}
