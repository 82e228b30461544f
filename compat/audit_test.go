package compat

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// fakeAudit serves n events, newest first, in pages, and remembers the requests.
type fakeAudit struct {
	n    int
	reqs []*loopsv1.ListAuditEventsRequest
	rate string // GetCheckpointStorage's storage price
}

func (f *fakeAudit) ListAuditEvents(_ context.Context, req *loopsv1.ListAuditEventsRequest) (*loopsv1.ListAuditEventsResponse, error) {
	f.reqs = append(f.reqs, req)
	start := 0
	if req.GetPageToken() != "" {
		start, _ = strconv.Atoi(req.GetPageToken())
	}
	out := &loopsv1.ListAuditEventsResponse{}
	base := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	for i := start; i < f.n && i < start+int(req.GetPageSize()); i++ {
		seq := int64(f.n - i) // newest first
		out.Events = append(out.Events, &loopsv1.AuditEvent{Seq: seq, Time: timestamppb.New(base.Add(time.Duration(seq) * time.Second)),
			KeyId: "key-1", Event: "checkpoint_delete", Resource: "checkpoint", Target: "tinker://run-1/weights/c" + strconv.FormatInt(seq, 10),
			HttpStatus: 200, Code: "ok"})
	}
	if start+int(req.GetPageSize()) < f.n {
		out.NextPageToken = strconv.Itoa(start + int(req.GetPageSize()))
	}
	return out, nil
}

func (f *fakeAudit) GetCheckpointStorage(context.Context, *loopsv1.GetCheckpointStorageRequest) (*loopsv1.GetCheckpointStorageResponse, error) {
	return &loopsv1.GetCheckpointStorageResponse{CheckpointCount: 3, SizeBytes: 2_500_000_000, RateUsdPerGbMonth: f.rate}, nil
}

func auditHandler(f *fakeAudit) http.Handler {
	s := newFakeCore().services()
	s.Audit = f
	return NewHandler(s, Options{})
}

func get(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	return rec.Code, body
}

func TestAuditRoute(t *testing.T) {
	f := &fakeAudit{n: 2500}
	h := auditHandler(f)
	code, body := get(t, h, "/api/v1/audit?event_type=checkpoints&day=2026-01-02")
	require.Equal(t, http.StatusOK, code)
	entries := body["entries"].([]any)
	require.Len(t, entries, 2500, "every page is read")
	require.Nil(t, body["truncated"])
	first, last := entries[0].(map[string]any), entries[2499].(map[string]any)
	require.Less(t, first["timestamp"].(string), last["timestamp"].(string), "oldest first")
	require.Equal(t, "tinker://run-1/weights/c1", first["tinker_path"])
	require.Equal(t, "run-1", first["model_id"])
	require.Equal(t, "key-1", first["event_details"].(map[string]any)["key_id"])
	req := f.reqs[0]
	require.Equal(t, "checkpoint", req.GetResource())
	require.Equal(t, time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), req.GetStartTime().AsTime())
	require.Equal(t, 24*time.Hour, req.GetEndTime().AsTime().Sub(req.GetStartTime().AsTime()))

	// All types: no resource filter; today by default; more than the cap is truncated.
	f2 := &fakeAudit{n: maxAuditEntries + 5}
	code, body = get(t, auditHandler(f2), "/api/v1/audit")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, body["entries"], maxAuditEntries)
	require.Equal(t, true, body["truncated"])
	require.Empty(t, f2.reqs[0].GetResource())
	require.Equal(t, time.Now().UTC().Truncate(24*time.Hour), f2.reqs[0].GetStartTime().AsTime())

	for _, bad := range []string{"?event_type=everything", "?day=yesterday", "?day=2026-02-30", "?day=0001-01-01"} {
		code, body = get(t, h, "/api/v1/audit"+bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
		require.NotEmpty(t, body["detail"], bad)
	}
}

func TestCheckpointStorageRoute(t *testing.T) {
	h := auditHandler(&fakeAudit{})
	code, body := get(t, h, "/api/v1/billing/usage/checkpoints/current")
	require.Equal(t, http.StatusOK, code)
	require.Nil(t, body["effective_rate_usd_per_gigabyte_month"])
	row := body["data"].([]any)[0].(map[string]any)
	require.EqualValues(t, 3, row["checkpoint_count"])
	require.EqualValues(t, 2_500_000_000, row["size_bytes"])
	require.InDelta(t, 2.5, row["size_gigabytes"], 1e-12)
	code, _ = get(t, h, "/api/v1/billing/usage/checkpoints/current?project_id=p")
	require.Equal(t, http.StatusBadRequest, code)
	// Under a storage price, the rate as an exact JSON number.
	rec := httptest.NewRecorder()
	auditHandler(&fakeAudit{rate: "0.031"}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/billing/usage/checkpoints/current", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `"effective_rate_usd_per_gigabyte_month":0.031`)

	// Without an audit service the routes say so.
	code, _ = get(t, NewHandler(newFakeCore().services(), Options{}), "/api/v1/audit")
	require.Equal(t, http.StatusNotFound, code)
}

// FuzzAuditQuery: any query string gets a 200 or a 400, never a 5xx or a panic.
func FuzzAuditQuery(f *testing.F) {
	h := auditHandler(&fakeAudit{n: 3})
	f.Add("event_type=all&day=2026-01-02")
	f.Add("event_type=teams")
	f.Add("day=9999-12-31")
	f.Add("day=%zz&event_type=%00")
	f.Fuzz(func(t *testing.T, q string) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/api/v1/audit", nil)
		r.URL.RawQuery = q
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
			t.Fatalf("query %q: status %d: %s", q, rec.Code, rec.Body.String())
		}
	})
}
