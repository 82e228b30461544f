package store

import (
	"context"
	"time"
)

// AuditEvent is one mutating call of a workspace, as the audit log keeps it (append-only:
// nothing updates a record; only the retention sweep and the per-workspace cap remove the
// oldest ones).
type AuditEvent struct {
	// Seq is the record's position in the log, assigned by the store on append (ascending
	// in append order); zero in an event being appended.
	Seq int64
	// Time is when the call arrived.
	Time time.Time
	// KeyID names the caller's API key (auth.KeyIDOf), never the key.
	KeyID string
	// ClientAddr is the client's address, after trusted proxies.
	ClientAddr string
	// Surface is the protocol the call came by: tinker, connect, grpc, grpcweb, rest,
	// openai, anthropic, console, checkpoints.
	Surface string
	// Action is what was called: a Tinker route pattern ("POST /api/v1/create_model") or a
	// loops.v1 procedure ("/loops.v1.SessionService/CreateSession").
	Action string
	// Event is the action as "<resource>_<verb>" (checkpoint_delete, session_create, …).
	Event string
	// Resource is the event's resource (checkpoint, session, training_run, …).
	Resource string
	// Target is the id the call acted on, where there is one ("" otherwise).
	Target string
	// Status is the HTTP status of the answer (a gRPC status as the error table maps it).
	Status int
	// Code is the answer's canonical code ("ok", "not_found", "resource_exhausted", …).
	Code string
}

// AuditQuery selects a workspace's audit events. Zero fields do not filter.
type AuditQuery struct {
	// From and To bound Time: From <= Time < To.
	From, To time.Time
	// KeyID keeps the events of one key.
	KeyID string
	// Action keeps the events whose Event or Action is this.
	Action string
	// Resource keeps the events of one resource.
	Resource string
	// Before keeps the events with Seq < Before (keyset paging, newest first); After those
	// with Seq > After (oldest first, with Ascending).
	Before, After int64
	// Ascending lists oldest first; the default is newest first.
	Ascending bool
	// Limit is the most events returned: <= 0 means DefaultPageLimit, above MaxPageLimit
	// means MaxPageLimit.
	Limit int
}

// PageSize is q.Limit within [1, MaxPageLimit], DefaultPageLimit when not positive.
func (q AuditQuery) PageSize() int {
	switch {
	case q.Limit <= 0:
		return DefaultPageLimit
	case q.Limit > MaxPageLimit:
		return MaxPageLimit
	}
	return q.Limit
}

// AuditStore keeps the audit log.
type AuditStore interface {
	// AppendAuditEvents appends events to their workspaces' logs, all or none, in order.
	AppendAuditEvents(ctx context.Context, events []OwnedAuditEvent) error
	// ListAuditEvents lists a workspace's events that q selects.
	ListAuditEvents(ctx context.Context, workspace string, q AuditQuery) ([]AuditEvent, error)
	// DeleteAuditEventsBefore removes every workspace's events older than t (the retention
	// sweep) and returns how many it removed.
	DeleteAuditEventsBefore(ctx context.Context, t time.Time) (int, error)
	// TrimAuditEvents removes the oldest events of every workspace that holds more than
	// keep, so that it holds keep, and returns how many it removed.
	TrimAuditEvents(ctx context.Context, keep int) (int, error)
}

// OwnedAuditEvent is an audit event and its workspace.
type OwnedAuditEvent struct {
	Workspace string
	Event     AuditEvent
}

// CheckpointStorage is what a workspace's checkpoints hold now.
type CheckpointStorage struct {
	// Checkpoints is how many checkpoints the workspace has.
	Checkpoints int64
	// Bytes is the sum of their sizes.
	Bytes int64
}

// CheckpointStorageReader sums a workspace's checkpoint storage.
type CheckpointStorageReader interface {
	// CheckpointStorage returns the count and total size of the workspace's checkpoints
	// (one aggregate query over the checkpoints' size column).
	CheckpointStorage(ctx context.Context, workspace string) (CheckpointStorage, error)
	// CheckpointBytes sums the sizes of every workspace's checkpoints by their training
	// run, with the run's session (SessionID "" for a run not found), at most limit rows,
	// ordered by workspace, session and run: what checkpoint storage metering samples.
	// Checkpoints written before migration 0007 (no size column) are left out.
	CheckpointBytes(ctx context.Context, limit int) ([]SessionCheckpointBytes, error)
}

// SessionCheckpointBytes is the size of a run's checkpoints, with the run's session.
type SessionCheckpointBytes struct {
	Workspace, SessionID, RunID string
	Bytes                       int64
}
