package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/sqlite"
)

// databaseFlags select and tune the metadata store of loops serve.
type databaseFlags struct {
	url              string
	maxConns         int
	connectTimeout   time.Duration
	statementTimeout time.Duration
}

// databaseEnv maps each database flag to the environment variable that sets it when the
// flag is not given.
var databaseEnv = map[string]string{
	"database":             "LOOPS_DATABASE",
	"db-max-conns":         "LOOPS_DB_MAX_CONNS",
	"db-connect-timeout":   "LOOPS_DB_CONNECT_TIMEOUT",
	"db-statement-timeout": "LOOPS_DB_STATEMENT_TIMEOUT",
}

func (d *databaseFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&d.url, "database", "", "metadata database: empty for SQLite (DATA_DIR/loops.db), or a PostgreSQL URL postgres://user:password@host:5432/db?sslmode=… (LOOPS_DATABASE)")
	fl.IntVar(&d.maxConns, "db-max-conns", postgres.DefaultMaxConns, "PostgreSQL: connections in the pool at most (LOOPS_DB_MAX_CONNS)")
	fl.DurationVar(&d.connectTimeout, "db-connect-timeout", postgres.DefaultConnectTimeout, "PostgreSQL: how long establishing one connection may take, the first included (LOOPS_DB_CONNECT_TIMEOUT)")
	fl.DurationVar(&d.statementTimeout, "db-statement-timeout", 0, "PostgreSQL: statement_timeout of every connection, a statement running longer fails; 0 keeps the server's (LOOPS_DB_STATEMENT_TIMEOUT)")
}

// applyEnv sets every database flag that was not given from its environment variable, so
// that a malformed value is reported like a malformed flag.
func (d *databaseFlags) applyEnv(cmd *cobra.Command) error {
	for flag, name := range databaseEnv {
		if v := env(name, ""); v != "" && !cmd.Flags().Changed(flag) {
			if err := cmd.Flags().Set(flag, v); err != nil {
				return fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	}
	return nil
}

// open opens the store the flags select and describes it for the start-up banner (a
// PostgreSQL URL without its password).
func (d *databaseFlags) open(ctx context.Context, dataDir string) (store.Store, string, error) {
	switch {
	case d.url == "":
		path := filepath.Join(dataDir, "loops.db")
		st, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, "", err
		}
		return st, "sqlite " + path, nil
	case strings.HasPrefix(d.url, "postgres://"), strings.HasPrefix(d.url, "postgresql://"):
		if d.maxConns <= 0 {
			return nil, "", fmt.Errorf("--db-max-conns %d: use 1 or more", d.maxConns)
		}
		if d.connectTimeout <= 0 || d.statementTimeout < 0 {
			return nil, "", fmt.Errorf("--db-connect-timeout must be positive and --db-statement-timeout 0 or positive")
		}
		st, err := postgres.Open(ctx, d.url, postgres.Options{
			MaxConns:         d.maxConns,
			ConnectTimeout:   d.connectTimeout,
			StatementTimeout: d.statementTimeout,
		})
		if err != nil {
			return nil, "", err
		}
		return st, "postgres " + postgres.Redact(d.url), nil
	}
	return nil, "", fmt.Errorf("--database %q: use a postgres:// URL, or leave it empty for SQLite in --data-dir", postgres.Redact(d.url))
}
