package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	"github.com/loops-dev/loops/gateway/store/storetest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestMain shares one PostgreSQL cluster between the package's tests.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens a store on url and closes it when the test ends.
func open(t *testing.T, url string, o postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), url, o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func TestContract(t *testing.T) {
	srv := pgtest.Start(t)
	var mu sync.Mutex
	dbs := map[string]string{} // the suite's path -> database URL
	storetest.Run(t, func(t *testing.T, path string) store.Store {
		mu.Lock()
		url, ok := dbs[path]
		if !ok {
			url = srv.NewSchema(t)
			dbs[path] = url
		}
		mu.Unlock()
		s, err := postgres.Open(t.Context(), url, postgres.Options{})
		require.NoError(t, err)
		return s
	})
}

// TestParallelApplyBatch commits overlapping batches from many goroutines at once, each
// listing the same records in a different order: none fails (no deadlock survives the
// id ordering and the retries), and every record ends as one of the versions written.
func TestParallelApplyBatch(t *testing.T) {
	srv := pgtest.Start(t)
	s := open(t, srv.NewSchema(t), postgres.Options{MaxConns: 32})
	ctx := t.Context()

	const workers, rounds, records = 16, 10, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				var b store.Batch
				for i := range records {
					k := (i*(w+1) + r) % records // a different order per worker and round
					b.TrainingRuns = append(b.TrainingRuns, store.OwnedTrainingRun{Workspace: "ws", Run: &loopsv1.TrainingRun{
						Id: fmt.Sprintf("run-%02d", k), LastSeqId: int64(w*rounds + r), CreateTime: timestamppb.New(time.Unix(int64(k), 0)),
					}})
					b.Operations = append(b.Operations, store.OwnedOperation{Workspace: "ws", Operation: &loopsv1.Operation{
						Id: fmt.Sprintf("op-%02d", k), TrainingRunId: fmt.Sprintf("run-%02d", k), SeqId: int64(w*rounds + r),
						State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
					}})
				}
				errs <- s.ApplyBatch(ctx, b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	runs, total, err := s.ListTrainingRuns(ctx, "ws", store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, records, total)
	for _, r := range runs {
		require.Less(t, r.GetLastSeqId(), int64(workers*rounds))
	}
	for i := range records {
		op, err := s.GetOperation(ctx, "ws", fmt.Sprintf("op-%02d", i))
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState())
	}
}

// TestMigrationsIdempotent opens the same database again and again, also from several
// stores at once (gateways starting together): the schema is created once, its version is
// the number of migrations, and data written before survives.
func TestMigrationsIdempotent(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.NewSchema(t)
	ctx := t.Context()

	first := open(t, url, postgres.Options{})
	require.NoError(t, first.PutSession(ctx, "ws", &loopsv1.Session{Id: "kept"}))
	require.NoError(t, first.Close())

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			s, err := postgres.Open(ctx, url, postgres.Options{MaxConns: 2})
			if err == nil {
				err = s.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	again := open(t, url, postgres.Options{})
	got, err := again.GetSession(ctx, "ws", "kept")
	require.NoError(t, err)
	require.Equal(t, "kept", got.GetId())

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(context.Background())) }()
	var version, rows int
	require.NoError(t, conn.QueryRow(ctx, `SELECT version, (SELECT count(*) FROM schema_version) FROM schema_version`).Scan(&version, &rows))
	require.Equal(t, migrationCount(t), version, "the schema is at the newest migration")
	require.Equal(t, 1, rows)

	// A database from a newer binary is refused.
	_, err = conn.Exec(ctx, `UPDATE schema_version SET version = 999`)
	require.NoError(t, err)
	_, err = postgres.Open(ctx, url, postgres.Options{})
	require.ErrorContains(t, err, "newer")
}

// TestMigrationsShareSQLiteShape: the two stores' migrations have the same names, so a
// schema version means the same change on both.
func TestMigrationsShareSQLiteShape(t *testing.T) {
	names := func(dir string) []string {
		entries, err := fs.ReadDir(os.DirFS(dir), ".")
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	require.Equal(t, names("../sqlite/migrations"), names("migrations"))
}

func TestOpenErrors(t *testing.T) {
	_, err := postgres.Open(t.Context(), "postgres://u:secret@127.0.0.1:1/db?connect_timeout=1", postgres.Options{})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
	_, err = postgres.Open(t.Context(), "postgres://u:secret@%zz", postgres.Options{})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}

func TestRedact(t *testing.T) {
	require.Equal(t, "postgres://u:xxxxx@h:5432/db?sslmode=disable", postgres.Redact("postgres://u:pw@h:5432/db?sslmode=disable"))
	require.Equal(t, "postgres://u@h/db", postgres.Redact("postgres://u@h/db"))
	require.Equal(t, "host=h password=xxxxx dbname=d", postgres.Redact("host=h password=pw dbname=d"))
}

// TestSchemaMatchesSQLite: after their migrations both stores have the same tables, columns
// (in the same order) and secondary indexes.
func TestSchemaMatchesSQLite(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "loops.db")
	sq, err := sqlite.Open(ctx, path)
	require.NoError(t, err)
	require.NoError(t, sq.Close())
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	pairs := func(rows interface {
		Next() bool
		Scan(...any) error
		Err() error
	}) []string {
		var out []string
		for rows.Next() {
			var a, b string
			require.NoError(t, rows.Scan(&a, &b))
			out = append(out, a+"."+b)
		}
		require.NoError(t, rows.Err())
		return out
	}
	rows, err := db.QueryContext(ctx, `SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p
		WHERE m.type = 'table' ORDER BY m.name, p.cid`)
	require.NoError(t, err)
	sqliteColumns := pairs(rows)
	require.NoError(t, rows.Close())
	rows, err = db.QueryContext(ctx, `SELECT tbl_name, name FROM sqlite_master
		WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%' ORDER BY tbl_name, name`)
	require.NoError(t, err)
	sqliteIndexes := pairs(rows)
	require.NoError(t, rows.Close())

	srv := pgtest.Start(t)
	url := srv.NewSchema(t)
	open(t, url, postgres.Options{})
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(context.Background())) }()
	prows, err := conn.Query(ctx, `SELECT table_name::text, column_name::text FROM information_schema.columns
		WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position`)
	require.NoError(t, err)
	pgColumns := pairs(prows)
	prows, err = conn.Query(ctx, `SELECT tablename::text, indexname::text FROM pg_indexes
		WHERE schemaname = current_schema() AND indexname NOT LIKE '%_pkey' ORDER BY tablename, indexname`)
	require.NoError(t, err)
	pgIndexes := pairs(prows)

	require.NotEmpty(t, sqliteColumns)
	require.Equal(t, sqliteColumns, pgColumns)
	require.NotEmpty(t, sqliteIndexes)
	require.Equal(t, sqliteIndexes, pgIndexes)
}

// migrationCount is the number of migrations this store ships (the schema version they end
// at).
func migrationCount(t *testing.T) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("migrations", "*.sql"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return len(files)
}
