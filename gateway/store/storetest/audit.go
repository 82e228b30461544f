package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
)

func auditEvent(ws string, at time.Duration, key, event, target string) store.OwnedAuditEvent {
	res, _, _ := cutLast(event)
	return store.OwnedAuditEvent{Workspace: ws, Event: store.AuditEvent{
		Time: base.Add(at), KeyID: key, ClientAddr: "192.0.2.7", Surface: "tinker",
		Action: "POST /api/v1/" + event, Event: event, Resource: res, Target: target, Status: 200, Code: "ok",
	}}
}

// cutLast splits "training_run_create" at its last '_'.
func cutLast(s string) (string, string, bool) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '_' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// testAudit: events are appended in order with increasing seq, listed newest first (or
// oldest first) per workspace, filtered by time, key, action and resource, paged by seq;
// another workspace sees none of them.
func testAudit(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	got, err := st.ListAuditEvents(ctx, wsA, store.AuditQuery{})
	require.NoError(t, err)
	require.Empty(t, got)

	in := []store.OwnedAuditEvent{
		auditEvent(wsA, 0, "key-a1", "session_create", "sess-1"),
		auditEvent(wsB, time.Second, "key-b1", "checkpoint_delete", "tinker://run-b/weights/x"),
		auditEvent(wsA, 2*time.Second, "key-a2", "checkpoint_delete", "tinker://run-1/weights/c1"),
		auditEvent(wsA, time.Hour, "key-a1", "training_run_create", "run-1"),
	}
	require.NoError(t, st.AppendAuditEvents(ctx, in))
	require.NoError(t, st.AppendAuditEvents(ctx, nil))

	all, err := st.ListAuditEvents(ctx, wsA, store.AuditQuery{})
	require.NoError(t, err)
	require.Len(t, all, 3)
	for i, want := range []store.OwnedAuditEvent{in[3], in[2], in[0]} {
		w := want.Event
		w.Seq = all[i].Seq
		require.Equal(t, w, all[i], "event %d, newest first", i)
	}
	require.Greater(t, all[0].Seq, all[1].Seq)
	require.Greater(t, all[1].Seq, all[2].Seq)

	asc, err := st.ListAuditEvents(ctx, wsA, store.AuditQuery{Ascending: true})
	require.NoError(t, err)
	require.Equal(t, []int64{all[2].Seq, all[1].Seq, all[0].Seq}, seqs(asc))

	b, err := st.ListAuditEvents(ctx, wsB, store.AuditQuery{})
	require.NoError(t, err)
	require.Len(t, b, 1)
	require.Equal(t, "key-b1", b[0].KeyID)
	none, err := st.ListAuditEvents(ctx, "ws-other", store.AuditQuery{})
	require.NoError(t, err)
	require.Empty(t, none)

	for name, tc := range map[string]struct {
		q    store.AuditQuery
		want []int64
	}{
		"time":     {store.AuditQuery{From: base.Add(time.Second), To: base.Add(time.Hour)}, []int64{all[1].Seq}},
		"to":       {store.AuditQuery{To: base.Add(time.Hour)}, []int64{all[1].Seq, all[2].Seq}},
		"key":      {store.AuditQuery{KeyID: "key-a1"}, []int64{all[0].Seq, all[2].Seq}},
		"event":    {store.AuditQuery{Action: "checkpoint_delete"}, []int64{all[1].Seq}},
		"action":   {store.AuditQuery{Action: "POST /api/v1/session_create"}, []int64{all[2].Seq}},
		"resource": {store.AuditQuery{Resource: "training_run"}, []int64{all[0].Seq}},
		"before":   {store.AuditQuery{Before: all[0].Seq, Limit: 1}, []int64{all[1].Seq}},
		"after":    {store.AuditQuery{After: all[2].Seq, Ascending: true}, []int64{all[1].Seq, all[0].Seq}},
		"limit":    {store.AuditQuery{Limit: 2}, []int64{all[0].Seq, all[1].Seq}},
	} {
		got, err := st.ListAuditEvents(ctx, wsA, tc.q)
		require.NoError(t, err, name)
		require.Equal(t, tc.want, seqs(got), name)
	}
}

// testAuditRetention: the retention sweep removes the events older than its time in every
// workspace; the cap keeps each workspace's newest events.
func testAuditRetention(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	var in []store.OwnedAuditEvent
	for i := range 10 {
		in = append(in, auditEvent(wsA, time.Duration(i)*time.Minute, "key-a", "session_create", fmt.Sprint("s", i)))
	}
	in = append(in, auditEvent(wsB, 0, "key-b", "session_create", "b0"), auditEvent(wsB, time.Hour, "key-b", "session_create", "b1"))
	require.NoError(t, st.AppendAuditEvents(ctx, in))

	n, err := st.DeleteAuditEventsBefore(ctx, base.Add(3*time.Minute))
	require.NoError(t, err)
	require.Equal(t, 4, n, "3 of workspace A and 1 of B are older")
	a, err := st.ListAuditEvents(ctx, wsA, store.AuditQuery{Ascending: true})
	require.NoError(t, err)
	require.Len(t, a, 7)
	require.Equal(t, "s3", a[0].Target)

	n, err = st.TrimAuditEvents(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, 2, n, "workspace A is over the cap by 2; B is under it")
	a, err = st.ListAuditEvents(ctx, wsA, store.AuditQuery{Ascending: true})
	require.NoError(t, err)
	require.Len(t, a, 5)
	require.Equal(t, "s5", a[0].Target, "the oldest go first")
	b, err := st.ListAuditEvents(ctx, wsB, store.AuditQuery{})
	require.NoError(t, err)
	require.Len(t, b, 1)
	n, err = st.TrimAuditEvents(ctx, 5)
	require.NoError(t, err)
	require.Zero(t, n)
}

// testCheckpointStorage: a workspace's checkpoint storage is the count and byte sum of its
// own checkpoints, following puts, replacements and deletes.
func testCheckpointStorage(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	cs, err := st.CheckpointStorage(ctx, wsA)
	require.NoError(t, err)
	require.Equal(t, store.CheckpointStorage{}, cs)

	c1 := checkpoint("run-1", "c1", 0)
	c1.SizeBytes = 1000
	c2 := checkpoint("run-1", "c2", time.Second)
	c2.SizeBytes = 5 << 30
	c3 := checkpoint("run-b", "c3", 0)
	c3.SizeBytes = 77
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c1))
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c2))
	require.NoError(t, st.PutCheckpoint(ctx, wsB, c3))
	cs, err = st.CheckpointStorage(ctx, wsA)
	require.NoError(t, err)
	require.Equal(t, store.CheckpointStorage{Checkpoints: 2, Bytes: 1000 + 5<<30}, cs)

	c1.SizeBytes = 2000
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c1))
	require.NoError(t, st.DeleteCheckpoint(ctx, wsA, "run-1", "c2"))
	cs, err = st.CheckpointStorage(ctx, wsA)
	require.NoError(t, err)
	require.Equal(t, store.CheckpointStorage{Checkpoints: 1, Bytes: 2000}, cs)
	cs, err = st.CheckpointStorage(ctx, wsB)
	require.NoError(t, err)
	require.Equal(t, store.CheckpointStorage{Checkpoints: 1, Bytes: 77}, cs)

	// By run with its session, every workspace: run-1 is sess-1's (its run record), run-b
	// has none.
	require.NoError(t, st.PutTrainingRun(ctx, wsA, trainingRun("run-1", 0)))
	c4 := checkpoint("run-1", "c4", 2*time.Second)
	c4.SizeBytes = 30
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c4))
	// run-2 is of the same session: its checkpoints are summed apart, by run.
	require.NoError(t, st.PutTrainingRun(ctx, wsA, trainingRun("run-2", 0)))
	c5 := checkpoint("run-2", "c5", 3*time.Second)
	c5.SizeBytes = 500
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c5))
	byRun, err := st.CheckpointBytes(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, []store.SessionCheckpointBytes{
		{Workspace: wsA, SessionID: "sess-1", RunID: "run-1", Bytes: 2030},
		{Workspace: wsA, SessionID: "sess-1", RunID: "run-2", Bytes: 500},
		{Workspace: wsB, RunID: "run-b", Bytes: 77},
	}, byRun)
	byRun, err = st.CheckpointBytes(ctx, 1)
	require.NoError(t, err)
	require.Len(t, byRun, 1, "at most limit rows")
}

func seqs(es []store.AuditEvent) []int64 {
	out := []int64{}
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}
