package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Tx is a write transaction of either store, as the access statements use it.
type Tx interface {
	// Exec runs a statement and returns how many rows it changed.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// Blobs runs a query of one bytes column and returns its rows.
	Blobs(ctx context.Context, sql string, args ...any) ([][]byte, error)
}

// The access statements (store.AccessStore, migration 0010_access).
const (
	// GetAccessRequest selects the data of a workspace's ($1) request $2.
	GetAccessRequest = `SELECT data FROM access_requests WHERE workspace = $1 AND id = $2`
	// GrantedAccessRequests selects the data of every granted request.
	GrantedAccessRequests = `SELECT data FROM access_requests WHERE state = 2 ORDER BY create_time, id`
	// ListWebhookDeliveries selects a workspace's deliveries, newest first, at most $2.
	ListWebhookDeliveries = `SELECT data FROM webhook_deliveries WHERE workspace = $1 ORDER BY create_time DESC, id DESC LIMIT $2`
	// DueWebhookDeliveries selects (workspace, body, data) of the pending deliveries due at
	// $1, oldest first, at most $2.
	DueWebhookDeliveries = `SELECT workspace, body, data FROM webhook_deliveries
		WHERE state = 'pending' AND next_attempt <= $1 ORDER BY next_attempt, create_time, id LIMIT $2`
	// CountPendingWebhookDeliveries counts the pending deliveries.
	CountPendingWebhookDeliveries = `SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`
	// UpdateWebhookDelivery sets a delivery's ($1) state, next attempt and data.
	UpdateWebhookDelivery = `UPDATE webhook_deliveries SET state = $2, next_attempt = $3, data = $4 WHERE id = $1`

	pendingRequest = `SELECT data FROM access_requests WHERE workspace = $1 AND requested_by = $2 AND model = $3 AND state = 1`
	updateRequest  = `UPDATE access_requests SET state = $3, expire_time = $4, data = $5 WHERE workspace = $1 AND id = $2 AND state = $6`
	insertWebhook  = `INSERT INTO webhook_deliveries (id, workspace, state, create_time, next_attempt, body, data) VALUES ($1, $2, $3, $4, $5, $6, $7)`
)

// ListAccessRequests is the query of q over a workspace's requests.
func ListAccessRequests(workspace string, q store.AccessQuery) Query {
	sql := `SELECT data FROM access_requests WHERE workspace = $1`
	args := []any{workspace}
	if q.RequestedBy != "" {
		args = append(args, q.RequestedBy)
		sql += fmt.Sprintf(" AND requested_by = $%d", len(args))
	}
	if q.State != loopsv1.AccessState_ACCESS_STATE_UNSPECIFIED {
		args = append(args, int64(q.State))
		sql += fmt.Sprintf(" AND state = $%d", len(args))
	}
	args = append(args, int64(store.JobLimit(q.Limit)))
	sql += fmt.Sprintf(" ORDER BY create_time DESC, id DESC LIMIT $%d", len(args))
	return Query{SQL: sql, Args: args}
}

// DecodeAccessRequests decodes rows of access request data.
func DecodeAccessRequests(blobs [][]byte) ([]*loopsv1.AccessRequest, error) {
	return decodeAll(blobs, func() *loopsv1.AccessRequest { return &loopsv1.AccessRequest{} })
}

// DecodeWebhookDeliveries decodes rows of webhook delivery data.
func DecodeWebhookDeliveries(blobs [][]byte) ([]*loopsv1.WebhookDelivery, error) {
	return decodeAll(blobs, func() *loopsv1.WebhookDelivery { return &loopsv1.WebhookDelivery{} })
}

func decodeAll[M proto.Message](blobs [][]byte, newMsg func() M) ([]M, error) {
	out := make([]M, 0, len(blobs))
	for _, b := range blobs {
		m := newMsg()
		if err := proto.Unmarshal(b, m); err != nil {
			return nil, fmt.Errorf("decode %T: %w", m, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// PutAccessRequest is store.AccessStore's PutAccessRequest in tx (d's casts).
func (d Dialect) PutAccessRequest(ctx context.Context, tx Tx, r *loopsv1.AccessRequest, max int, hook *store.WebhookEvent) (*loopsv1.AccessRequest, bool, error) {
	if r.GetId() == "" || r.GetWorkspace() == "" || r.GetRequestedBy() == "" || r.GetRequested().GetModel() == "" {
		return nil, false, errors.New("put access request: missing id, workspace, requested_by or model")
	}
	old, err := tx.Blobs(ctx, pendingRequest+d.LockRows, r.GetWorkspace(), r.GetRequestedBy(), r.GetRequested().GetModel())
	if err != nil {
		return nil, false, err
	}
	if len(old) > 0 {
		prev, err := DecodeAccessRequests(old[:1])
		if err != nil {
			return nil, false, err
		}
		r = proto.CloneOf(r)
		r.Id, r.CreateTime = prev[0].GetId(), prev[0].GetCreateTime()
		data, err := proto.Marshal(r)
		if err != nil {
			return nil, false, err
		}
		if _, err := tx.Exec(ctx, updateRequest, r.GetWorkspace(), r.GetId(), int64(r.GetState()), int64(0), data, int64(loopsv1.AccessState_ACCESS_STATE_PENDING)); err != nil {
			return nil, false, err
		}
		return r, false, nil
	}
	data, err := proto.Marshal(r)
	if err != nil {
		return nil, false, err
	}
	n, err := tx.Exec(ctx, `INSERT INTO access_requests (id, workspace, requested_by, model, state, create_time, expire_time, data)
		SELECT `+d.AccessRequestColumns+`
		WHERE (SELECT count(*) FROM access_requests WHERE workspace = $2 AND state = 1) < $9`,
		r.GetId(), r.GetWorkspace(), r.GetRequestedBy(), r.GetRequested().GetModel(), int64(r.GetState()),
		Nanos(r.GetCreateTime()), int64(0), data, int64(max))
	if err != nil {
		return nil, false, err
	}
	if n == 0 {
		return nil, false, fmt.Errorf("put access request: workspace %s holds %d pending requests: %w", r.GetWorkspace(), max, store.ErrLimit)
	}
	if err := insertHook(ctx, tx, hook); err != nil {
		return nil, false, err
	}
	return r, true, nil
}

// TransitionAccessRequest is store.AccessStore's TransitionAccessRequest in tx.
func (d Dialect) TransitionAccessRequest(ctx context.Context, tx Tx, r *loopsv1.AccessRequest, from loopsv1.AccessState, ev store.OwnedAuditEvent, hook *store.WebhookEvent) error {
	cur, err := tx.Blobs(ctx, GetAccessRequest+d.LockRows, r.GetWorkspace(), r.GetId())
	if err != nil {
		return err
	}
	if len(cur) == 0 {
		return fmt.Errorf("access request %s: %w", r.GetId(), store.ErrNotFound)
	}
	data, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	n, err := tx.Exec(ctx, updateRequest, r.GetWorkspace(), r.GetId(), int64(r.GetState()), Nanos(r.GetExpireTime()), data, int64(from))
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("access request %s is no longer %s: %w", r.GetId(), from, store.ErrConflict)
	}
	if _, err := tx.Exec(ctx, InsertAuditEvent, AuditEventArgs(ev)...); err != nil {
		return err
	}
	return insertHook(ctx, tx, hook)
}

func insertHook(ctx context.Context, tx Tx, hook *store.WebhookEvent) error {
	if hook == nil {
		return nil
	}
	d := hook.Delivery
	data, err := proto.Marshal(d)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, insertWebhook, d.GetId(), hook.Workspace, d.GetState(), Nanos(d.GetCreateTime()), Nanos(d.GetNextAttemptTime()), hook.Body, data)
	return err
}

// UpdateWebhookDeliveryArgs are UpdateWebhookDelivery's arguments for d.
func UpdateWebhookDeliveryArgs(d *loopsv1.WebhookDelivery) ([]any, error) {
	data, err := proto.Marshal(d)
	if err != nil {
		return nil, err
	}
	return []any{d.GetId(), d.GetState(), Nanos(d.GetNextAttemptTime()), data}, nil
}

// DecodeWebhookEvent decodes a DueWebhookDeliveries row.
func DecodeWebhookEvent(workspace string, body, data []byte) (store.WebhookEvent, error) {
	d := &loopsv1.WebhookDelivery{}
	if err := proto.Unmarshal(data, d); err != nil {
		return store.WebhookEvent{}, fmt.Errorf("decode webhook delivery: %w", err)
	}
	return store.WebhookEvent{Workspace: workspace, Delivery: d, Body: body}, nil
}
