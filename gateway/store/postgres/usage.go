package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
)

// AddUsage adds u.Amount to the workspace's usage row for u's bucket, model, session and
// kind, creating the row when there is none.
func (s *Store) AddUsage(ctx context.Context, workspace string, u store.UsageRecord) error {
	if u.Kind == "" {
		return errors.New("store: add usage: missing kind")
	}
	if _, err := s.pool.Exec(ctx,
		`INSERT INTO usage (workspace, bucket_start, base_model, session_id, kind, amount, deployment)
		 VALUES ($1, $2, $3, $4, $5, $6, $7)
		 ON CONFLICT (workspace, bucket_start, base_model, session_id, deployment, kind)
		 DO UPDATE SET amount = usage.amount + excluded.amount`,
		workspace, u.BucketStart.UnixNano(), u.BaseModel, u.SessionID, u.Kind, u.Amount, u.Deployment); err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	return nil
}

// ListUsage lists the workspace's usage rows with from <= bucket start < to, ordered by
// bucket start, kind, base model and session.
func (s *Store) ListUsage(ctx context.Context, workspace string, from, to time.Time) ([]store.UsageRecord, error) {
	rows, err := s.pool.Query(ctx,
		`SELECT bucket_start, base_model, session_id, kind, amount, deployment FROM usage
		 WHERE workspace = $1 AND bucket_start >= $2 AND bucket_start < $3
		 ORDER BY bucket_start, kind, base_model, session_id, deployment`,
		workspace, from.UnixNano(), to.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("store: list usage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.UsageRecord, error) {
		var u store.UsageRecord
		var start int64
		if err := r.Scan(&start, &u.BaseModel, &u.SessionID, &u.Kind, &u.Amount, &u.Deployment); err != nil {
			return u, err
		}
		u.BucketStart = time.Unix(0, start).UTC()
		return u, nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: list usage: %w", err)
	}
	return out, nil
}
