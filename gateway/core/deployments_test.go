package core

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
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
