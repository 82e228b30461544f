package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// CreateProject inserts a project of the workspace; store.ErrExists when its name is taken.
func (s *Store) CreateProject(ctx context.Context, workspace string, p *loopsv1.Project) error {
	q, err := sqlstore.CreateProject(workspace, p)
	var n int64
	if err == nil {
		n, err = s.exec(ctx, q.SQL, q.Args...)
	}
	if err == nil && n == 0 {
		err = store.ErrExists
	}
	if err != nil {
		return fmt.Errorf("store: create project %s: %w", p.GetName(), err)
	}
	return nil
}

// GetProject returns a project of the workspace by name.
func (s *Store) GetProject(ctx context.Context, workspace, name string) (*loopsv1.Project, error) {
	return get(ctx, s.r, sqlstore.GetProject(workspace, name))
}

// ListProjects lists the workspace's projects by name.
func (s *Store) ListProjects(ctx context.Context, workspace string) ([]*loopsv1.Project, error) {
	return messages(ctx, s, "list projects", sqlstore.NewProject, sqlstore.ListProjects, workspace)
}

// DeleteProject removes a project of the workspace that no session belongs to.
func (s *Store) DeleteProject(ctx context.Context, workspace, name string) error {
	n, err := s.exec(ctx, sqlstore.DeleteProject, sqlstore.DeleteProjectArgs(workspace, name)...)
	if err == nil && n == 0 {
		err = store.ErrProjectInUse
		if _, gerr := s.GetProject(ctx, workspace, name); errors.Is(gerr, store.ErrNotFound) {
			err = store.ErrNotFound
		} else if gerr != nil {
			err = gerr
		}
	}
	if err != nil {
		return fmt.Errorf("store: delete project %s: %w", name, err)
	}
	return nil
}

// SearchSessions returns the workspace's sessions that match q, newest first.
func (s *Store) SearchSessions(ctx context.Context, workspace string, q store.SessionQuery) ([]store.SessionHit, error) {
	sq := sqlstore.SearchSessions(workspace, q)
	var out []store.SessionHit
	err := s.query(ctx, "search sessions", sq.SQL, sq.Args, func(rows *sql.Rows) error {
		var err error
		out, err = sqlstore.ScanSessionHits(rows)
		return err
	})
	return out, err
}

// ListProjectTrainingRuns lists the training runs of the project's sessions, newest first,
// and their count.
func (s *Store) ListProjectTrainingRuns(ctx context.Context, workspace, project string, page store.Page) ([]*loopsv1.TrainingRun, int64, error) {
	return list(ctx, s.r, "training runs", sqlstore.NewTrainingRun, sqlstore.ListProjectTrainingRuns, page,
		sqlstore.ListProjectTrainingRunsArgs(workspace, project)...)
}

// ListUnindexedSessions lists sessions stored before sessions were indexed for search, by id.
func (s *Store) ListUnindexedSessions(ctx context.Context, afterID string, limit int) ([]store.OwnedSession, error) {
	var out []store.OwnedSession
	err := s.query(ctx, "list unindexed sessions", sqlstore.ListUnindexedSessions, []any{afterID, max(limit, 1)}, func(rows *sql.Rows) error {
		return sqlstore.ScanOwned(rows, sqlstore.NewSession, func(ws string, m *loopsv1.Session) {
			out = append(out, store.OwnedSession{Workspace: ws, Session: m})
		})
	})
	return out, err
}
