package compat

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestSearchSessionsTranslates: the SDK's SessionSearchRequest becomes loops.v1's
// SearchSessionsRequest field by field, and each result the SDK's SessionSummary, with a
// next_cursor naming the page's last session.
func TestSearchSessionsTranslates(t *testing.T) {
	e := newEnv(t)
	created := time.Date(2026, 12, 6, 3, 4, 5, 123456000, time.UTC)
	e.core.sessions["sess-1"] = &loopsv1.Session{Id: "sess-1", CreateTime: timestamppb.New(created), Owner: "key-0123456789abcdef",
		DisplayName: "nightly", UserMetadata: map[string]string{"k": "v"}, Expired: true, EndReason: "finished: success"}

	r := e.postJSON("/api/v1/sessions/search", `{"session_id":"sess-1","project_ids":["p"],"user_metadata":{"k":"v"},
		"display_name":"night","owner":{"type":"accessible"},
		"statuses":[{"type":"active"},{"type":"client_finished","reasons":["success","errored"]},{"type":"failed"}],
		"limit":7,"cursor":{"last_created_at":"2026-12-06T03:04:05.123456Z","last_session_id":"sess-9"},
		"tags":["t"],"created_after":"2026-01-01T00:00:00Z"}`)
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Empty(t, cmp.Diff(&loopsv1.SearchSessionsRequest{
		SessionId: "sess-1", ProjectIds: []string{"p"}, UserMetadata: map[string]string{"k": "v"}, DisplayName: "night",
		Statuses: []string{"active", "finished:success", "finished:errored", "failed"}, Limit: 7,
		After:        &loopsv1.SessionSearchCursor{CreateTime: timestamppb.New(created), SessionId: "sess-9"},
		Tags:         []string{"t"},
		CreatedAfter: timestamppb.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
	}, e.core.lastReq("SearchSessions"), protocmp.Transform()))
	require.Equal(t, map[string]any{
		"sessions": []any{map[string]any{
			"session_id": "sess-1", "created_at": "2026-12-06T03:04:05.123456Z", "owner": "key-0123456789abcdef",
			"project_id": "default", "checkpoints_count": float64(2), "display_name": "nightly",
			"user_metadata": map[string]any{"k": "v"},
			"status":        map[string]any{"type": "client_finished", "reason": map[string]any{"type": "success"}},
		}},
		"next_cursor": map[string]any{"last_created_at": "2026-12-06T03:04:05.123456Z", "last_session_id": "sess-1"},
	}, r.json(t))

	// The SDK's default owner is the caller's own sessions.
	require.Equal(t, 200, e.postJSON("/api/v1/sessions/search", `{}`).status)
	require.Empty(t, cmp.Diff(&loopsv1.SearchSessionsRequest{Own: true}, e.core.lastReq("SearchSessions"), protocmp.Transform()))
	require.Equal(t, 200, e.postJSON("/api/v1/sessions/search", `{"owner":{"type":"user","owner_urns":["key-a"]}}`).status)
	require.Empty(t, cmp.Diff(&loopsv1.SearchSessionsRequest{Owners: []string{"key-a"}}, e.core.lastReq("SearchSessions"), protocmp.Transform()))

	for _, bad := range []string{
		`{"limit":0}`, `{"limit":201}`, `{"limit":99999999999}`, `{"session_id":""}`, `{"display_name":""}`,
		`{"owner":{"type":"everyone"}}`, `{"owner":{"type":"user","owner_urns":[]}}`, `{"statuses":[]}`,
		`{"statuses":[{"type":"lost"}]}`, `{"statuses":[{"type":"client_finished","reasons":["bored"]}]}`,
		`{"cursor":{"last_created_at":"yesterday","last_session_id":"s"}}`, `{"created_before":"2026-01-01"}`,
	} {
		r := e.postJSON("/api/v1/sessions/search", bad)
		require.Equal(t, 400, r.status, "%s: %s", bad, r.body)
		require.NotEmpty(t, r.json(t)["detail"], bad)
	}
}

// TestSetSessionProjectTranslates: PUT /api/v1/sessions/{id}/project with the SDK's body.
func TestSetSessionProjectTranslates(t *testing.T) {
	e := newEnv(t)
	e.core.sessions["sess-1"] = &loopsv1.Session{Id: "sess-1"}
	r := e.do("PUT", "/api/v1/sessions/sess-1/project", []byte(`{"project_id":"vision"}`), map[string]string{"Content-Type": "application/json"})
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Empty(t, cmp.Diff(&loopsv1.SetSessionProjectRequest{Id: "sess-1", ProjectId: "vision"},
		e.core.lastReq("SetSessionProject"), protocmp.Transform()))
	r = e.do("PUT", "/api/v1/sessions/sess-1/project", []byte(`{}`), map[string]string{"Content-Type": "application/json"})
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "project_id")
	r = e.do("PUT", "/api/v1/sessions/nope/project", []byte(`{"project_id":"vision"}`), map[string]string{"Content-Type": "application/json"})
	require.Equal(t, 404, r.status)
}

// FuzzSearchSessionsBody: any body of sessions/search or sessions/{id}/project answers a
// 2xx or a 4xx, never a 5xx or a panic.
func FuzzSearchSessionsBody(f *testing.F) {
	core := newFakeCore()
	h := NewHandler(core.services(), Options{MaxBodyBytes: 1 << 20, MaxDecompressedBytes: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	core.sessions["sess-1"] = &loopsv1.Session{Id: "sess-1", CreateTime: timestamppb.Now(), Expired: true, EndReason: "finished: odd"}
	f.Add(false, []byte(`{"user_metadata":{"k":"v"},"owner":{"type":"user","owner_urns":["key-a"]},"statuses":[{"type":"client_finished","reasons":["success"]}],"limit":200,"cursor":{"last_created_at":"2026-12-06T03:04:05.123456+01:00","last_session_id":"s"}}`))
	f.Add(false, []byte(`{"session_id":"sess-1","display_name":"a b","project_ids":["p"],"tags":["t"],"created_after":"2026-01-01T00:00:00Z","created_before":"2027-01-01T00:00:00Z"}`))
	f.Add(false, []byte(`{"limit":-1,"statuses":null,"owner":null,"cursor":null}`))
	f.Add(true, []byte(`{"project_id":"vision"}`))
	f.Add(true, []byte(`{"project_id":7}`))
	f.Fuzz(func(t *testing.T, move bool, body []byte) {
		method, path := http.MethodPost, "/api/v1/sessions/search"
		if move {
			method, path = http.MethodPut, "/api/v1/sessions/sess-1/project"
		}
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s answered %d: %s", path, rec.Code, rec.Body.String())
		}
	})
}
