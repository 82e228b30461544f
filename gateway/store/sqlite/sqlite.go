package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/loops-dev/loops/gateway/store"
)

// busyTimeoutMillis is how long a connection waits for a lock held by another connection
// before it fails with SQLITE_BUSY.
const busyTimeoutMillis = 10_000

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is a store.Store on an SQLite database file. It is safe for concurrent use.
type Store struct {
	// w is the single writer connection; every write goes through it.
	w *sql.DB
	// r is a pool of read-only connections.
	r *sql.DB
	// metricsCheck says when to count a run's step metrics; insertMetrics is
	// insertStepMetrics prepared once on w (stepmetrics.go).
	metricsCheck  store.StepMetricsCheck
	insertMetrics *sql.Stmt

	closeOnce sync.Once
	closeErr  error
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Pinger = (*Store)(nil)
)

// Open opens the SQLite database at path, creating the file (and its directory) when it
// does not exist, and brings its schema up to date. The caller must Close the store.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("store: open sqlite: path %q is not a file path", path)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("store: open sqlite: %w", err)
		}
	}

	// A file: URI keeps paths with '?' or '#' intact; the driver reads the _ parameters and
	// passes the rest to SQLite.
	uri := "file:" + escapePath(path)
	pragmas := "_pragma=busy_timeout(" + strconv.Itoa(busyTimeoutMillis) + ")" +
		"&_pragma=foreign_keys(1)"

	w, err := sql.Open("sqlite", uri+"?"+pragmas+
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	// The writer creates the file, switches it to WAL and migrates it before any reader
	// connects.
	if err := migrate(ctx, w); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}

	r, err := sql.Open("sqlite", uri+"?"+pragmas+"&_pragma=query_only(1)")
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	readers := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)
	if err := r.PingContext(ctx); err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	ins, err := w.PrepareContext(ctx, insertStepMetrics)
	if err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	return &Store{w: w, r: r, insertMetrics: ins}, nil
}

// Ping checks that the database answers a query within ctx's deadline. It uses a reading
// connection: the one writing connection may be busy with a long batch, which is load, not a
// failure.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.r.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("store: ping sqlite: %w", err)
	}
	return nil
}

// Close closes the database connections. Calls after the first return its result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = errors.Join(s.r.Close(), s.w.Close())
		if s.closeErr != nil {
			s.closeErr = fmt.Errorf("store: close sqlite: %w", s.closeErr)
		}
	})
	return s.closeErr
}

// escapePath escapes the characters that end or escape the path part of an SQLite URI.
func escapePath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(p)
}

// migration is one embedded schema change, applied when the database is older than version.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations reads the embedded migrations, named NNNN_description.sql, in order.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and '_'", e.Name())
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b migration) int { return a.version - b.version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: expected version %d", m.name, i+1)
		}
	}
	return ms, nil
}

// migrate applies, in one transaction, the migrations newer than the database's
// schema_version.
func migrate(ctx context.Context, db *sql.DB) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()

	if _, err := tx.ExecContext(ctx,
		`CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL) STRICT`); err != nil {
		return fmt.Errorf("migrate: create schema_version: %w", err)
	}
	var current int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&current)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return fmt.Errorf("migrate: init schema_version: %w", err)
		}
	case err != nil:
		return fmt.Errorf("migrate: read schema_version: %w", err)
	}
	if current > len(ms) {
		return fmt.Errorf("migrate: database schema version %d is newer than this binary's %d", current, len(ms))
	}
	for _, m := range ms[current:] {
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("migrate: apply %s: %w", m.name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, len(ms)); err != nil {
		return fmt.Errorf("migrate: update schema_version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}
