package postgres

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestKeysetPagingUsesNoOffset: a page after a cursor is an index range with LIMIT, no
// OFFSET; the server plans it as a scan of the listing's index, not a sort of the whole
// workspace (the contract suite checks the pages themselves).
func TestKeysetPagingUsesNoOffset(t *testing.T) {
	q := sqlstore.ListQuery{From: `SELECT data FROM sessions WHERE workspace = $1`}
	after := &store.Cursor{CreateTime: time.Unix(5, 0), ID: "s10"}
	query, args, _, _ := q.Page(store.Page{After: after, Limit: 7}, []any{"ws"})
	require.NotContains(t, strings.ToUpper(query), "OFFSET")
	require.Equal(t, []any{"ws", int64(5e9), "s10", int64(7)}, args)
	// An explicit Offset still works, counted from the cursor.
	query, _, _, _ = q.Page(store.Page{After: after, Limit: 7, Offset: 3}, []any{"ws"})
	require.Contains(t, query, "OFFSET $5")

	srv := pgtest.Start(t)
	s, err := Open(t.Context(), srv.NewSchema(t), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	ctx := t.Context()
	var b store.Batch
	for i := range 5000 {
		b.TrainingRuns = append(b.TrainingRuns, store.OwnedTrainingRun{Workspace: fmt.Sprintf("ws%d", i%10), Run: &loopsv1.TrainingRun{
			Id: fmt.Sprintf("r%05d", i), CreateTime: timestamppb.New(time.Unix(int64(i), 0)),
		}})
	}
	require.NoError(t, s.ApplyBatch(ctx, b))
	_, err = s.pool.Exec(ctx, `ANALYZE training_runs`)
	require.NoError(t, err)
	query, args, _, _ = sqlstore.ListTrainingRuns.Page(store.Page{After: &store.Cursor{CreateTime: time.Unix(2500, 0), ID: "r02500"}, Limit: 10}, []any{"ws3"})
	rows, err := s.pool.Query(ctx, "EXPLAIN "+query, args...)
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.Contains(t, plan.String(), "training_runs_by_workspace", plan.String())
	require.NotContains(t, plan.String(), "Sort", plan.String())
}

// TestOptions: the pool size, statement timeout and application name reach the pool and
// the server.
func TestOptions(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.NewSchema(t)
	ctx := t.Context()
	s, err := Open(ctx, url, Options{MaxConns: 3, MinConns: 1, StatementTimeout: 1500 * time.Millisecond, ConnectTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.EqualValues(t, 3, s.pool.Config().MaxConns)
	require.EqualValues(t, 1, s.pool.Config().MinConns)
	require.Equal(t, 5*time.Second, s.pool.Config().ConnConfig.ConnectTimeout)
	var timeout, app string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('application_name')`).Scan(&timeout, &app))
	require.Equal(t, "1500ms", timeout)
	require.Equal(t, "loops", app)

	// Defaults, and the URL's own pool setting when no option overrides it.
	d, err := Open(ctx, url, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	require.EqualValues(t, DefaultMaxConns, d.pool.Config().MaxConns)
	require.Equal(t, DefaultConnectTimeout, d.pool.Config().ConnConfig.ConnectTimeout)
	u, err := Open(ctx, url+"&pool_max_conns=5", Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, u.Close()) })
	require.EqualValues(t, 5, u.pool.Config().MaxConns)
}
