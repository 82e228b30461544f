package sqlstore

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Migration is one embedded schema change, applied when the database is older than Version.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads the migrations in dir of fsys, named NNNN_description.sql, in order;
// their versions must be 1, 2, … without a gap.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and '_'", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: expected version %d", m.Name, i+1)
		}
	}
	return ms, nil
}

// SchemaTx is the transaction a migration runs in, as Migrate uses it.
type SchemaTx interface {
	// Exec runs sql, which takes no arguments and may hold several statements.
	Exec(ctx context.Context, sql string) error
	// QueryInt runs sql, which selects one integer; ok is false when it selects no row.
	QueryInt(ctx context.Context, sql string) (v int, ok bool, err error)
}

// Migrate applies, in tx, the migrations of ms newer than the database's schema_version
// (created with the dialect's table options when missing). The caller commits tx.
func Migrate(ctx context.Context, d Dialect, tx SchemaTx, ms []Migration) error {
	if err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`+d.TableOptions); err != nil {
		return fmt.Errorf("migrate: create schema_version: %w", err)
	}
	current, ok, err := tx.QueryInt(ctx, `SELECT version FROM schema_version`)
	switch {
	case err != nil:
		return fmt.Errorf("migrate: read schema_version: %w", err)
	case !ok:
		if err := tx.Exec(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return fmt.Errorf("migrate: init schema_version: %w", err)
		}
	}
	if current > len(ms) {
		return fmt.Errorf("migrate: database schema version %d is newer than this binary's %d", current, len(ms))
	}
	for _, m := range ms[current:] {
		if err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
	}
	if err := tx.Exec(ctx, `UPDATE schema_version SET version = `+strconv.Itoa(len(ms))); err != nil {
		return fmt.Errorf("migrate: update schema_version: %w", err)
	}
	return nil
}
