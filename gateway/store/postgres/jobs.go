package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
		`INSERT INTO jobs (id, workspace, create_time, state, data) VALUES ($1, $2, $3, $4, $5)
		 ON CONFLICT (id) DO UPDATE SET create_time = excluded.create_time, state = excluded.state, data = excluded.data
		 WHERE jobs.workspace = excluded.workspace`,
		j.GetId(), workspace, nanos(j.GetCreateTime()), int32(j.GetState()))
}

// GetJob returns a job of the workspace.
func (s *Store) GetJob(ctx context.Context, workspace, id string) (*loopsv1.Job, error) {
	return get(ctx, s, "job", id, newJob, `SELECT data FROM jobs WHERE workspace = $1 AND id = $2`, workspace, id)
}

// ListJobs lists the workspace's newest jobs.
func (s *Store) ListJobs(ctx context.Context, workspace string, limit int) ([]*loopsv1.Job, error) {
	out := []*loopsv1.Job{}
	err := s.scanOwned(ctx, "list jobs",
		`SELECT workspace, data FROM jobs WHERE workspace = $1 ORDER BY create_time DESC, id DESC LIMIT $2`,
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
	tag, err := s.pool.Exec(ctx, `DELETE FROM jobs WHERE workspace = $1 AND id = $2`, workspace, id)
	if err != nil {
		return fmt.Errorf("store: delete job %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: delete job %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// FailRunningJobs marks every running job failed, in one transaction.
func (s *Store) FailRunningJobs(ctx context.Context, reason string, end time.Time) (int, error) {
	n := 0
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		n = 0 // a retried transaction counts again
		rows, err := tx.Query(ctx, `SELECT id, data FROM jobs WHERE state = $1 FOR UPDATE`, int32(loopsv1.JobState_JOB_STATE_RUNNING))
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		for rows.Next() {
			var id string
			var data []byte
			if err := rows.Scan(&id, &data); err != nil {
				rows.Close()
				return err
			}
			j := newJob()
			if err := proto.Unmarshal(data, j); err != nil {
				rows.Close()
				return fmt.Errorf("decode %s: %w", id, err)
			}
			store.FailJob(j, reason, timestamppb.New(end))
			enc, err := proto.Marshal(j)
			if err != nil {
				rows.Close()
				return fmt.Errorf("encode %s: %w", id, err)
			}
			b.Queue(`UPDATE jobs SET state = $1, data = $2 WHERE id = $3`, int32(loopsv1.JobState_JOB_STATE_FAILED), enc, id)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, fmt.Errorf("store: fail running jobs: %w", err)
	}
	return n, nil
}

func newJob() *loopsv1.Job { return &loopsv1.Job{} }
