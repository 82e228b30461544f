package sqlite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/loops-dev/loops/gateway/store"
)

// AddUsage adds u.Amount to the workspace's usage row for u's bucket, model, session and
// kind, creating the row when there is none.
func (s *Store) AddUsage(ctx context.Context, workspace string, u store.UsageRecord) error {
	if u.Kind == "" {
		return errors.New("store: add usage: missing kind")
	}
	if _, err := s.w.ExecContext(ctx,
		`INSERT INTO usage (workspace, bucket_start, base_model, session_id, kind, amount, deployment)
		 VALUES (?, ?, ?, ?, ?, ?, ?)
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
	rows, err := s.r.QueryContext(ctx,
		`SELECT bucket_start, base_model, session_id, kind, amount, deployment FROM usage
		 WHERE workspace = ? AND bucket_start >= ? AND bucket_start < ?
		 ORDER BY bucket_start, kind, base_model, session_id, deployment`,
		workspace, from.UnixNano(), to.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("store: list usage: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []store.UsageRecord
	for rows.Next() {
		var u store.UsageRecord
		var start int64
		if err := rows.Scan(&start, &u.BaseModel, &u.SessionID, &u.Kind, &u.Amount, &u.Deployment); err != nil {
			return nil, fmt.Errorf("store: list usage: %w", err)
		}
		u.BucketStart = time.Unix(0, start).UTC()
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list usage: %w", err)
	}
	return out, nil
}
