package store

import (
	"context"
	"errors"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// ErrConflict is returned by a transition of a record that is no longer in the state the
// transition starts from (an access request decided by someone else meanwhile); nothing was
// written.
var ErrConflict = errors.New("store: record changed meanwhile")

// The states of a webhook delivery (loops.v1 WebhookDelivery.state).
const (
	WebhookPending   = "pending"
	WebhookDelivered = "delivered"
	WebhookFailed    = "failed"
)

// WebhookEvent is a webhook delivery of a workspace with the body it sends.
type WebhookEvent struct {
	Workspace string
	Delivery  *loopsv1.WebhookDelivery
	Body      []byte
}

// AccessQuery selects a workspace's access requests. Zero fields do not filter.
type AccessQuery struct {
	// RequestedBy keeps the requests of one key.
	RequestedBy string
	// State keeps the requests in one state.
	State loopsv1.AccessState
	// Limit bounds the answer as a Page's Limit is bounded.
	Limit int
}

// AccessStore keeps access requests (loops.v1 AccessRequest) and the webhook deliveries of
// their events. A granted request is part of its workspace's effective policy
// (gateway/policy), so every change of state is one transaction with its audit event and
// its webhook delivery.
type AccessStore interface {
	// PutAccessRequest files r (state pending): it replaces the pending request of the
	// same workspace, key (RequestedBy) and model, keeping that one's id and create_time,
	// or inserts r unless the workspace already holds max pending requests (ErrLimit). A
	// new request's hook, when not nil, is enqueued in the same transaction. It returns
	// the stored record and whether it was new.
	PutAccessRequest(ctx context.Context, r *loopsv1.AccessRequest, max int, hook *WebhookEvent) (*loopsv1.AccessRequest, bool, error)
	// GetAccessRequest returns a request of the workspace by id.
	GetAccessRequest(ctx context.Context, workspace, id string) (*loopsv1.AccessRequest, error)
	// ListAccessRequests lists a workspace's requests that q selects, newest first.
	ListAccessRequests(ctx context.Context, workspace string, q AccessQuery) ([]*loopsv1.AccessRequest, error)
	// TransitionAccessRequest replaces the stored request r.Id of r.Workspace with r if it
	// is still in state from, and appends ev to the audit log and hook (when not nil) to
	// the webhook queue, all in one transaction: ErrConflict (nothing written) when its
	// state is no longer from, ErrNotFound when there is no such request.
	TransitionAccessRequest(ctx context.Context, r *loopsv1.AccessRequest, from loopsv1.AccessState, ev OwnedAuditEvent, hook *WebhookEvent) error
	// GrantedAccessRequests lists every workspace's requests in state granted.
	GrantedAccessRequests(ctx context.Context) ([]*loopsv1.AccessRequest, error)

	// DueWebhookDeliveries lists at most limit pending deliveries due at now, oldest first.
	DueWebhookDeliveries(ctx context.Context, now time.Time, limit int) ([]WebhookEvent, error)
	// UpdateWebhookDelivery stores a delivery's new state (its id must exist).
	UpdateWebhookDelivery(ctx context.Context, d *loopsv1.WebhookDelivery) error
	// ListWebhookDeliveries lists a workspace's deliveries (without bodies), newest first,
	// at most limit (bounded as a Page's).
	ListWebhookDeliveries(ctx context.Context, workspace string, limit int) ([]*loopsv1.WebhookDelivery, error)
	// CountPendingWebhookDeliveries counts every workspace's pending deliveries.
	CountPendingWebhookDeliveries(ctx context.Context) (int, error)
}
