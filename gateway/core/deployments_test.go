package core

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestDeploymentPinsSurviveTTL: the TTL janitor skips a deployed checkpoint and deletes it
// once the deployment is gone.
func TestDeploymentPinsSurviveTTL(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	path, err := h.save(run, "c1", false)
	require.NoError(t, err)
	_, err = h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{path}})
	require.NoError(t, err)
	_, err = h.svc.Checkpoints.SetCheckpointTTL(h.ctx, &loopsv1.SetCheckpointTTLRequest{Path: path, TtlSeconds: ptr(int64(1))})
	require.NoError(t, err)
	h.core.expireCheckpoints(h.ctx, time.Now().Add(time.Hour))
	_, err = h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: path})
	require.NoError(t, err, "a deployed checkpoint does not expire")
	_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: path})
	require.Equal(t, connect.CodeAlreadyExists, connect.CodeOf(err))
	require.Contains(t, err.Error(), "deployment d")

	_, err = h.svc.Deployments.DeleteDeployment(h.ctx, &loopsv1.DeleteDeploymentRequest{Name: "d"})
	require.NoError(t, err)
	h.core.expireCheckpoints(h.ctx, time.Now().Add(time.Hour))
	_, err = h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: path})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "undeployed, it expires")
}

// TestDeploymentBounds: the count bound is a 429 with a reason; grants are bounded, for
// other workspaces only, and checked on every sample.
func TestDeploymentBounds(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	path, err := h.save(run, "c1", false)
	require.NoError(t, err)
	for i := range MaxDeploymentsPerWorkspace {
		_, err := h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: fmt.Sprintf("d%03d", i), Checkpoints: []string{path}})
		require.NoError(t, err)
	}
	_, err = h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "one-more", Checkpoints: []string{path}})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Contains(t, err.Error(), "100 deployments")

	for i := range MaxGrantsPerDeployment {
		_, err := h.svc.Deployments.GrantDeployment(h.ctx, &loopsv1.GrantDeploymentRequest{Name: "d000", Workspace: fmt.Sprintf("ws-%d", i)})
		require.NoError(t, err)
	}
	_, err = h.svc.Deployments.GrantDeployment(h.ctx, &loopsv1.GrantDeploymentRequest{Name: "d000", Workspace: "ws-one-more"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	_, err = h.svc.Deployments.GrantDeployment(h.ctx, &loopsv1.GrantDeploymentRequest{Name: "d001", Workspace: "ws-a"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "not to itself")
	_, err = h.svc.Deployments.GrantDeployment(h.ctx, &loopsv1.GrantDeploymentRequest{Name: "d001", Workspace: "bad name!"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	// A grantee's sampler works until the grant is revoked.
	other := auth.WithWorkspace(t.Context(), "ws-3")
	smp, err := h.svc.Sampling.CreateSampler(other, &loopsv1.CreateSamplerRequest{Deployment: "ws-a:d000"})
	require.NoError(t, err)
	require.Equal(t, "ws-a:d000/c1", smp.GetDeployment())
	sample := func() error {
		_, err := h.svc.Sampling.Sample(other, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1, 2}, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 2}})
		return err
	}
	require.NoError(t, sample())
	_, err = h.svc.Deployments.RevokeDeployment(h.ctx, &loopsv1.RevokeDeploymentRequest{Name: "d000", Workspace: "ws-3"})
	require.NoError(t, err)
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(sample()))
	_, err = h.svc.Sampling.CreateSampler(other, &loopsv1.CreateSamplerRequest{Deployment: "ws-a:d000"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{Deployment: "d000", BaseModel: "fake/model"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "a deployment or a model, not both")
}

// scalingBackend is the fake backend with worker pools: it records the sampler replicas the
// core asks for.
type scalingBackend struct {
	*fakeBackend
	mu   sync.Mutex
	asks []string // "base=n"
}

func (b *scalingBackend) ScaleSamplers(_ context.Context, base string, n int) (int, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asks = append(b.asks, fmt.Sprintf("%s=%d", base, n))
	return max(n, 1), true, nil
}

func (b *scalingBackend) last() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.asks) == 0 {
		return ""
	}
	return b.asks[len(b.asks)-1]
}

// TestDeploymentReplicasArePlaced: with a backend that places sampler replicas, the pool of
// a deployment's base model is scaled to the most its deployments ask for, down again when
// they go, and again after a restart; a deployment shows the replicas placed for it (never
// more than it asked for, which would tell it of other deployments); a backend that places
// none says so.
func TestDeploymentReplicasArePlaced(t *testing.T) {
	dir := t.TempDir()
	be := &scalingBackend{fakeBackend: newFakeBackend()}
	h, stop := openHarness(t, dir, be, be.fakeBackend)
	run := h.newRun()
	path, err := h.save(run, "c1", false)
	require.NoError(t, err)
	create := func(h *harness, name string, replicas int32) {
		_, err := h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: name, Checkpoints: []string{path}, Replicas: replicas})
		require.NoError(t, err)
	}
	get := func(h *harness, name string) *loopsv1.Deployment {
		var d *loopsv1.Deployment
		require.Eventually(t, func() bool {
			var err error
			d, err = h.svc.Deployments.GetDeployment(h.ctx, &loopsv1.GetDeploymentRequest{Name: name})
			require.NoError(t, err)
			return d.GetPlacement() != "placing…"
		}, 10*time.Second, 5*time.Millisecond)
		return d
	}
	create(h, "big", 3)
	require.Eventually(t, func() bool { return be.last() == "fake/model=3" }, 10*time.Second, 5*time.Millisecond)
	require.EqualValues(t, 3, get(h, "big").GetPlacedReplicas())
	create(h, "small", 2)
	require.EqualValues(t, 2, get(h, "small").GetPlacedReplicas(), "a deployment sees its own share, not the pool's size")
	require.Contains(t, get(h, "small").GetPlacement(), "2 sampler replicas placed")
	require.Equal(t, "fake/model=3", be.last())

	stop() // a restart places what the stored deployments want
	be2 := &scalingBackend{fakeBackend: be.fakeBackend}
	h, _ = openHarness(t, dir, be2, be.fakeBackend)
	require.Eventually(t, func() bool { return be2.last() == "fake/model=3" }, 10*time.Second, 5*time.Millisecond)

	_, err = h.svc.Deployments.DeleteDeployment(h.ctx, &loopsv1.DeleteDeploymentRequest{Name: "big"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return be2.last() == "fake/model=2" }, 10*time.Second, 5*time.Millisecond)
	_, err = h.svc.Deployments.DeleteDeployment(h.ctx, &loopsv1.DeleteDeploymentRequest{Name: "small"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return be2.last() == "fake/model=1" }, 10*time.Second, 5*time.Millisecond, "no deployment left: the backend's own count")

	// A backend without worker pools places nothing and says so.
	plain := newHarness(t, t.TempDir(), Options{})
	run = plain.newRun()
	path, err = plain.save(run, "c1", false)
	require.NoError(t, err)
	create(plain, "d", 4)
	d := get(plain, "d")
	require.Zero(t, d.GetPlacedReplicas())
	require.Contains(t, d.GetPlacement(), "places no replicas")
}

// TestDeploymentReplicasPolicy: a workspace's max_deployment_replicas caps what one of its
// deployments may ask for, with a 400 naming the policy key.
func TestDeploymentReplicasPolicy(t *testing.T) {
	p, err := policy.Parse([]byte("default: {max_deployment_replicas: 2}\n"))
	require.NoError(t, err)
	h := newHarness(t, t.TempDir(), Options{Policy: p})
	run := h.newRun()
	path, err := h.save(run, "c1", false)
	require.NoError(t, err)
	_, err = h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{path}, Replicas: 3})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "max_deployment_replicas")
	_, err = h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{path}, Replicas: 2})
	require.NoError(t, err)
}
