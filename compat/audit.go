package compat

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// maxAuditEntries caps the entries of one audit answer (a day of a busy workspace can hold
// more: the newest are answered, with truncated set; loops.v1 AuditService pages through all).
const maxAuditEntries = 10000

// auditEventTypes maps the SDK's event_type to the resources of Loops' events: Loops'
// workspaces stand for Tinker's organizations, and API keys for team membership.
var auditEventTypes = map[string][]string{
	"all":           nil,
	"checkpoints":   {"checkpoint"},
	"projects":      {"project"},
	"teams":         {"key"},
	"organizations": {"workspace"},
}

// auditLogEntry is SDK AuditLogEntry.
type auditLogEntry struct {
	Timestamp    string         `json:"timestamp"`
	Event        string         `json:"event"`
	EventDetails map[string]any `json:"event_details"`
	ModelID      *string        `json:"model_id,omitempty"`
	TinkerPath   *string        `json:"tinker_path,omitempty"`
}

// auditLogResponse is SDK AuditLogResponse (truncated is Loops' own).
type auditLogResponse struct {
	Entries   []auditLogEntry `json:"entries"`
	Truncated bool            `json:"truncated,omitempty"`
}

// audit answers GET /api/v1/audit?event_type=&day= (AdminClient.get_audit_log): the
// workspace's audit events of one UTC day (default today), oldest first.
func (s *server) audit(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Audit == nil {
		return notImplemented("the audit log is not served by this handler")
	}
	q := r.URL.Query()
	et := q.Get("event_type")
	if et == "" {
		et = "all"
	}
	resources, ok := auditEventTypes[et]
	if !ok {
		return badRequest("event_type %q is not one of all, checkpoints, projects, teams, organizations", et)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	if d := q.Get("day"); d != "" {
		t, err := time.Parse(time.DateOnly, d)
		if err != nil || t.Year() < 1970 || t.Year() > 9999 {
			return badRequest("day %q is not a date YYYY-MM-DD between 1970 and 9999", d)
		}
		day = t
	}
	req := &loopsv1.ListAuditEventsRequest{StartTime: timestamppb.New(day), EndTime: timestamppb.New(day.Add(24 * time.Hour)),
		PageSize: 1000}
	if len(resources) == 1 {
		req.Resource = resources[0]
	}
	out := auditLogResponse{Entries: []auditLogEntry{}}
	for {
		res, err := s.svc.Audit.ListAuditEvents(r.Context(), req)
		if err != nil {
			return err
		}
		for _, e := range res.GetEvents() {
			if len(out.Entries) == maxAuditEntries {
				out.Truncated = true
				break
			}
			out.Entries = append(out.Entries, auditEntry(e))
		}
		if out.Truncated || res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	slices.Reverse(out.Entries) // newest first → sorted by timestamp
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

// auditEntry is the SDK's form of an event: who, from where, what and the outcome go in
// event_details; a checkpoint event also fills the deprecated tinker_path and model_id.
func auditEntry(e *loopsv1.AuditEvent) auditLogEntry {
	details := map[string]any{
		"key_id": e.GetKeyId(), "client_addr": e.GetClientAddr(), "surface": e.GetSurface(),
		"action": e.GetAction(), "status": e.GetHttpStatus(), "code": e.GetCode(), "seq": e.GetSeq(),
	}
	if e.GetTarget() != "" {
		details["target"] = e.GetTarget()
	}
	out := auditLogEntry{Timestamp: e.GetTime().AsTime().UTC().Format(time.RFC3339Nano), Event: e.GetEvent(), EventDetails: details}
	if p := e.GetTarget(); e.GetResource() == "checkpoint" && strings.HasPrefix(p, "tinker://") {
		run, _, _ := strings.Cut(strings.TrimPrefix(p, "tinker://"), "/")
		out.TinkerPath, out.ModelID = &p, &run
	}
	return out
}

// checkpointStorageItem is SDK CurrentCheckpointStorageUsageItem. Loops does not price
// storage: the cost is null.
type checkpointStorageItem struct {
	ProjectID       *string  `json:"project_id"`
	OrgUserURN      *string  `json:"org_user_urn"`
	UserEmail       *string  `json:"user_email"`
	UserName        *string  `json:"user_name"`
	CheckpointCount int64    `json:"checkpoint_count"`
	SizeBytes       int64    `json:"size_bytes"`
	SizeGigabytes   float64  `json:"size_gigabytes"`
	EstimatedCost   *float64 `json:"estimated_monthly_cost_usd"`
}

// checkpointStorage answers GET /api/v1/billing/usage/checkpoints/current
// (AdminClient.get_current_checkpoint_storage_usage, `tinker billing checkpoint-storage`):
// one row, the workspace's checkpoints now; size_gigabytes is in decimal GB (10^9 bytes).
func (s *server) checkpointStorage(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Audit == nil {
		return notImplemented("checkpoint storage is not served by this handler")
	}
	if p := r.URL.Query().Get("project_id"); p != "" {
		return badRequest("project_id %q: Loops reports checkpoint storage per workspace only; leave project_id out for the workspace's total", p)
	}
	res, err := s.svc.Audit.GetCheckpointStorage(r.Context(), &loopsv1.GetCheckpointStorageRequest{})
	if err != nil {
		return err
	}
	var rate *json.Number // the SDK's None without a storage price
	if r := res.GetRateUsdPerGbMonth(); r != "" {
		n := json.Number(r)
		rate = &n
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]any{
		"effective_rate_usd_per_gigabyte_month": rate,
		"data": []checkpointStorageItem{{CheckpointCount: res.GetCheckpointCount(), SizeBytes: res.GetSizeBytes(),
			SizeGigabytes: float64(res.GetSizeBytes()) / 1e9}},
	})
	return nil
}
