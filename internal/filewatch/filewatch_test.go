package filewatch_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/filewatch"
)

// number is what the test's files hold: one whole number.
type number struct{ n int }

func numbers() filewatch.Options[number] {
	return filewatch.Options[number]{Flag: "--number", What: "number", MaxBytes: 8,
		Parse: func(data []byte) (*number, error) {
			if len(data) > 8 {
				return nil, errors.New("too long")
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(data)))
			return &number{n}, err
		},
		Version: func(v *number) string { return strconv.Itoa(v.n) }}
}

// TestWatcher: a file is parsed at load (an error names the flag and the file); Poll
// reloads it when its stamp changed and reports it; a bad change is refused and the value
// in force kept, and not read again until the file changes; a file over MaxBytes is
// refused; a nil Watcher holds nil.
func TestWatcher(t *testing.T) {
	file := filepath.Join(t.TempDir(), "n")
	edit := func(body string, age time.Duration) {
		require.NoError(t, os.WriteFile(file, []byte(body), 0o600))
		at := time.Now().Add(-age)
		require.NoError(t, os.Chtimes(file, at, at))
	}
	log := slog.New(slog.DiscardHandler)
	edit("x", time.Hour)
	_, err := filewatch.Load(file, numbers(), log)
	require.ErrorContains(t, err, "--number "+file+": strconv.Atoi")
	_, err = filewatch.Load(file+".missing", numbers(), log)
	require.ErrorContains(t, err, "--number: open")

	edit("1", 50*time.Minute)
	w, err := filewatch.Load(file, numbers(), log)
	require.NoError(t, err)
	first := w.Current()
	require.Equal(t, 1, first.n)
	require.False(t, w.Poll(), "unchanged")

	edit("2", 40*time.Minute)
	require.True(t, w.Poll())
	require.Equal(t, 2, w.Current().n)
	require.Equal(t, 1, first.n, "a value in force is never changed")

	edit("two", 30*time.Minute)
	require.False(t, w.Poll(), "refused")
	require.Equal(t, 2, w.Current().n, "kept")
	edit("123456789", 20*time.Minute)
	require.False(t, w.Poll(), "over MaxBytes")
	require.Equal(t, 2, w.Current().n)
	edit("3", 10*time.Minute)
	require.True(t, w.Poll())
	require.Equal(t, 3, w.Current().n)

	var none *filewatch.Watcher[number]
	require.Nil(t, none.Current())
}
