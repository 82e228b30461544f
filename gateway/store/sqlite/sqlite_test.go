package sqlite_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	"github.com/loops-dev/loops/gateway/store/storetest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, path string) store.Store {
		s, err := sqlite.Open(t.Context(), path)
		require.NoError(t, err)
		return s
	})
}

func TestOpenPathWithURICharacters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b?c#d%20", "loops.db")
	s, err := sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	_, err = os.Stat(path)
	require.NoError(t, err)
}

func TestOpenCreatesDirectoryAndSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "loops.db")
	s, err := sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	// Opening again leaves the schema as it is.
	s, err = sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	var version int
	require.NoError(t, db.QueryRow(`SELECT version FROM schema_version`).Scan(&version))
	migrations, err := os.ReadDir("migrations")
	require.NoError(t, err)
	require.Equal(t, len(migrations), version, "the newest migration's version")
	var rows int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM schema_version`).Scan(&rows))
	require.Equal(t, 1, rows)
	var mode string
	require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	require.Equal(t, "wal", mode)
}

func TestOpenRejectsNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "loops.db")
	s, err := sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE schema_version SET version = 999`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	_, err = sqlite.Open(t.Context(), path)
	require.ErrorContains(t, err, "newer")
}

func TestOpenRejectsNonFilePaths(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file:x.db"} {
		_, err := sqlite.Open(t.Context(), p)
		require.Error(t, err, p)
	}
}

// TestNoFence: an SQLite database is one gateway's own: SetFence says it cannot fence, and
// writes go on unchecked.
func TestNoFence(t *testing.T) {
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "loops.db"))
	require.NoError(t, err)
	defer s.Close()
	require.ErrorIs(t, s.SetFence(store.Fence{Lease: "gateway", Holder: "a", Term: 1}), store.ErrNoFence)
	require.NoError(t, s.PutSession(t.Context(), "ws", &loopsv1.Session{Id: "s1"}))
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

// TestUsageRowsSurviveMigration15: usage rows written before migration 0015 (no run column)
// keep their amounts, costs, session and key, with no run, and new rows of a run of the same
// session, hour and kind are kept apart from them.
func TestUsageRowsSurviveMigration15(t *testing.T) {
	path := filepath.Join(t.TempDir(), "loops.db")
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join("migrations", "*.sql"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 15)
	_, err = db.Exec(`CREATE TABLE schema_version (version INTEGER NOT NULL) STRICT; INSERT INTO schema_version VALUES (14)`)
	require.NoError(t, err)
	for _, f := range files[:14] {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		_, err = db.Exec(string(b))
		require.NoError(t, err, f)
	}
	hour := int64(1_800_000_000) * 1e9
	_, err = db.Exec(`INSERT INTO usage (workspace, bucket_start, base_model, session_id, kind, amount, deployment, key_id, priced_amount, cost)
		VALUES ('ws-a', ?, '', 'sess-1', 'checkpoint_byte_seconds', 7, '', '', 7, 70)`, hour)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	s, err := sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	defer s.Close()
	start := time.Unix(0, hour).UTC()
	old := store.UsageRecord{BucketStart: start, SessionID: "sess-1", Kind: store.UsageCheckpointByteSeconds, Amount: 7, PricedAmount: 7, Cost: 70}
	run := old
	run.RunID, run.Amount, run.PricedAmount, run.Cost = "run-1", 3, 3, 30
	require.NoError(t, s.AddUsage(t.Context(), "ws-a", run))
	got, err := s.ListUsage(t.Context(), "ws-a", start, start.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{old, run}, got)
	sum, err := s.UsageCost(t.Context(), "ws-a", start, start.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(100), sum)
}
