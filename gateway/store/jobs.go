package store

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// JobStore keeps managed jobs (loops.v1 Job), keyed by id and owned by one workspace. Their
// logs are files under the data dir, not in the store.
type JobStore interface {
	// PutJob inserts or replaces a job of the workspace. j.Id must not be empty; an id that
	// another workspace owns is an error (other than ErrNotFound) and changes nothing.
	PutJob(ctx context.Context, workspace string, j *loopsv1.Job) error
	// GetJob returns a job of the workspace.
	GetJob(ctx context.Context, workspace, id string) (*loopsv1.Job, error)
	// ListJobs lists at most limit of the workspace's jobs (limit is bounded as a Page's),
	// newest first: by create_time, then id, descending.
	ListJobs(ctx context.Context, workspace string, limit int) ([]*loopsv1.Job, error)
	// DeleteJob removes a job of the workspace.
	DeleteJob(ctx context.Context, workspace, id string) error
	// FailRunningJobs marks every job still in JOB_STATE_RUNNING, of every workspace, failed
	// with reason and end time end, and returns how many it marked (a gateway starting up
	// calls it: its previous process's jobs died with it).
	FailRunningJobs(ctx context.Context, reason string, end time.Time) (int, error)
}

// JobLimit bounds a ListJobs limit as a Page's Limit is bounded.
func JobLimit(limit int) int {
	switch {
	case limit <= 0:
		return DefaultPageLimit
	case limit > MaxPageLimit:
		return MaxPageLimit
	}
	return limit
}

// FailJob sets j to failed with reason at end, with exit code -1: what FailRunningJobs does
// to each job it marks.
func FailJob(j *loopsv1.Job, reason string, end *timestamppb.Timestamp) {
	j.State = loopsv1.JobState_JOB_STATE_FAILED
	j.Reason = reason
	j.ExitCode = -1
	j.EndTime = end
}
