package bounded

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(p, []byte("12345"), 0o644))
	b, err := ReadFile(p, 5)
	require.NoError(t, err)
	require.Equal(t, "12345", string(b))
	_, err = ReadFile(p, 4)
	require.ErrorContains(t, err, "f is 5 bytes, larger than the limit of 4")
	_, err = ReadFile(dir, 4)
	require.ErrorContains(t, err, "is not a regular file")
	_, err = ReadFile(filepath.Join(dir, "nope"), 4)
	require.ErrorIs(t, err, os.ErrNotExist)
}
