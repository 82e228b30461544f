package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// testProjects: create (a taken name is ErrExists), get, list by name, scoped to the
// workspace; delete refuses a project sessions belong to, and removes an empty one.
func testProjects(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	list, err := st.ListProjects(ctx, wsA)
	require.NoError(t, err)
	require.Empty(t, list)
	require.Error(t, st.CreateProject(ctx, wsA, &loopsv1.Project{}), "a project needs a name")

	pb := &loopsv1.Project{Name: "beta", Description: "b", CreateTime: ts(time.Second)}
	pa := &loopsv1.Project{Name: "alpha", CreateTime: ts(2 * time.Second)}
	require.NoError(t, st.CreateProject(ctx, wsA, pb))
	require.NoError(t, st.CreateProject(ctx, wsA, pa))
	require.ErrorIs(t, st.CreateProject(ctx, wsA, &loopsv1.Project{Name: "beta", Description: "other"}), store.ErrExists)
	require.NoError(t, st.CreateProject(ctx, wsB, &loopsv1.Project{Name: "beta"}), "names are per workspace")

	got, err := st.GetProject(ctx, wsA, "beta")
	require.NoError(t, err)
	requireProtoEqual(t, pb, got)
	_, err = st.GetProject(ctx, wsA, "gamma")
	requireNotFound(t, err)
	_, err = st.GetProject(ctx, wsB, "alpha")
	requireNotFound(t, err)
	list, err = st.ListProjects(ctx, wsA)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Project{pa, pb}, list)

	s := session("s1", 0)
	s.ProjectId = "beta"
	require.NoError(t, st.PutSession(ctx, wsA, s))
	require.ErrorIs(t, st.DeleteProject(ctx, wsA, "beta"), store.ErrProjectInUse)
	require.NoError(t, st.DeleteProject(ctx, wsB, "beta"), "another workspace's sessions do not hold it")
	requireNotFound(t, st.DeleteProject(ctx, wsA, "gamma"))
	requireNotFound(t, st.DeleteProject(ctx, wsB, "alpha"))

	s.ProjectId = "alpha" // moved out: beta is empty now
	require.NoError(t, st.PutSession(ctx, wsA, s))
	require.NoError(t, st.DeleteProject(ctx, wsA, "beta"))
	requireNotFound(t, st.DeleteProject(ctx, wsA, "beta"))
	list, err = st.ListProjects(ctx, wsA)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Project{pa}, list)
}

// searchIDs returns the ids of a search's sessions, in order.
func searchIDs(t *testing.T, st store.Store, ws string, q store.SessionQuery) []string {
	t.Helper()
	hits, err := st.SearchSessions(t.Context(), ws, q)
	require.NoError(t, err)
	ids := []string{}
	for _, h := range hits {
		ids = append(ids, h.Session.GetId())
	}
	return ids
}

// testSearchSessions: every condition of a SessionQuery, alone and together, newest first,
// keyset paging, checkpoint counts, and another workspace's sessions never found.
func testSearchSessions(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	mk := func(id string, created time.Duration, project, owner, name string, tags []string, md map[string]string) *loopsv1.Session {
		return &loopsv1.Session{Id: id, CreateTime: ts(created), ProjectId: project, Owner: owner, DisplayName: name,
			Tags: tags, UserMetadata: md}
	}
	s1 := mk("s1", 1*time.Second, "", "key-a", "Nightly SFT run", []string{"sft", "nightly"}, map[string]string{"team": "red", "lr": "1e-4"})
	s2 := mk("s2", 2*time.Second, "default", "key-b", "nightly RL", []string{"rl"}, map[string]string{"team": "red"})
	s3 := mk("s3", 3*time.Second, "vision", "key-a", "100%_done", []string{"sft"}, map[string]string{"team": "blue", "long": strings.Repeat("v", store.MaxLabelValueBytes+1)})
	s4 := mk("s4", 4*time.Second, "vision", "key-a", "", nil, nil)
	s4.Expired, s4.EndReason = true, "finished: success"
	s5 := mk("s5", 5*time.Second, "vision", "key-b", "", nil, nil)
	s5.Expired, s5.EndReason = true, "heartbeat timeout"
	for _, s := range []*loopsv1.Session{s1, s2, s3, s4, s5} {
		require.NoError(t, st.PutSession(ctx, wsA, s))
	}
	other := mk("x1", 6*time.Second, "vision", "key-a", "nightly", []string{"sft"}, map[string]string{"team": "red"})
	require.NoError(t, st.PutSession(ctx, wsB, other))

	q := func(q store.SessionQuery) []string { return searchIDs(t, st, wsA, q) }
	require.Equal(t, []string{"s5", "s4", "s3", "s2", "s1"}, q(store.SessionQuery{}))
	require.Equal(t, []string{"x1"}, searchIDs(t, st, wsB, store.SessionQuery{}))
	require.Equal(t, []string{"s2"}, q(store.SessionQuery{SessionID: "s2"}))
	require.Empty(t, q(store.SessionQuery{SessionID: "x1"}), "another workspace's session")
	require.Equal(t, []string{"s2", "s1"}, q(store.SessionQuery{DisplayWords: []string{"NIGHTLY"}}))
	require.Equal(t, []string{"s1"}, q(store.SessionQuery{DisplayWords: []string{"nightly", "sft"}}))
	require.Equal(t, []string{"s3", "s1"}, q(store.SessionQuery{SessionID: "s3", DisplayWords: []string{"sft"}}), "id or name")
	require.Equal(t, []string{"s3"}, q(store.SessionQuery{DisplayWords: []string{"0%_"}}), "wildcards are literal")
	require.Empty(t, q(store.SessionQuery{DisplayWords: []string{"0%x"}}))
	require.Equal(t, []string{"s2", "s1"}, q(store.SessionQuery{Projects: []string{store.DefaultProject}}), "default holds sessions without a project")
	require.Equal(t, []string{"s5", "s4", "s3"}, q(store.SessionQuery{Projects: []string{"vision"}}))
	require.Empty(t, q(store.SessionQuery{Projects: []string{"nope"}}))
	require.Equal(t, []string{"s2", "s1"}, q(store.SessionQuery{Metadata: map[string]string{"team": "red"}}))
	require.Equal(t, []string{"s1"}, q(store.SessionQuery{Metadata: map[string]string{"team": "red", "lr": "1e-4"}}))
	require.Empty(t, q(store.SessionQuery{Metadata: map[string]string{"team": "red", "lr": "1e-3"}}))
	require.Empty(t, q(store.SessionQuery{Metadata: map[string]string{"long": strings.Repeat("v", store.MaxLabelValueBytes+1)}}), "labels over the bounds are not indexed")
	require.Equal(t, []string{"s3", "s1"}, q(store.SessionQuery{Tags: []string{"sft"}}))
	require.Equal(t, []string{"s1"}, q(store.SessionQuery{Tags: []string{"sft", "nightly"}, Metadata: map[string]string{"team": "red"}}))
	require.Empty(t, q(store.SessionQuery{Tags: []string{"red"}}), "a metadata value is not a tag")
	require.Equal(t, []string{"s3", "s2"}, q(store.SessionQuery{CreatedAfter: base.Add(2 * time.Second), CreatedBefore: base.Add(4 * time.Second)}))
	require.Equal(t, []string{"s3", "s2", "s1"}, q(store.SessionQuery{Statuses: &store.StatusMatch{Active: true}}))
	require.Equal(t, []string{"s4"}, q(store.SessionQuery{Statuses: &store.StatusMatch{EndReasonPrefixes: []string{"finished:"}}}))
	require.Equal(t, []string{"s5", "s4"}, q(store.SessionQuery{Statuses: &store.StatusMatch{EndReasons: []string{"finished: success", "heartbeat timeout"}}}))
	require.Empty(t, q(store.SessionQuery{Statuses: &store.StatusMatch{}}), "an empty status match matches nothing")
	require.Equal(t, []string{"s5", "s2"}, q(store.SessionQuery{Owners: []string{"key-b"}}))

	// Keyset paging, newest first.
	page1 := q(store.SessionQuery{Limit: 2})
	require.Equal(t, []string{"s5", "s4"}, page1)
	require.Equal(t, []string{"s3", "s2"}, q(store.SessionQuery{Limit: 2, After: &store.Cursor{CreateTime: base.Add(4 * time.Second), ID: "s4"}}))
	require.Equal(t, []string{"s1"}, q(store.SessionQuery{Limit: 2, After: &store.Cursor{CreateTime: base.Add(2 * time.Second), ID: "s2"}}))

	// Checkpoint counts: of the session's runs, of its workspace.
	r1 := trainingRun("r1", 0)
	r1.SessionId = "s1"
	r2 := trainingRun("r2", time.Second)
	r2.SessionId = "s1"
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r1))
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r2))
	for i, run := range []string{"r1", "r1", "r2"} {
		require.NoError(t, st.PutCheckpoint(ctx, wsA, &loopsv1.Checkpoint{Id: "weights/c" + string(rune('0'+i)), TrainingRunId: run, CreateTime: ts(0)}))
	}
	hits, err := st.SearchSessions(ctx, wsA, store.SessionQuery{SessionID: "s1"})
	require.NoError(t, err)
	require.Len(t, hits, 1)
	require.EqualValues(t, 3, hits[0].CheckpointCount)
	requireProtoEqual(t, s1, hits[0].Session)

	// A later put moves the session and ends it; its labels stay.
	s1.ProjectId, s1.Expired, s1.EndReason = "vision", true, "finished: errored"
	require.NoError(t, st.PutSession(ctx, wsA, s1))
	require.Equal(t, []string{"s5", "s4", "s3", "s1"}, q(store.SessionQuery{Projects: []string{"vision"}}))
	require.Equal(t, []string{"s1"}, q(store.SessionQuery{Projects: []string{"vision"}, Tags: []string{"nightly"},
		Statuses: &store.StatusMatch{EndReasons: []string{"finished: errored"}}}))

	// NUL characters (which PostgreSQL's text refuses) are kept in the record, not indexed.
	nul := mk("s-nul", 0, "", "key-\x00", "a\x00b", []string{"t\x00"}, map[string]string{"k\x00": "v", "k": "v\x00"})
	require.NoError(t, st.PutSession(ctx, wsA, nul))
	got, err := st.GetSession(ctx, wsA, "s-nul")
	require.NoError(t, err)
	requireProtoEqual(t, nul, got)
	require.Equal(t, []string{"s-nul"}, q(store.SessionQuery{SessionID: "s-nul", DisplayWords: []string{"ab"}}))

	// Every session written since schema version 6 is indexed.
	left, err := st.ListUnindexedSessions(ctx, "", 100)
	require.NoError(t, err)
	require.Empty(t, left)

	// A put of another workspace's id changes nothing, labels included.
	stolen := mk("s1", 0, "evil", "key-x", "stolen", []string{"evil"}, map[string]string{"team": "evil"})
	require.Error(t, st.PutSession(ctx, wsB, stolen))
	require.Empty(t, searchIDs(t, st, wsB, store.SessionQuery{Tags: []string{"evil"}}))
	require.Empty(t, q(store.SessionQuery{Tags: []string{"evil"}}))
}

// testProjectTrainingRuns: runs are listed by their session's project; moving a session
// moves its runs.
func testProjectTrainingRuns(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	sa := &loopsv1.Session{Id: "sa", CreateTime: ts(0)} // no project: default
	sb := &loopsv1.Session{Id: "sb", CreateTime: ts(0), ProjectId: "p"}
	require.NoError(t, st.PutSession(ctx, wsA, sa))
	require.NoError(t, st.PutSession(ctx, wsA, sb))
	for i, sid := range []string{"sa", "sb", "sb"} {
		r := trainingRun("r"+string(rune('0'+i)), time.Duration(i)*time.Second)
		r.SessionId = sid
		require.NoError(t, st.PutTrainingRun(ctx, wsA, r))
	}
	other := trainingRun("rx", 9*time.Second)
	other.SessionId = "sb"
	require.NoError(t, st.PutSession(ctx, wsB, &loopsv1.Session{Id: "sx", CreateTime: ts(0), ProjectId: "p"}))
	other.SessionId = "sx"
	require.NoError(t, st.PutTrainingRun(ctx, wsB, other))

	ids := func(project string, page store.Page) ([]string, int64) {
		runs, total, err := st.ListProjectTrainingRuns(ctx, wsA, project, page)
		require.NoError(t, err)
		out := []string{}
		for _, r := range runs {
			out = append(out, r.GetId())
		}
		return out, total
	}
	got, total := ids("p", store.Page{})
	require.Equal(t, []string{"r2", "r1"}, got)
	require.EqualValues(t, 2, total)
	got, total = ids(store.DefaultProject, store.Page{})
	require.Equal(t, []string{"r0"}, got)
	require.EqualValues(t, 1, total)
	got, total = ids("p", store.Page{Limit: 1, After: &store.Cursor{CreateTime: base.Add(2 * time.Second), ID: "r2"}})
	require.Equal(t, []string{"r1"}, got)
	require.EqualValues(t, 2, total)
	got, _ = ids("none", store.Page{})
	require.Empty(t, got)

	sb.ProjectId = store.DefaultProject
	require.NoError(t, st.PutSession(ctx, wsA, sb))
	got, total = ids(store.DefaultProject, store.Page{})
	require.Equal(t, []string{"r2", "r1", "r0"}, got)
	require.EqualValues(t, 3, total)
	got, _ = ids("p", store.Page{})
	require.Empty(t, got)
}
