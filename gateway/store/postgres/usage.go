package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
)

// AddUsage adds u.Amount to the workspace's usage row for u's bucket, model, session and
// kind, creating the row when there is none.
func (s *Store) AddUsage(ctx context.Context, workspace string, u store.UsageRecord) error {
	q, err := sqlstore.AddUsage(workspace, u)
	if err == nil {
		_, err = s.exec(ctx, q)
	}
	if err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	return nil
}

// ListUsage lists the workspace's usage rows with from <= bucket start < to, ordered by
// bucket start, kind, base model and session.
func (s *Store) ListUsage(ctx context.Context, workspace string, from, to time.Time) ([]store.UsageRecord, error) {
	var out []store.UsageRecord
	err := s.query(ctx, "list usage", sqlstore.ListUsage, []any{workspace, from.UnixNano(), to.UnixNano()}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanUsage(rows)
		return err
	})
	return out, err
}

// UsageCost sums the costs of the workspace's usage rows with from <= bucket start < to.
func (s *Store) UsageCost(ctx context.Context, workspace string, from, to time.Time) (int64, error) {
	var out int64
	err := s.query(ctx, "sum usage cost", sqlstore.UsageCost, []any{workspace, from.UnixNano(), to.UnixNano()}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanInt(rows)
		return err
	})
	return out, err
}

// KeyUsageCost sums the costs of one API key's usage rows of the workspace with from <=
// bucket start < to.
func (s *Store) KeyUsageCost(ctx context.Context, workspace, keyID string, from, to time.Time) (int64, error) {
	var out int64
	err := s.query(ctx, "sum key usage cost", sqlstore.KeyUsageCost, []any{workspace, keyID, from.UnixNano(), to.UnixNano()}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanInt(rows)
		return err
	})
	return out, err
}
