package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PutDeployment inserts or replaces a deployment with its pins and grants, in one
// transaction (one round trip).
func (s *Store) PutDeployment(ctx context.Context, workspace string, d *loopsv1.Deployment, pins []store.CheckpointRef) error {
	qs, err := sqlstore.PutDeployment(workspace, d, pins)
	if err == nil {
		_, err = s.exec(ctx, qs...)
	}
	if err != nil {
		return fmt.Errorf("store: put deployment %s: %w", d.GetName(), err)
	}
	return nil
}

// GetDeployment returns a deployment of the workspace by name.
func (s *Store) GetDeployment(ctx context.Context, workspace, name string) (*loopsv1.Deployment, error) {
	return get(ctx, s, sqlstore.GetDeployment(workspace, name))
}

// ListDeployments lists the workspace's deployments by name.
func (s *Store) ListDeployments(ctx context.Context, workspace string) ([]*loopsv1.Deployment, error) {
	return messages(ctx, s, "list deployments", sqlstore.NewDeployment, sqlstore.ListDeployments, workspace)
}

// ListAllDeployments lists every workspace's deployments by (workspace, name), limit of them
// after (afterWorkspace, afterName).
func (s *Store) ListAllDeployments(ctx context.Context, afterWorkspace, afterName string, limit int) ([]*loopsv1.Deployment, error) {
	return messages(ctx, s, "list all deployments", sqlstore.NewDeployment, sqlstore.ListAllDeployments,
		afterWorkspace, afterName, max(limit, 1))
}

// ListGrantedDeployments lists the deployments shared with grantee, by owner and name.
func (s *Store) ListGrantedDeployments(ctx context.Context, grantee string) ([]*loopsv1.Deployment, error) {
	return messages(ctx, s, "list granted deployments", sqlstore.NewDeployment, sqlstore.ListGrantedDeployments, grantee)
}

// DeleteDeployment removes a deployment of the workspace; its pins and grants go with it.
func (s *Store) DeleteDeployment(ctx context.Context, workspace, name string) error {
	return s.deleteOne(ctx, "deployment "+name, sqlstore.DeleteDeployment, workspace, name)
}

// CheckpointDeployments returns the names of the workspace's deployments that pin a
// checkpoint.
func (s *Store) CheckpointDeployments(ctx context.Context, workspace, runID, checkpointID string) ([]string, error) {
	var out []string
	err := s.query(ctx, "checkpoint deployments", sqlstore.CheckpointDeployments, []any{workspace, runID, checkpointID}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanStrings(rows)
		return err
	})
	return out, err
}
