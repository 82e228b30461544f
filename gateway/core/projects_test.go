package core

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// TestProjectLimitAndDefault: every workspace lists its "default" project; creations past
// MaxProjectsPerWorkspace (default included) are 429 LIMIT_REACHED naming the limit, also
// when a session names a new project; deleting one frees room.
func TestProjectLimitAndDefault(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{Limits: Limits{MaxProjectsPerWorkspace: 3}})
	ps := h.svc.Projects
	list, err := ps.ListProjects(h.ctx, &loopsv1.ListProjectsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetProjects(), 1)
	require.Equal(t, store.DefaultProject, list.GetProjects()[0].GetName())

	for _, name := range []string{"a", "b"} {
		_, err := ps.CreateProject(h.ctx, &loopsv1.CreateProjectRequest{Name: name})
		require.NoError(t, err)
	}
	_, err = ps.CreateProject(h.ctx, &loopsv1.CreateProjectRequest{Name: "c"})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Contains(t, err.Error(), "max_projects_per_workspace")
	require.Equal(t, errs.ReasonLimitReached, errs.Reason(err))
	_, err = h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{ProjectId: "c"})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "a session naming a new project past the limit")

	// Another workspace has its own room.
	other := auth.WithWorkspace(t.Context(), "ws-b")
	_, err = ps.CreateProject(other, &loopsv1.CreateProjectRequest{Name: "c"})
	require.NoError(t, err)

	_, err = ps.DeleteProject(h.ctx, &loopsv1.DeleteProjectRequest{Name: "a"})
	require.NoError(t, err)
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{ProjectId: "c"})
	require.NoError(t, err, "room again: the session's project is created on first use")
	require.Equal(t, "c", sess.GetProjectId())
	_, err = ps.GetProject(h.ctx, &loopsv1.GetProjectRequest{Name: "c"})
	require.NoError(t, err)
}

// TestMoveLiveSession: moving a live session changes its record in memory and in the
// store at once (a later persist of the session keeps the new project), and its runs are
// listed under the new project.
func TestMoveLiveSession(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{DisplayName: "nightly"})
	require.NoError(t, err)
	require.Equal(t, store.DefaultProject, sess.GetProjectId())
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		SessionId: sess.GetId(), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	h.core.persistSessions(h.ctx)

	moved, err := h.svc.Sessions.SetSessionProject(h.ctx, &loopsv1.SetSessionProjectRequest{Id: sess.GetId(), ProjectId: "vision"})
	require.NoError(t, err)
	require.Equal(t, "vision", moved.GetProjectId())
	got, err := h.svc.Sessions.GetSession(h.ctx, &loopsv1.GetSessionRequest{Id: sess.GetId()})
	require.NoError(t, err)
	require.Equal(t, "vision", got.GetProjectId())
	h.core.persistSessions(h.ctx)
	stored, err := h.core.store.GetSession(h.ctx, "ws-a", sess.GetId())
	require.NoError(t, err)
	require.Equal(t, "vision", stored.GetProjectId())

	runs, err := h.svc.Training.ListTrainingRuns(h.ctx, &loopsv1.ListTrainingRunsRequest{ProjectId: "vision"})
	require.NoError(t, err)
	require.Len(t, runs.GetTrainingRuns(), 1)
	require.Equal(t, run, runs.GetTrainingRuns()[0].GetId())
	runs, err = h.svc.Training.ListTrainingRuns(h.ctx, &loopsv1.ListTrainingRunsRequest{ProjectId: store.DefaultProject})
	require.NoError(t, err)
	require.Empty(t, runs.GetTrainingRuns())

	found, err := h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{DisplayName: "NIGHT", ProjectIds: []string{"vision"}})
	require.NoError(t, err)
	require.Len(t, found.GetResults(), 1)

	// An ended session moves too (its record only).
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess.GetId(), Reason: "success"})
	require.NoError(t, err)
	moved, err = h.svc.Sessions.SetSessionProject(h.ctx, &loopsv1.SetSessionProjectRequest{Id: sess.GetId(), ProjectId: store.DefaultProject})
	require.NoError(t, err)
	require.Equal(t, store.DefaultProject, moved.GetProjectId())
	found, err = h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{Statuses: []string{"finished:success"}, ProjectIds: []string{store.DefaultProject}})
	require.NoError(t, err)
	require.Len(t, found.GetResults(), 1)
}

// TestSearchPagingAndOwner: pages of a search follow one another by page token or by
// cursor without repeats; own matches the caller's key only; a token of another list is
// refused.
func TestSearchPagingAndOwner(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	keyA := auth.WithCaller(h.ctx, auth.Caller{KeyID: "key-aaaaaaaaaaaaaaaa"})
	keyB := auth.WithCaller(h.ctx, auth.Caller{KeyID: "key-bbbbbbbbbbbbbbbb"})
	var want []string
	for i := range 5 {
		ctx := keyA
		if i%2 == 1 {
			ctx = keyB
		}
		s, err := h.svc.Sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{Tags: []string{"t"}})
		require.NoError(t, err)
		want = append([]string{s.GetId()}, want...) // newest first
	}
	var got []string
	req := &loopsv1.SearchSessionsRequest{Tags: []string{"t"}, Limit: 2}
	for range 5 {
		res, err := h.svc.Sessions.SearchSessions(h.ctx, req)
		require.NoError(t, err)
		for _, r := range res.GetResults() {
			got = append(got, r.GetSession().GetId())
		}
		if res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	require.Equal(t, want, got)

	// The same by cursor, as Tinker's clients page.
	first, err := h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{Limit: 3})
	require.NoError(t, err)
	last := first.GetResults()[2].GetSession()
	rest, err := h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{
		After: &loopsv1.SessionSearchCursor{CreateTime: last.GetCreateTime(), SessionId: last.GetId()}})
	require.NoError(t, err)
	require.Len(t, rest.GetResults(), 2)
	require.Equal(t, want[3:], []string{rest.GetResults()[0].GetSession().GetId(), rest.GetResults()[1].GetSession().GetId()})

	mine, err := h.svc.Sessions.SearchSessions(keyB, &loopsv1.SearchSessionsRequest{Own: true})
	require.NoError(t, err)
	require.Len(t, mine.GetResults(), 2)
	for _, r := range mine.GetResults() {
		require.Equal(t, "key-bbbbbbbbbbbbbbbb", r.GetSession().GetOwner())
	}
	none, err := h.svc.Sessions.SearchSessions(keyB, &loopsv1.SearchSessionsRequest{Own: true, Owners: []string{"key-aaaaaaaaaaaaaaaa"}})
	require.NoError(t, err)
	require.Empty(t, none.GetResults())

	list, err := h.svc.Sessions.ListSessions(h.ctx, &loopsv1.ListSessionsRequest{Limit: 1})
	require.NoError(t, err)
	_, err = h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{PageToken: list.GetNextPageToken()})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "a token of another list")
	for _, bad := range []*loopsv1.SearchSessionsRequest{
		{Limit: -1}, {Limit: 201}, {Statuses: []string{"sleeping"}}, {Tags: []string{""}},
		{UserMetadata: map[string]string{"k": string(make([]byte, store.MaxLabelValueBytes+1))}},
		{After: &loopsv1.SessionSearchCursor{SessionId: "s"}}, {DisplayName: "   "},
		{PageToken: "x", After: &loopsv1.SessionSearchCursor{SessionId: "s"}},
	} {
		_, err := h.svc.Sessions.SearchSessions(h.ctx, bad)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", bad)
	}
}

// FuzzSearchSessions: any strings in a search (display name words with LIKE's wildcards,
// labels, statuses, owners, cursors, page tokens) give results or a client error, never an
// internal one: the store's query is built from parameters only.
func FuzzSearchSessions(f *testing.F) {
	dir := f.TempDir()
	st, err := sqlite.Open(f.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(f, err)
	c, err := New(f.Context(), st, newFakeBackend(), Options{DataDir: dir})
	require.NoError(f, err)
	f.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	h := &harness{core: c, svc: c.Services(), ctx: auth.WithWorkspace(f.Context(), "ws-a")}
	_, err = h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{DisplayName: `50%_off \ sale`, Tags: []string{"t"}, UserMetadata: map[string]string{"k": "v"}})
	require.NoError(f, err)
	f.Add(`50%_`, "k", "v", "t", "active", "key-a", "sess-x", int32(2), "")
	f.Add(`\`, "", "", "", "finished:success", "", "", int32(0), "AQ")
	f.Add("a b c d e f g h i", "k'", "v\"", "t;--", "timed_out", "key-'", "'", int32(200), "not base64!")
	f.Fuzz(func(t *testing.T, name, key, value, tag, status, owner, after string, limit int32, token string) {
		req := &loopsv1.SearchSessionsRequest{DisplayName: name, Limit: limit, PageToken: token}
		if key != "" {
			req.UserMetadata = map[string]string{key: value}
		}
		if tag != "" {
			req.Tags = []string{tag}
		}
		if status != "" {
			req.Statuses = []string{status}
		}
		if owner != "" {
			req.Owners = []string{owner}
		}
		if after != "" && token == "" {
			req.After = &loopsv1.SessionSearchCursor{SessionId: after, CreateTime: timestamppb.Now()}
		}
		_, err := h.svc.Sessions.SearchSessions(h.ctx, req)
		if code := connect.CodeOf(err); err != nil && code != connect.CodeInvalidArgument {
			t.Fatalf("%v: %v", req, err)
		}
	})
}

// TestSearchFullPageOfTheMaximum: a page of the largest size (200) with more after it
// carries a token, and the next page holds the rest.
func TestSearchFullPageOfTheMaximum(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	for range store.MaxSearchLimit + 1 {
		_, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
		require.NoError(t, err)
	}
	first, err := h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{Limit: store.MaxSearchLimit})
	require.NoError(t, err)
	require.Len(t, first.GetResults(), store.MaxSearchLimit)
	require.NotEmpty(t, first.GetNextPageToken())
	rest, err := h.svc.Sessions.SearchSessions(h.ctx, &loopsv1.SearchSessionsRequest{Limit: store.MaxSearchLimit, PageToken: first.GetNextPageToken()})
	require.NoError(t, err)
	require.Len(t, rest.GetResults(), 1)
	require.Empty(t, rest.GetNextPageToken())
}

// TestIndexOldSessions: sessions stored before sessions were indexed for search (their
// project, status, owner and display name columns empty, no labels) are written again at
// start-up, and a search then finds them by metadata, tag and project.
func TestIndexOldSessions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "loops.db")
	st, err := sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	old := []*loopsv1.Session{
		{Id: "sess-old1", CreateTime: timestamppb.Now(), UserMetadata: map[string]string{"team": "red"}, Tags: []string{"x"}},
		{Id: "sess-old2", CreateTime: timestamppb.Now(), ProjectId: "legacy", Expired: true, EndReason: "finished: success"},
	}
	for _, s := range old {
		require.NoError(t, st.PutSession(t.Context(), "ws-a", s))
	}
	require.NoError(t, st.Close())
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE sessions SET project = '', status = '', owner = '', display_name = ''`)
	require.NoError(t, err)
	_, err = db.Exec(`DELETE FROM session_labels`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	h := newHarness(t, dir, Options{})
	find := func(req *loopsv1.SearchSessionsRequest) []string {
		res, err := h.svc.Sessions.SearchSessions(h.ctx, req)
		require.NoError(t, err)
		var ids []string
		for _, r := range res.GetResults() {
			ids = append(ids, r.GetSession().GetId())
		}
		return ids
	}
	// Up to 30 s: a bound for a hang, not a timing.
	require.Eventually(t, func() bool {
		return len(find(&loopsv1.SearchSessionsRequest{UserMetadata: map[string]string{"team": "red"}})) == 1
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"sess-old1"}, find(&loopsv1.SearchSessionsRequest{Tags: []string{"x"}, ProjectIds: []string{"default"}}))
	require.Eventually(t, func() bool {
		return len(find(&loopsv1.SearchSessionsRequest{Statuses: []string{"finished:success"}})) == 1
	}, 30*time.Second, 10*time.Millisecond)
	left, err := h.core.store.ListUnindexedSessions(h.ctx, "", 10)
	require.NoError(t, err)
	require.Empty(t, left)
}
