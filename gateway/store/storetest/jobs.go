package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func job(id string, created time.Duration, state loopsv1.JobState) *loopsv1.Job {
	return &loopsv1.Job{Id: id, State: state, Entrypoint: "train.py", Args: []string{"--steps", "2"}, CreateTime: ts(created)}
}

// testJobs: put, get, replace, delete, list newest first with a limit, scoped to the
// workspace; an id of another workspace is refused.
func testJobs(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	_, err := st.GetJob(ctx, wsA, "job-1")
	requireNotFound(t, err)
	list, err := st.ListJobs(ctx, wsA, 0)
	require.NoError(t, err)
	require.Empty(t, list)
	require.Error(t, st.PutJob(ctx, wsA, &loopsv1.Job{}), "a job needs an id")

	j1 := job("job-1", 0, loopsv1.JobState_JOB_STATE_RUNNING)
	j2 := job("job-2", time.Second, loopsv1.JobState_JOB_STATE_RUNNING)
	j3 := job("job-3", 2*time.Second, loopsv1.JobState_JOB_STATE_SUCCEEDED)
	for _, j := range []*loopsv1.Job{j1, j2, j3} {
		require.NoError(t, st.PutJob(ctx, wsA, j))
	}
	got, err := st.GetJob(ctx, wsA, "job-2")
	require.NoError(t, err)
	requireProtoEqual(t, j2, got)
	_, err = st.GetJob(ctx, wsB, "job-2")
	requireNotFound(t, err)
	list, err = st.ListJobs(ctx, wsA, 0)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Job{j3, j2, j1}, list)
	list, err = st.ListJobs(ctx, wsA, 2)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Job{j3, j2}, list)
	list, err = st.ListJobs(ctx, wsB, 0)
	require.NoError(t, err)
	require.Empty(t, list)

	require.Error(t, st.PutJob(ctx, wsB, job("job-1", 0, loopsv1.JobState_JOB_STATE_FAILED)), "job-1 is workspace A's")
	got, err = st.GetJob(ctx, wsA, "job-1")
	require.NoError(t, err)
	requireProtoEqual(t, j1, got)

	requireNotFound(t, st.DeleteJob(ctx, wsB, "job-3"))
	require.NoError(t, st.DeleteJob(ctx, wsA, "job-3"))
	_, err = st.GetJob(ctx, wsA, "job-3")
	requireNotFound(t, err)
	requireNotFound(t, st.DeleteJob(ctx, wsA, "job-3"))
	list, err = st.ListJobs(ctx, wsA, 0)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Job{j2, j1}, list)

	j1.State = loopsv1.JobState_JOB_STATE_CANCELLED
	j1.Reason = "cancelled"
	j1.EndTime = ts(5 * time.Second)
	require.NoError(t, st.PutJob(ctx, wsA, j1))
	got, err = st.GetJob(ctx, wsA, "job-1")
	require.NoError(t, err)
	requireProtoEqual(t, j1, got)
}

// testFailRunningJobs: only running jobs, of every workspace, are marked failed with the
// reason; survives a reopen.
func testFailRunningJobs(t *testing.T, open Opener) {
	ctx := t.Context()
	path := newPath(t)
	st := open(t, path)
	ja := job("job-a", 0, loopsv1.JobState_JOB_STATE_RUNNING)
	jb := job("job-b", time.Second, loopsv1.JobState_JOB_STATE_RUNNING)
	done := job("job-done", 2*time.Second, loopsv1.JobState_JOB_STATE_SUCCEEDED)
	require.NoError(t, st.PutJob(ctx, wsA, ja))
	require.NoError(t, st.PutJob(ctx, wsB, jb))
	require.NoError(t, st.PutJob(ctx, wsA, done))
	require.NoError(t, st.Close())

	st = openAt(t, open, path)
	end := base.Add(time.Hour)
	n, err := st.FailRunningJobs(ctx, "the gateway restarted", end)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, c := range []struct {
		ws string
		j  *loopsv1.Job
	}{{wsA, ja}, {wsB, jb}} {
		got, err := st.GetJob(ctx, c.ws, c.j.GetId())
		require.NoError(t, err)
		require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, got.GetState())
		require.Equal(t, "the gateway restarted", got.GetReason())
		require.Equal(t, int32(-1), got.GetExitCode())
		require.True(t, got.GetEndTime().AsTime().Equal(end))
		require.Equal(t, c.j.GetEntrypoint(), got.GetEntrypoint(), "the rest of the record is kept")
	}
	got, err := st.GetJob(ctx, wsA, "job-done")
	require.NoError(t, err)
	requireProtoEqual(t, done, got)
	n, err = st.FailRunningJobs(ctx, "again", end)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left running")
}
