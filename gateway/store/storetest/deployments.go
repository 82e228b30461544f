package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func deployment(name string, created time.Duration, grants ...string) *loopsv1.Deployment {
	return &loopsv1.Deployment{
		Name: name, Owner: wsA, BaseModel: "m", Replicas: 1, Grants: grants, CreateTime: ts(created),
		Checkpoints: []*loopsv1.DeploymentCheckpoint{{Name: "c1", TinkerPath: "tinker://run-1/sampler_weights/c1"}},
	}
}

func pin(run, id string) store.CheckpointRef {
	return store.CheckpointRef{RunID: run, CheckpointID: id}
}

// testDeployments: put, get, list, replace (pins and grants replaced with the record), delete
// (pins and grants go with it), scoped to the workspace.
func testDeployments(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	_, err := st.GetDeployment(ctx, wsA, "d1")
	requireNotFound(t, err)
	list, err := st.ListDeployments(ctx, wsA)
	require.NoError(t, err)
	require.Empty(t, list)
	require.Error(t, st.PutDeployment(ctx, wsA, &loopsv1.Deployment{}, nil), "a deployment needs a name")

	d2 := deployment("d2", 0, wsB)
	d1 := deployment("d1", time.Second)
	require.NoError(t, st.PutDeployment(ctx, wsA, d2, []store.CheckpointRef{pin("run-1", "sampler_weights/c1"), pin("run-2", "weights/w")}))
	require.NoError(t, st.PutDeployment(ctx, wsA, d1, []store.CheckpointRef{pin("run-1", "sampler_weights/c1")}))
	got, err := st.GetDeployment(ctx, wsA, "d2")
	require.NoError(t, err)
	requireProtoEqual(t, d2, got)
	_, err = st.GetDeployment(ctx, wsB, "d2")
	requireNotFound(t, err)
	list, err = st.ListDeployments(ctx, wsA)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Deployment{d1, d2}, list)
	list, err = st.ListDeployments(ctx, wsB)
	require.NoError(t, err)
	require.Empty(t, list)

	names, err := st.CheckpointDeployments(ctx, wsA, "run-1", "sampler_weights/c1")
	require.NoError(t, err)
	require.Equal(t, []string{"d1", "d2"}, names)
	names, err = st.CheckpointDeployments(ctx, wsA, "run-2", "weights/w")
	require.NoError(t, err)
	require.Equal(t, []string{"d2"}, names)
	names, err = st.CheckpointDeployments(ctx, wsB, "run-1", "sampler_weights/c1")
	require.NoError(t, err)
	require.Empty(t, names, "pins are the workspace's")

	// Replacing a deployment replaces its pins.
	d2b := deployment("d2", 0)
	require.NoError(t, st.PutDeployment(ctx, wsA, d2b, []store.CheckpointRef{pin("run-2", "weights/w")}))
	names, err = st.CheckpointDeployments(ctx, wsA, "run-1", "sampler_weights/c1")
	require.NoError(t, err)
	require.Equal(t, []string{"d1"}, names)

	// Another workspace may use the same name.
	other := deployment("d1", 0)
	other.Owner = wsB
	require.NoError(t, st.PutDeployment(ctx, wsB, other, []store.CheckpointRef{pin("run-9", "sampler_weights/x")}))
	got, err = st.GetDeployment(ctx, wsA, "d1")
	require.NoError(t, err)
	requireProtoEqual(t, d1, got)

	require.NoError(t, st.DeleteDeployment(ctx, wsA, "d2"))
	requireNotFound(t, st.DeleteDeployment(ctx, wsA, "d2"))
	requireNotFound(t, st.DeleteDeployment(ctx, wsA, "nope"))
	names, err = st.CheckpointDeployments(ctx, wsA, "run-2", "weights/w")
	require.NoError(t, err)
	require.Empty(t, names, "a deleted deployment pins nothing")
	_, err = st.GetDeployment(ctx, wsA, "d2")
	requireNotFound(t, err)
	got, err = st.GetDeployment(ctx, wsB, "d1")
	require.NoError(t, err)
	requireProtoEqual(t, other, got)

	// Every workspace's deployments, by (workspace, name), in keyset pages.
	d3 := deployment("d3", 0)
	require.NoError(t, st.PutDeployment(ctx, wsA, d3, nil))
	all, err := st.ListAllDeployments(ctx, "", "", 10)
	require.NoError(t, err)
	want := []*loopsv1.Deployment{d1, d3, other}
	if wsB < wsA {
		want = []*loopsv1.Deployment{other, d1, d3}
	}
	requireProtoEqual(t, want, all)
	var walked []*loopsv1.Deployment
	ws, name := "", ""
	for {
		page, err := st.ListAllDeployments(ctx, ws, name, 1)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		require.Len(t, page, 1)
		walked = append(walked, page...)
		ws, name = page[0].GetOwner(), page[0].GetName()
	}
	requireProtoEqual(t, want, walked)
}

// testDeploymentGrants: a grant lists the deployment to its grantee, and goes with a
// replace that drops it or with the deployment.
func testDeploymentGrants(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	const wsC = "ws-c"
	list, err := st.ListGrantedDeployments(ctx, wsB)
	require.NoError(t, err)
	require.Empty(t, list)

	a1 := deployment("a1", 0, wsB, wsC)
	a2 := deployment("a2", 0, wsC)
	c1 := deployment("c1", 0, wsB)
	c1.Owner = wsC
	require.NoError(t, st.PutDeployment(ctx, wsA, a2, nil))
	require.NoError(t, st.PutDeployment(ctx, wsA, a1, nil))
	require.NoError(t, st.PutDeployment(ctx, wsC, c1, nil))

	list, err = st.ListGrantedDeployments(ctx, wsB)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Deployment{a1, c1}, list)
	list, err = st.ListGrantedDeployments(ctx, wsC)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Deployment{a1, a2}, list)
	list, err = st.ListGrantedDeployments(ctx, wsA)
	require.NoError(t, err)
	require.Empty(t, list)

	a1.Grants = []string{wsC}
	require.NoError(t, st.PutDeployment(ctx, wsA, a1, nil))
	list, err = st.ListGrantedDeployments(ctx, wsB)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Deployment{c1}, list)

	require.NoError(t, st.DeleteDeployment(ctx, wsA, "a1"))
	list, err = st.ListGrantedDeployments(ctx, wsC)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Deployment{a2}, list)
}

// testDeploymentsReopen: deployments, pins and grants survive a restart.
func testDeploymentsReopen(t *testing.T, open Opener) {
	ctx := t.Context()
	path := newPath(t)
	st := open(t, path)
	d := deployment("d", 0, wsB)
	require.NoError(t, st.PutDeployment(ctx, wsA, d, []store.CheckpointRef{pin("run-1", "sampler_weights/c1")}))
	require.NoError(t, st.AddUsage(ctx, wsB, store.UsageRecord{BucketStart: base, BaseModel: "m", Deployment: "ws-a:d", Kind: store.UsageSamplingPrefill, Amount: 4}))
	require.NoError(t, st.Close())

	st = openAt(t, open, path)
	got, err := st.GetDeployment(ctx, wsA, "d")
	require.NoError(t, err)
	requireProtoEqual(t, d, got)
	names, err := st.CheckpointDeployments(ctx, wsA, "run-1", "sampler_weights/c1")
	require.NoError(t, err)
	require.Equal(t, []string{"d"}, names)
	list, err := st.ListGrantedDeployments(ctx, wsB)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Deployment{d}, list)
	u, err := st.ListUsage(ctx, wsB, base, base.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{{BucketStart: base, BaseModel: "m", Deployment: "ws-a:d", Kind: store.UsageSamplingPrefill, Amount: 4}}, u)
}

// testUsageDeployments: usage through a deployment is a counter of its own.
func testUsageDeployments(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	dep := func(d string, amount int64) store.UsageRecord {
		u := usage(0, "m", "", store.UsageSamplingSample, amount)
		u.Deployment = d
		return u
	}
	require.NoError(t, st.AddUsage(ctx, wsA, dep("", 1)))
	require.NoError(t, st.AddUsage(ctx, wsA, dep("d1", 2)))
	require.NoError(t, st.AddUsage(ctx, wsA, dep("d1", 3)))
	require.NoError(t, st.AddUsage(ctx, wsA, dep("ws-b:d1", 4)))
	got, err := st.ListUsage(ctx, wsA, base, base.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{dep("", 1), dep("d1", 5), dep("ws-b:d1", 4)}, got)
}
