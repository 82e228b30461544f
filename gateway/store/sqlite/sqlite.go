package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
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
	ins, err := w.PrepareContext(ctx, sqlstore.SQLite.InsertStepMetrics)
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

// migrate applies, in one transaction, the migrations newer than the database's
// schema_version.
func migrate(ctx context.Context, db *sql.DB) error {
	ms, err := sqlstore.LoadMigrations(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := sqlstore.Migrate(ctx, sqlstore.SQLite, schemaTx{tx}, ms); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

// schemaTx is a transaction as sqlstore.Migrate uses it.
type schemaTx struct{ tx *sql.Tx }

func (t schemaTx) Exec(ctx context.Context, query string) error {
	_, err := t.tx.ExecContext(ctx, query)
	return err
}

func (t schemaTx) QueryInt(ctx context.Context, query string) (int, bool, error) {
	var v int
	err := t.tx.QueryRowContext(ctx, query).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return v, err == nil, err
}

// SetFence returns store.ErrNoFence: an SQLite database is one gateway's own, which no other
// gateway writes.
func (s *Store) SetFence(store.Fence) error { return store.ErrNoFence }
