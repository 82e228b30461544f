package sqlite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PutJob inserts or replaces a job of the workspace.
func (s *Store) PutJob(ctx context.Context, workspace string, j *loopsv1.Job) error {
	if j == nil || j.GetId() == "" {
		return errors.New("store: put job: missing id")
	}
	return s.put(ctx, "job", j.GetId(), j,
		`INSERT INTO jobs (id, workspace, create_time, state, data) VALUES (?, ?, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET create_time = excluded.create_time, state = excluded.state, data = excluded.data
		 WHERE jobs.workspace = excluded.workspace`,
		j.GetId(), workspace, nanos(j.GetCreateTime()), int64(j.GetState()))
}

// GetJob returns a job of the workspace.
func (s *Store) GetJob(ctx context.Context, workspace, id string) (*loopsv1.Job, error) {
	return get(ctx, s.r, "job", id, newJob, `SELECT data FROM jobs WHERE workspace = ? AND id = ?`, workspace, id)
}

// ListJobs lists the workspace's newest jobs.
func (s *Store) ListJobs(ctx context.Context, workspace string, limit int) ([]*loopsv1.Job, error) {
	out := []*loopsv1.Job{}
	err := scanOwned(ctx, s.r, "list jobs",
		`SELECT workspace, data FROM jobs WHERE workspace = ? ORDER BY create_time DESC, id DESC LIMIT ?`,
		[]any{workspace, store.JobLimit(limit)}, func(_ string, data []byte) error {
			m := newJob()
			if err := proto.Unmarshal(data, m); err != nil {
				return err
			}
			out = append(out, m)
			return nil
		})
	return out, err
}

// DeleteJob removes a job of the workspace.
func (s *Store) DeleteJob(ctx context.Context, workspace, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM jobs WHERE workspace = ? AND id = ?`, workspace, id)
	if err != nil {
		return fmt.Errorf("store: delete job %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err == nil {
			err = store.ErrNotFound
		}
		return fmt.Errorf("store: delete job %s: %w", id, err)
	}
	return nil
}

// FailRunningJobs marks every running job failed, in one transaction.
func (s *Store) FailRunningJobs(ctx context.Context, reason string, end time.Time) (int, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: fail running jobs: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, `SELECT id, data FROM jobs WHERE state = ?`, int64(loopsv1.JobState_JOB_STATE_RUNNING))
	if err != nil {
		return 0, fmt.Errorf("store: fail running jobs: %w", err)
	}
	type upd struct {
		id   string
		data []byte
	}
	var ups []upd
	for rows.Next() {
		var id string
		var data []byte
		if err := rows.Scan(&id, &data); err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("store: fail running jobs: %w", err)
		}
		j := newJob()
		if err := proto.Unmarshal(data, j); err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("store: fail running jobs: decode %s: %w", id, err)
		}
		store.FailJob(j, reason, timestamppb.New(end))
		b, err := proto.Marshal(j)
		if err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("store: fail running jobs: encode %s: %w", id, err)
		}
		ups = append(ups, upd{id, b})
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, fmt.Errorf("store: fail running jobs: %w", err)
	}
	for _, u := range ups {
		if _, err := tx.ExecContext(ctx, `UPDATE jobs SET state = ?, data = ? WHERE id = ?`,
			int64(loopsv1.JobState_JOB_STATE_FAILED), u.data, u.id); err != nil {
			return 0, fmt.Errorf("store: fail running jobs: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: fail running jobs: %w", err)
	}
	return len(ups), nil
}

func newJob() *loopsv1.Job { return &loopsv1.Job{} }
