package compat

import (
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Session search and projects: POST /api/v1/sessions/search (RestClient.search_sessions)
// and PUT /api/v1/sessions/{id}/project (RestClient.assign_session_project), onto loops.v1
// SessionService.SearchSessions and SetSessionProject.

// tinkerTimeLayout is how times go to the SDK: RFC 3339 in UTC with microseconds, the
// precision a Python datetime keeps (a search cursor comes back exactly as it was sent).
const tinkerTimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// searchSessionsRequest is the SDK's SessionSearchRequest, plus Loops' tags and creation
// time range (which the SDK does not send).
type searchSessionsRequest struct {
	SessionID    *string           `json:"session_id"`
	ProjectIDs   []string          `json:"project_ids"`
	UserMetadata map[string]string `json:"user_metadata"`
	DisplayName  *string           `json:"display_name"`
	Owner        *struct {
		Type      string   `json:"type"`
		OwnerURNs []string `json:"owner_urns"`
	} `json:"owner"`
	Statuses []struct {
		Type    string   `json:"type"`
		Reasons []string `json:"reasons"`
	} `json:"statuses"`
	Limit  *int64 `json:"limit"`
	Cursor *struct {
		LastCreatedAt string `json:"last_created_at"`
		LastSessionID string `json:"last_session_id"`
	} `json:"cursor"`
	Tags          []string `json:"tags"`
	CreatedAfter  *string  `json:"created_after"`
	CreatedBefore *string  `json:"created_before"`
}

// maxSearchStatuses bounds a search's statuses before they are expanded (the SDK has four
// kinds; a client_finished one lists at most its three reasons).
const maxSearchStatuses = 8

func (s *server) searchSessions(w http.ResponseWriter, r *http.Request) error {
	var req searchSessionsRequest
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	in := &loopsv1.SearchSessionsRequest{
		ProjectIds: req.ProjectIDs, UserMetadata: req.UserMetadata, Tags: req.Tags, Own: true,
	}
	if req.SessionID != nil {
		if *req.SessionID == "" {
			return badRequest("session_id must not be empty: leave it out to search every session")
		}
		in.SessionId = *req.SessionID
	}
	if req.DisplayName != nil {
		if *req.DisplayName == "" {
			return badRequest("display_name must not be empty: leave it out to match every name")
		}
		in.DisplayName = *req.DisplayName
	}
	if o := req.Owner; o != nil {
		switch o.Type {
		case "own":
		case "accessible":
			in.Own = false
		case "user":
			if len(o.OwnerURNs) < 1 || len(o.OwnerURNs) > 10 {
				return badRequest("owner.owner_urns must list 1 to 10 owners (API key ids, key-<16 hex>)")
			}
			in.Own, in.Owners = false, o.OwnerURNs
		default:
			return badRequest("owner.type %q is not one of own, accessible, user", clip(o.Type))
		}
	}
	if req.Statuses != nil && len(req.Statuses) == 0 {
		return badRequest("statuses must not be empty: leave it out to match every status")
	}
	if len(req.Statuses) > maxSearchStatuses {
		return badRequest("%d statuses, over the maximum of %d", len(req.Statuses), maxSearchStatuses)
	}
	for _, st := range req.Statuses {
		switch st.Type {
		case "active", "failed", "cancelled":
			in.Statuses = append(in.Statuses, st.Type)
		case "client_finished":
			if st.Reasons == nil {
				in.Statuses = append(in.Statuses, "finished")
				break
			}
			if len(st.Reasons) == 0 || len(st.Reasons) > 3 {
				return badRequest("statuses[].reasons must list 1 to 3 of success, errored, interrupted")
			}
			for _, reason := range st.Reasons {
				if reason != "success" && reason != "errored" && reason != "interrupted" {
					return badRequest("status reason %q is not one of success, errored, interrupted", clip(reason))
				}
				in.Statuses = append(in.Statuses, "finished:"+reason)
			}
		default:
			return badRequest("status type %q is not one of active, cancelled, failed, client_finished", clip(st.Type))
		}
	}
	if req.Limit != nil {
		if *req.Limit < 1 || *req.Limit > 200 {
			return badRequest("limit %d is out of range: use 1 to 200", *req.Limit)
		}
		in.Limit = int32(*req.Limit)
	}
	if c := req.Cursor; c != nil {
		t, err := parseTinkerTime("cursor.last_created_at", c.LastCreatedAt)
		if err != nil {
			return err
		}
		in.After = &loopsv1.SessionSearchCursor{CreateTime: t, SessionId: c.LastSessionID}
	}
	var err error
	if req.CreatedAfter != nil {
		if in.CreatedAfter, err = parseTinkerTime("created_after", *req.CreatedAfter); err != nil {
			return err
		}
	}
	if req.CreatedBefore != nil {
		if in.CreatedBefore, err = parseTinkerTime("created_before", *req.CreatedBefore); err != nil {
			return err
		}
	}
	res, err := s.svc.Sessions.SearchSessions(r.Context(), in)
	if err != nil {
		return err
	}
	type cursorOut struct {
		LastCreatedAt string `json:"last_created_at"`
		LastSessionID string `json:"last_session_id"`
	}
	out := struct {
		Sessions   []sessionSummaryJSON `json:"sessions"`
		NextCursor *cursorOut           `json:"next_cursor"`
	}{Sessions: []sessionSummaryJSON{}}
	for _, h := range res.GetResults() {
		out.Sessions = append(out.Sessions, sessionSummary(h))
	}
	if res.GetNextPageToken() != "" && len(out.Sessions) > 0 {
		last := out.Sessions[len(out.Sessions)-1]
		out.NextCursor = &cursorOut{LastCreatedAt: last.CreatedAt, LastSessionID: last.SessionID}
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

// parseTinkerTime parses an RFC 3339 time the SDK sent.
func parseTinkerTime(field, v string) (*timestamppb.Timestamp, error) {
	if len(v) > 64 {
		return nil, badRequest("%s is not an RFC 3339 time", field)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, badRequest("%s %q is not an RFC 3339 time with a zone (e.g. 2026-01-02T15:04:05.000000Z)", field, clip(v))
	}
	return timestamppb.New(t), nil
}

// sessionSummaryJSON is the SDK's SessionSummary.
type sessionSummaryJSON struct {
	SessionID        string            `json:"session_id"`
	CreatedAt        string            `json:"created_at"`
	Owner            string            `json:"owner"`
	ProjectID        string            `json:"project_id"`
	Status           any               `json:"status,omitempty"`
	CheckpointsCount int64             `json:"checkpoints_count"`
	DisplayName      string            `json:"display_name,omitempty"`
	UserMetadata     map[string]string `json:"user_metadata,omitempty"`
}

// sessionSummary is a search result as the SDK reads it. A session that timed out, or that
// its client finished for a reason the SDK has no name for, has no status (the SDK's None).
func sessionSummary(h *loopsv1.SessionSearchResult) sessionSummaryJSON {
	ss := h.GetSession()
	out := sessionSummaryJSON{
		SessionID: ss.GetId(), CreatedAt: ss.GetCreateTime().AsTime().UTC().Format(tinkerTimeLayout),
		Owner: ss.GetOwner(), ProjectID: ss.GetProjectId(), CheckpointsCount: h.GetCheckpointCount(),
		DisplayName: ss.GetDisplayName(), UserMetadata: ss.GetUserMetadata(),
	}
	if out.ProjectID == "" {
		out.ProjectID = "default"
	}
	type kind struct {
		Type string `json:"type"`
	}
	switch reason, finished := strings.CutPrefix(ss.GetEndReason(), "finished: "); {
	case !ss.GetExpired():
		out.Status = kind{"active"}
	case finished && (reason == "success" || reason == "errored" || reason == "interrupted"):
		out.Status = struct {
			Type   string `json:"type"`
			Reason kind   `json:"reason"`
		}{"client_finished", kind{reason}}
	}
	return out
}

// setSessionProject moves a session (and its training runs) into a project.
func (s *server) setSessionProject(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		ProjectID *string `json:"project_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.ProjectID == nil || *req.ProjectID == "" {
		return badRequest("project_id is required: the project to move the session into")
	}
	if _, err := s.svc.Sessions.SetSessionProject(r.Context(), &loopsv1.SetSessionProjectRequest{
		Id: r.PathValue("id"), ProjectId: *req.ProjectID,
	}); err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

// clip shortens a client's string quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
