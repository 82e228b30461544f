package store

import (
	"context"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// DeploymentStore keeps deployments (loops.v1 Deployment), the checkpoints they pin and the
// workspaces they are shared with. A deployment is keyed by (workspace, name); its record's
// grants are the workspaces it is shared with.
type DeploymentStore interface {
	// PutDeployment inserts or replaces a deployment of the workspace together with its pins
	// (the checkpoints it holds, of the same workspace) and its grants (d.Grants), all in one
	// transaction: the deployment's previous pins and grants are replaced. d.Name must not be
	// empty.
	PutDeployment(ctx context.Context, workspace string, d *loopsv1.Deployment, pins []CheckpointRef) error
	// GetDeployment returns a deployment of the workspace by name.
	GetDeployment(ctx context.Context, workspace, name string) (*loopsv1.Deployment, error)
	// ListDeployments lists the workspace's deployments by name.
	ListDeployments(ctx context.Context, workspace string) ([]*loopsv1.Deployment, error)
	// ListAllDeployments lists the deployments of every workspace ordered by (workspace,
	// name), the first limit (at least 1) after (afterWorkspace, afterName): a page of a
	// keyset walk for the operator's view of them all.
	ListAllDeployments(ctx context.Context, afterWorkspace, afterName string, limit int) ([]*loopsv1.Deployment, error)
	// ListGrantedDeployments lists the deployments of other workspaces shared with grantee,
	// by owner, then name.
	ListGrantedDeployments(ctx context.Context, grantee string) ([]*loopsv1.Deployment, error)
	// DeleteDeployment removes a deployment of the workspace with its pins and grants.
	DeleteDeployment(ctx context.Context, workspace, name string) error
	// CheckpointDeployments returns the names of the workspace's deployments that pin the
	// checkpoint (runID, checkpointID), sorted; none is an empty list, not ErrNotFound.
	CheckpointDeployments(ctx context.Context, workspace, runID, checkpointID string) ([]string, error)
}

// CheckpointRef names a checkpoint of a workspace: its training run and its id
// ("sampler_weights/<name>" or "weights/<name>").
type CheckpointRef struct {
	RunID, CheckpointID string
}
