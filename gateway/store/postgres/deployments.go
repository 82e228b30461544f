package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PutDeployment inserts or replaces a deployment with its pins and grants, in one
// transaction.
func (s *Store) PutDeployment(ctx context.Context, workspace string, d *loopsv1.Deployment, pins []store.CheckpointRef) error {
	if d == nil || d.GetName() == "" {
		return errors.New("store: put deployment: missing name")
	}
	name := d.GetName()
	data, err := proto.Marshal(d)
	if err != nil {
		return fmt.Errorf("store: put deployment %s: encode: %w", name, err)
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO deployments (workspace, name, create_time, data) VALUES ($1, $2, $3, $4)
			ON CONFLICT (workspace, name) DO UPDATE SET create_time = excluded.create_time, data = excluded.data`,
			workspace, name, nanos(d.GetCreateTime()), data)
		b.Queue(`DELETE FROM deployment_pins WHERE workspace = $1 AND deployment = $2`, workspace, name)
		b.Queue(`DELETE FROM deployment_grants WHERE workspace = $1 AND deployment = $2`, workspace, name)
		for _, p := range pins {
			b.Queue(`INSERT INTO deployment_pins (workspace, training_run_id, checkpoint_id, deployment)
				VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, workspace, p.RunID, p.CheckpointID, name)
		}
		for _, g := range d.GetGrants() {
			b.Queue(`INSERT INTO deployment_grants (grantee, workspace, deployment) VALUES ($1, $2, $3)
				ON CONFLICT DO NOTHING`, g, workspace, name)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("store: put deployment %s: %w", name, err)
	}
	return nil
}

// GetDeployment returns a deployment of the workspace by name.
func (s *Store) GetDeployment(ctx context.Context, workspace, name string) (*loopsv1.Deployment, error) {
	return get(ctx, s, "deployment", name, newDeployment,
		`SELECT data FROM deployments WHERE workspace = $1 AND name = $2`, workspace, name)
}

// ListDeployments lists the workspace's deployments by name.
func (s *Store) ListDeployments(ctx context.Context, workspace string) ([]*loopsv1.Deployment, error) {
	return s.deployments(ctx, "list deployments",
		`SELECT workspace, data FROM deployments WHERE workspace = $1 ORDER BY name`, workspace)
}

// ListAllDeployments lists every workspace's deployments by (workspace, name), limit of them
// after (afterWorkspace, afterName).
func (s *Store) ListAllDeployments(ctx context.Context, afterWorkspace, afterName string, limit int) ([]*loopsv1.Deployment, error) {
	return s.deployments(ctx, "list all deployments",
		`SELECT workspace, data FROM deployments WHERE (workspace, name) > ($1, $2)
		 ORDER BY workspace, name LIMIT $3`, afterWorkspace, afterName, max(limit, 1))
}

// ListGrantedDeployments lists the deployments shared with grantee, by owner and name.
func (s *Store) ListGrantedDeployments(ctx context.Context, grantee string) ([]*loopsv1.Deployment, error) {
	return s.deployments(ctx, "list granted deployments",
		`SELECT d.workspace, d.data FROM deployment_grants g
		 JOIN deployments d ON d.workspace = g.workspace AND d.name = g.deployment
		 WHERE g.grantee = $1 ORDER BY d.workspace, d.name`, grantee)
}

func (s *Store) deployments(ctx context.Context, what, query string, args ...any) ([]*loopsv1.Deployment, error) {
	out := []*loopsv1.Deployment{}
	err := s.scanOwned(ctx, what, query, args, func(_ string, data []byte) error {
		m := newDeployment()
		if err := proto.Unmarshal(data, m); err != nil {
			return err
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// DeleteDeployment removes a deployment of the workspace; its pins and grants go with it.
func (s *Store) DeleteDeployment(ctx context.Context, workspace, name string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM deployments WHERE workspace = $1 AND name = $2`, workspace, name)
	if err != nil {
		return fmt.Errorf("store: delete deployment %s: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: delete deployment %s: %w", name, store.ErrNotFound)
	}
	return nil
}

// CheckpointDeployments returns the names of the workspace's deployments that pin a
// checkpoint.
func (s *Store) CheckpointDeployments(ctx context.Context, workspace, runID, checkpointID string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT deployment FROM deployment_pins
		WHERE workspace = $1 AND training_run_id = $2 AND checkpoint_id = $3 ORDER BY deployment`,
		workspace, runID, checkpointID)
	if err != nil {
		return nil, fmt.Errorf("store: checkpoint deployments: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: checkpoint deployments: %w", err)
	}
	if out == nil {
		out = []string{}
	}
	return out, nil
}

func newDeployment() *loopsv1.Deployment { return &loopsv1.Deployment{} }
