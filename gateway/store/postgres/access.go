package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// pgTx is a write transaction as sqlstore.Tx.
type pgTx struct{ t *writeTx }

func (p pgTx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	var b pgx.Batch
	b.Queue(sql, args...)
	br := p.t.SendBatch(ctx, &b)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag.RowsAffected(), err
}

func (p pgTx) Blobs(ctx context.Context, sql string, args ...any) ([][]byte, error) {
	rows, err := p.t.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return collectBlobs(rows)
}

func collectBlobs(rows pgx.Rows) ([][]byte, error) {
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

func (s *Store) blobs(ctx context.Context, sql string, args ...any) ([][]byte, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return collectBlobs(rows)
}

// PutAccessRequest files a request (store.AccessStore).
func (s *Store) PutAccessRequest(ctx context.Context, r *loopsv1.AccessRequest, max int, hook *store.WebhookEvent) (*loopsv1.AccessRequest, bool, error) {
	var out *loopsv1.AccessRequest
	var created bool
	err := s.tx(ctx, func(t *writeTx) error {
		var err error
		out, created, err = sqlstore.Postgres.PutAccessRequest(ctx, pgTx{t}, r, max, hook)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("store: %w", err)
	}
	return out, created, nil
}

// GetAccessRequest returns a workspace's request by id.
func (s *Store) GetAccessRequest(ctx context.Context, workspace, id string) (*loopsv1.AccessRequest, error) {
	rs, err := s.accessRequests(ctx, sqlstore.Query{SQL: sqlstore.GetAccessRequest, Args: []any{workspace, id}})
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("store: access request %s: %w", id, store.ErrNotFound)
	}
	return rs[0], nil
}

// ListAccessRequests lists a workspace's requests, newest first.
func (s *Store) ListAccessRequests(ctx context.Context, workspace string, q store.AccessQuery) ([]*loopsv1.AccessRequest, error) {
	return s.accessRequests(ctx, sqlstore.ListAccessRequests(workspace, q))
}

// GrantedAccessRequests lists every granted request.
func (s *Store) GrantedAccessRequests(ctx context.Context) ([]*loopsv1.AccessRequest, error) {
	return s.accessRequests(ctx, sqlstore.Query{SQL: sqlstore.GrantedAccessRequests})
}

func (s *Store) accessRequests(ctx context.Context, q sqlstore.Query) ([]*loopsv1.AccessRequest, error) {
	blobs, err := s.blobs(ctx, q.SQL, q.Args...)
	if err != nil {
		return nil, fmt.Errorf("store: read access requests: %w", err)
	}
	return sqlstore.DecodeAccessRequests(blobs)
}

// TransitionAccessRequest changes a request's state with its audit event and webhook.
func (s *Store) TransitionAccessRequest(ctx context.Context, r *loopsv1.AccessRequest, from loopsv1.AccessState, ev store.OwnedAuditEvent, hook *store.WebhookEvent) error {
	err := s.tx(ctx, func(t *writeTx) error {
		return sqlstore.Postgres.TransitionAccessRequest(ctx, pgTx{t}, r, from, ev, hook)
	})
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// DueWebhookDeliveries lists the pending deliveries due at now, oldest first.
func (s *Store) DueWebhookDeliveries(ctx context.Context, now time.Time, limit int) ([]store.WebhookEvent, error) {
	var out []store.WebhookEvent
	err := s.query(ctx, "due webhook deliveries", sqlstore.DueWebhookDeliveries, []any{now.UnixNano(), int64(limit)}, func(rows pgx.Rows) error {
		for rows.Next() {
			var ws string
			var body, data []byte
			if err := rows.Scan(&ws, &body, &data); err != nil {
				return err
			}
			ev, err := sqlstore.DecodeWebhookEvent(ws, body, data)
			if err != nil {
				return err
			}
			out = append(out, ev)
		}
		return rows.Err()
	})
	return out, err
}

// UpdateWebhookDelivery stores a delivery's new state.
func (s *Store) UpdateWebhookDelivery(ctx context.Context, d *loopsv1.WebhookDelivery) error {
	args, err := sqlstore.UpdateWebhookDeliveryArgs(d)
	if err == nil {
		var rows []int64
		rows, err = s.exec(ctx, sqlstore.Query{SQL: sqlstore.UpdateWebhookDelivery, Args: args})
		if err == nil && rows[0] == 0 {
			err = store.ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("store: update webhook delivery %s: %w", d.GetId(), err)
	}
	return nil
}

// ListWebhookDeliveries lists a workspace's deliveries, newest first.
func (s *Store) ListWebhookDeliveries(ctx context.Context, workspace string, limit int) ([]*loopsv1.WebhookDelivery, error) {
	blobs, err := s.blobs(ctx, sqlstore.ListWebhookDeliveries, workspace, int64(store.JobLimit(limit)))
	if err != nil {
		return nil, fmt.Errorf("store: list webhook deliveries: %w", err)
	}
	return sqlstore.DecodeWebhookDeliveries(blobs)
}

// CountPendingWebhookDeliveries counts the pending deliveries.
func (s *Store) CountPendingWebhookDeliveries(ctx context.Context) (int, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, sqlstore.CountPendingWebhookDeliveries).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count webhook deliveries: %w", err)
	}
	return int(n), nil
}
