package sqlstore

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The audit log's statements (migration 0007_audit).
const (
	// InsertAuditEvent appends one event; seq is assigned by the database.
	InsertAuditEvent = `INSERT INTO audit_events (workspace, time, key_id, client_addr, surface, action, event, resource, target, status, code)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	// DeleteAuditEventsBefore is the retention sweep.
	DeleteAuditEventsBefore = `DELETE FROM audit_events WHERE time < $1`
	// AuditWorkspacesOver lists the workspaces holding more than $1 events.
	AuditWorkspacesOver = `SELECT workspace FROM audit_events GROUP BY workspace HAVING count(*) > $1`
	// TrimAuditWorkspace removes a workspace's ($1) events but the newest $2.
	TrimAuditWorkspace = `DELETE FROM audit_events WHERE workspace = $1 AND seq <=
		(SELECT seq FROM audit_events WHERE workspace = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)`
	// CheckpointStorage sums a workspace's checkpoints: count, bytes of the rows with a
	// size column, and how many rows have none (written before migration 0007).
	CheckpointStorage = `SELECT count(*), CAST(coalesce(sum(size_bytes), 0) AS BIGINT), count(*) - count(size_bytes)
		FROM checkpoints WHERE workspace = $1`
	// CheckpointBytes sums every workspace's checkpoint sizes by their run (with the run's
	// session), at most $1 rows.
	CheckpointBytes = `SELECT c.workspace, coalesce(r.session_id, ''), c.training_run_id, CAST(sum(c.size_bytes) AS BIGINT)
		FROM checkpoints c LEFT JOIN training_runs r ON r.id = c.training_run_id AND r.workspace = c.workspace
		WHERE c.size_bytes IS NOT NULL GROUP BY c.workspace, r.session_id, c.training_run_id ORDER BY 1, 2, 3 LIMIT $1`
	// UnsizedCheckpoints selects the data of a workspace's checkpoints without a size column.
	UnsizedCheckpoints = `SELECT data FROM checkpoints WHERE workspace = $1 AND size_bytes IS NULL`
)

// AuditEventArgs are InsertAuditEvent's arguments for e.
func AuditEventArgs(e store.OwnedAuditEvent) []any {
	ev := e.Event
	return []any{e.Workspace, ev.Time.UnixNano(), ev.KeyID, ev.ClientAddr, ev.Surface, ev.Action, ev.Event,
		ev.Resource, ev.Target, int64(ev.Status), ev.Code}
}

// ListAuditEvents is the query of q over a workspace's events.
func ListAuditEvents(workspace string, q store.AuditQuery) Query {
	var b strings.Builder
	args := []any{workspace}
	b.WriteString(`SELECT seq, time, key_id, client_addr, surface, action, event, resource, target, status, code
		FROM audit_events WHERE workspace = $1`)
	cond := func(sql string, v any) {
		args = append(args, v)
		fmt.Fprintf(&b, " AND "+sql, len(args))
	}
	if !q.From.IsZero() {
		cond("time >= $%d", q.From.UnixNano())
	}
	if !q.To.IsZero() {
		cond("time < $%d", q.To.UnixNano())
	}
	if q.KeyID != "" {
		cond("key_id = $%d", q.KeyID)
	}
	if q.Resource != "" {
		cond("resource = $%d", q.Resource)
	}
	if q.Action != "" {
		args = append(args, q.Action)
		fmt.Fprintf(&b, " AND (event = $%d OR action = $%d)", len(args), len(args))
	}
	if q.Before > 0 {
		cond("seq < $%d", q.Before)
	}
	if q.After > 0 {
		cond("seq > $%d", q.After)
	}
	if q.Ascending {
		b.WriteString(" ORDER BY seq ASC")
	} else {
		b.WriteString(" ORDER BY seq DESC")
	}
	args = append(args, q.PageSize())
	fmt.Fprintf(&b, " LIMIT $%d", len(args))
	return Query{SQL: b.String(), Args: args}
}

// ScanAuditEvents reads the rows of ListAuditEvents.
func ScanAuditEvents(rows Rows) ([]store.AuditEvent, error) {
	var out []store.AuditEvent
	for rows.Next() {
		var e store.AuditEvent
		var t, status int64
		if err := rows.Scan(&e.Seq, &t, &e.KeyID, &e.ClientAddr, &e.Surface, &e.Action, &e.Event,
			&e.Resource, &e.Target, &status, &e.Code); err != nil {
			return nil, err
		}
		e.Time = time.Unix(0, t).UTC()
		e.Status = int(status)
		out = append(out, e)
	}
	return out, rows.Err()
}

// SumUnsizedCheckpoints adds up the sizes recorded in the data of checkpoints written before
// the size column existed (rows of UnsizedCheckpoints).
func SumUnsizedCheckpoints(rows Rows) (int64, error) {
	var sum int64
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return 0, err
		}
		var c loopsv1.Checkpoint
		if err := proto.Unmarshal(data, &c); err != nil {
			return 0, fmt.Errorf("decode checkpoint: %w", err)
		}
		sum += max(c.GetSizeBytes(), 0)
	}
	return sum, rows.Err()
}

// ScanCheckpointBytes reads CheckpointBytes' rows.
func ScanCheckpointBytes(rows Rows) ([]store.SessionCheckpointBytes, error) {
	var out []store.SessionCheckpointBytes
	for rows.Next() {
		var b store.SessionCheckpointBytes
		if err := rows.Scan(&b.Workspace, &b.SessionID, &b.RunID, &b.Bytes); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}
