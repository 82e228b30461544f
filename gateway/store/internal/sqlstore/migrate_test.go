package sqlstore

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestLoadMigrations(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("B")},
		"m/0001_a.sql": {Data: []byte("A")},
	}
	ms, err := LoadMigrations(fsys, "m")
	require.NoError(t, err)
	require.Equal(t, []Migration{{1, "0001_a.sql", "A"}, {2, "0002_b.sql", "B"}}, ms)

	for name, fs := range map[string]fstest.MapFS{
		"gap":        {"m/0001_a.sql": {}, "m/0003_c.sql": {}},
		"no version": {"m/a.sql": {}},
		"zero":       {"m/0000_a.sql": {}},
	} {
		_, err := LoadMigrations(fs, "m")
		require.Error(t, err, name)
	}
}

// fakeSchema records what Migrate runs; version is schema_version's row (nil: none).
type fakeSchema struct {
	version *int
	ran     []string
}

func (f *fakeSchema) Exec(_ context.Context, sql string) error {
	f.ran = append(f.ran, sql)
	return nil
}

func (f *fakeSchema) QueryInt(context.Context, string) (int, bool, error) {
	if f.version == nil {
		return 0, false, nil
	}
	return *f.version, true, nil
}

func TestMigrate(t *testing.T) {
	ms := []Migration{{1, "0001_a.sql", "A"}, {2, "0002_b.sql", "B"}}
	f := &fakeSchema{}
	require.NoError(t, Migrate(t.Context(), SQLite, f, ms))
	require.Equal(t, []string{
		"CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL) STRICT",
		"INSERT INTO schema_version (version) VALUES (0)", "A", "B", "UPDATE schema_version SET version = 2",
	}, f.ran)

	one := 1
	f = &fakeSchema{version: &one}
	require.NoError(t, Migrate(t.Context(), Postgres, f, ms))
	require.Equal(t, []string{
		"CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", "B", "UPDATE schema_version SET version = 2",
	}, f.ran, "only the newer migration runs")

	three := 3
	require.ErrorContains(t, Migrate(t.Context(), Postgres, &fakeSchema{version: &three}, ms), "newer than this binary")
}
