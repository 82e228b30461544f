package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PutJob inserts or replaces a job of the workspace.
func (s *Store) PutJob(ctx context.Context, workspace string, j *loopsv1.Job) error {
	return put(ctx, s, sqlstore.PutJob, workspace, j)
}

// GetJob returns a job of the workspace.
func (s *Store) GetJob(ctx context.Context, workspace, id string) (*loopsv1.Job, error) {
	return get(ctx, s.r, sqlstore.GetJob(workspace, id))
}

// ListJobs lists the workspace's newest jobs.
func (s *Store) ListJobs(ctx context.Context, workspace string, limit int) ([]*loopsv1.Job, error) {
	return messages(ctx, s, "list jobs", sqlstore.NewJob, sqlstore.ListJobs, workspace, store.JobLimit(limit))
}

// DeleteJob removes a job of the workspace.
func (s *Store) DeleteJob(ctx context.Context, workspace, id string) error {
	return s.deleteOne(ctx, "job "+id, sqlstore.DeleteJob, workspace, id)
}

// FailRunningJobs marks every running job failed, in one transaction.
func (s *Store) FailRunningJobs(ctx context.Context, reason string, end time.Time) (int, error) {
	n, err := s.updateRows(ctx, sqlstore.SQLite.SelectRunningJobs(), []any{sqlstore.RunningJobState}, func(r sqlstore.Row) (sqlstore.Query, error) {
		return sqlstore.FailJob(r, reason, end)
	})
	if err != nil {
		return 0, fmt.Errorf("store: fail running jobs: %w", err)
	}
	return n, nil
}
