package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
	data, err := proto.Marshal(d)
	if err != nil {
		return fmt.Errorf("store: put deployment %s: encode: %w", d.GetName(), err)
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: put deployment %s: %w", d.GetName(), err)
	}
	defer func() { _ = tx.Rollback() }()
	name := d.GetName()
	steps := []struct {
		q    string
		args []any
	}{
		{`INSERT INTO deployments (workspace, name, create_time, data) VALUES (?, ?, ?, ?)
		  ON CONFLICT (workspace, name) DO UPDATE SET create_time = excluded.create_time, data = excluded.data`,
			[]any{workspace, name, nanos(d.GetCreateTime()), data}},
		{`DELETE FROM deployment_pins WHERE workspace = ? AND deployment = ?`, []any{workspace, name}},
		{`DELETE FROM deployment_grants WHERE workspace = ? AND deployment = ?`, []any{workspace, name}},
	}
	for _, p := range pins {
		steps = append(steps, struct {
			q    string
			args []any
		}{`INSERT OR IGNORE INTO deployment_pins (workspace, training_run_id, checkpoint_id, deployment) VALUES (?, ?, ?, ?)`,
			[]any{workspace, p.RunID, p.CheckpointID, name}})
	}
	for _, g := range d.GetGrants() {
		steps = append(steps, struct {
			q    string
			args []any
		}{`INSERT OR IGNORE INTO deployment_grants (grantee, workspace, deployment) VALUES (?, ?, ?)`,
			[]any{g, workspace, name}})
	}
	for _, st := range steps {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return fmt.Errorf("store: put deployment %s: %w", name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: put deployment %s: %w", name, err)
	}
	return nil
}

// GetDeployment returns a deployment of the workspace by name.
func (s *Store) GetDeployment(ctx context.Context, workspace, name string) (*loopsv1.Deployment, error) {
	return get(ctx, s.r, "deployment", name, newDeployment,
		`SELECT data FROM deployments WHERE workspace = ? AND name = ?`, workspace, name)
}

// ListDeployments lists the workspace's deployments by name.
func (s *Store) ListDeployments(ctx context.Context, workspace string) ([]*loopsv1.Deployment, error) {
	return s.deployments(ctx, "list deployments",
		`SELECT workspace, data FROM deployments WHERE workspace = ? ORDER BY name`, workspace)
}

// ListAllDeployments lists every workspace's deployments by (workspace, name), limit of them
// after (afterWorkspace, afterName).
func (s *Store) ListAllDeployments(ctx context.Context, afterWorkspace, afterName string, limit int) ([]*loopsv1.Deployment, error) {
	return s.deployments(ctx, "list all deployments",
		`SELECT workspace, data FROM deployments WHERE workspace > ? OR (workspace = ? AND name > ?)
		 ORDER BY workspace, name LIMIT ?`, afterWorkspace, afterWorkspace, afterName, max(limit, 1))
}

// ListGrantedDeployments lists the deployments shared with grantee, by owner and name.
func (s *Store) ListGrantedDeployments(ctx context.Context, grantee string) ([]*loopsv1.Deployment, error) {
	return s.deployments(ctx, "list granted deployments",
		`SELECT d.workspace, d.data FROM deployment_grants g
		 JOIN deployments d ON d.workspace = g.workspace AND d.name = g.deployment
		 WHERE g.grantee = ? ORDER BY d.workspace, d.name`, grantee)
}

func (s *Store) deployments(ctx context.Context, what, query string, args ...any) ([]*loopsv1.Deployment, error) {
	out := []*loopsv1.Deployment{}
	err := scanOwned(ctx, s.r, what, query, args, func(_ string, data []byte) error {
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
	res, err := s.w.ExecContext(ctx, `DELETE FROM deployments WHERE workspace = ? AND name = ?`, workspace, name)
	if err != nil {
		return fmt.Errorf("store: delete deployment %s: %w", name, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err == nil {
			err = store.ErrNotFound
		}
		return fmt.Errorf("store: delete deployment %s: %w", name, err)
	}
	return nil
}

// CheckpointDeployments returns the names of the workspace's deployments that pin a
// checkpoint.
func (s *Store) CheckpointDeployments(ctx context.Context, workspace, runID, checkpointID string) ([]string, error) {
	return names(ctx, s.r, `SELECT deployment FROM deployment_pins
		WHERE workspace = ? AND training_run_id = ? AND checkpoint_id = ? ORDER BY deployment`,
		workspace, runID, checkpointID)
}

func names(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: checkpoint deployments: %w", err)
	}
	defer func() { _ = rows.Close() }()
	out := []string{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("store: checkpoint deployments: %w", err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: checkpoint deployments: %w", err)
	}
	return out, nil
}

func newDeployment() *loopsv1.Deployment { return &loopsv1.Deployment{} }
