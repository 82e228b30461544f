package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
)

// AppendAuditEvents appends events in one transaction (one round trip).
func (s *Store) AppendAuditEvents(ctx context.Context, events []store.OwnedAuditEvent) error {
	if len(events) == 0 {
		return nil
	}
	qs := make([]sqlstore.Query, len(events))
	for i, e := range events {
		qs[i] = sqlstore.Query{SQL: sqlstore.InsertAuditEvent, Args: sqlstore.AuditEventArgs(e)}
	}
	if _, err := s.exec(ctx, qs...); err != nil {
		return fmt.Errorf("store: append audit events: %w", err)
	}
	return nil
}

// ListAuditEvents lists a workspace's events that q selects.
func (s *Store) ListAuditEvents(ctx context.Context, workspace string, q store.AuditQuery) ([]store.AuditEvent, error) {
	lq := sqlstore.ListAuditEvents(workspace, q)
	var out []store.AuditEvent
	err := s.query(ctx, "list audit events", lq.SQL, lq.Args, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanAuditEvents(rows)
		return err
	})
	return out, err
}

// DeleteAuditEventsBefore removes every workspace's events older than t.
func (s *Store) DeleteAuditEventsBefore(ctx context.Context, t time.Time) (int, error) {
	rows, err := s.exec(ctx, sqlstore.Query{SQL: sqlstore.DeleteAuditEventsBefore, Args: []any{t.UnixNano()}})
	if err != nil {
		return 0, fmt.Errorf("store: delete audit events: %w", err)
	}
	return int(rows[0]), nil
}

// TrimAuditEvents removes the oldest events of each workspace holding more than keep.
func (s *Store) TrimAuditEvents(ctx context.Context, keep int) (int, error) {
	var over []string
	err := s.query(ctx, "trim audit events", sqlstore.AuditWorkspacesOver, []any{keep}, func(rows pgx.Rows) error {
		for rows.Next() {
			var ws string
			if err := rows.Scan(&ws); err != nil {
				return err
			}
			over = append(over, ws)
		}
		return rows.Err()
	})
	if err != nil {
		return 0, err
	}
	total := 0
	for _, ws := range over {
		rows, err := s.exec(ctx, sqlstore.Query{SQL: sqlstore.TrimAuditWorkspace, Args: []any{ws, keep}})
		if err != nil {
			return total, fmt.Errorf("store: trim audit events of %s: %w", ws, err)
		}
		total += int(rows[0])
	}
	return total, nil
}

// CheckpointStorage returns the count and total size of the workspace's checkpoints.
func (s *Store) CheckpointStorage(ctx context.Context, workspace string) (store.CheckpointStorage, error) {
	var cs store.CheckpointStorage
	var unsized int64
	err := s.query(ctx, "checkpoint storage", sqlstore.CheckpointStorage, []any{workspace}, func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&cs.Checkpoints, &cs.Bytes, &unsized); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil || unsized == 0 {
		return cs, err
	}
	err = s.query(ctx, "checkpoint storage", sqlstore.UnsizedCheckpoints, []any{workspace}, func(rows pgx.Rows) error {
		n, err := sqlstore.SumUnsizedCheckpoints(rows)
		cs.Bytes += n
		return err
	})
	return cs, err
}

// CheckpointBytes sums every workspace's checkpoint sizes by session.
func (s *Store) CheckpointBytes(ctx context.Context, limit int) ([]store.SessionCheckpointBytes, error) {
	var out []store.SessionCheckpointBytes
	err := s.query(ctx, "checkpoint bytes", sqlstore.CheckpointBytes, []any{limit}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanCheckpointBytes(rows)
		return err
	})
	return out, err
}
