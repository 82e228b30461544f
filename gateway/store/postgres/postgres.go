package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
)

// Defaults of Options.
const (
	// DefaultMaxConns is the pool's size when neither Options nor the URL set one.
	DefaultMaxConns = 16
	// DefaultConnectTimeout bounds establishing one connection.
	DefaultConnectTimeout = 10 * time.Second
)

// migrationLock is the key of the advisory lock that serializes migrations between
// gateways starting at once on the same database.
const migrationLock = 0x6c6f6f7073 // "loops"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Options tune the connection pool. Zero values keep the URL's setting (pgx's pool_* and
// connect_timeout parameters), else the default.
type Options struct {
	// MaxConns caps the pool's connections (default DefaultMaxConns).
	MaxConns int
	// MinConns connections are kept open even when idle (default 0).
	MinConns int
	// ConnectTimeout bounds establishing one connection, the first one included (default
	// DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// StatementTimeout is the server's statement_timeout for every connection: a statement
	// running longer is cancelled and fails (default: the server's setting, usually none).
	StatementTimeout time.Duration
	// MaxConnIdleTime closes connections idle for longer (default pgx's, 30 minutes).
	MaxConnIdleTime time.Duration
	// MaxConnLifetime closes connections older than this, so that a pool follows a failover
	// or DNS change (default pgx's, 1 hour).
	MaxConnLifetime time.Duration
}

// Store is a store.Store on a PostgreSQL database. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// metricsCheck says when to count a run's step metrics (stepmetrics.go).
	metricsCheck store.StepMetricsCheck
	// fence is what every write checks (write.go); nil: none.
	fence atomic.Pointer[store.Fence]

	closeOnce sync.Once
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Pinger = (*Store)(nil)
)

// Open connects to the PostgreSQL database at databaseURL (postgres://user:password@host:port/db?…
// or a key=value connection string), checks that it answers, and brings its schema up to
// date. The caller must Close the store.
func Open(ctx context.Context, databaseURL string, o Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx's error quotes the URL, password included; say which part is wrong instead.
		return nil, fmt.Errorf("store: open postgres: invalid database URL %s", Redact(databaseURL))
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = int32(min(o.MaxConns, 1<<20))
	} else if !strings.Contains(databaseURL, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	if o.MinConns > 0 {
		cfg.MinConns = int32(min(o.MinConns, int(cfg.MaxConns)))
	}
	if o.ConnectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = o.ConnectTimeout
	} else if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	if o.StatementTimeout > 0 {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(o.StatementTimeout.Milliseconds(), 10)
	}
	if o.MaxConnIdleTime > 0 {
		cfg.MaxConnIdleTime = o.MaxConnIdleTime
	}
	if o.MaxConnLifetime > 0 {
		cfg.MaxConnLifetime = o.MaxConnLifetime
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "loops"
	}
	where := Redact(databaseURL)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open postgres %s: %w", where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.ConnConfig.ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: open postgres %s: %w", where, err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: open postgres %s: %w", where, err)
	}
	return &Store{pool: pool}, nil
}

// Ping checks that the database answers, on a connection of the pool, within ctx's
// deadline.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("store: ping postgres: %w", err)
	}
	return nil
}

// Stat returns the connection pool's statistics (for metrics).
func (s *Store) Stat() *pgxpool.Stat { return s.pool.Stat() }

// Close closes the pool's connections, waiting for those in use to be released. Calls after
// the first do nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(s.pool.Close)
	return nil
}

// Redact returns a database URL or connection string with its password replaced by
// "xxxxx", for logs and errors.
func Redact(databaseURL string) string {
	if u, err := url.Parse(databaseURL); err == nil && u.Scheme != "" {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	if scheme, rest, ok := strings.Cut(databaseURL, "://"); ok {
		// A URL too broken to parse: keep the user, hide whatever follows it before '@'.
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if user, _, hasPw := strings.Cut(rest[:at], ":"); hasPw {
				return scheme + "://" + user + ":xxxxx" + rest[at:]
			}
		}
		return databaseURL
	}
	// key=value form: drop the password's value.
	fields := strings.Fields(databaseURL)
	for i, f := range fields {
		if strings.HasPrefix(f, "password=") {
			fields[i] = "password=xxxxx"
		}
	}
	return strings.Join(fields, " ")
}

// migrate applies, in one transaction, the migrations newer than the database's
// schema_version. An advisory lock makes gateways that start at once migrate one after
// the other; the later ones find nothing left to do.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := sqlstore.LoadMigrations(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		return sqlstore.Migrate(ctx, sqlstore.Postgres, schemaTx{tx}, ms)
	})
}

// schemaTx is a transaction as sqlstore.Migrate uses it.
type schemaTx struct{ tx pgx.Tx }

func (t schemaTx) Exec(ctx context.Context, query string) error {
	// Simple protocol: a migration may hold several statements.
	_, err := t.tx.Exec(ctx, query, pgx.QueryExecModeSimpleProtocol)
	return err
}

func (t schemaTx) QueryInt(ctx context.Context, query string) (int, bool, error) {
	var v int
	err := t.tx.QueryRow(ctx, query).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return v, err == nil, err
}
