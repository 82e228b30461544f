package ckhttp

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
)

// TestSparseEntriesAreRefused: a sparse file in the import's tar (GNU tar --sparse, in
// the PAX and the old GNU format) declares 1 GiB that the 10 KiB body does not hold; it is
// refused before its holes are written out.
func TestSparseEntriesAreRefused(t *testing.T) {
	for _, name := range []string{"pax-sparse.tar", "gnu-sparse.tar"} {
		body, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err)
		dir := t.TempDir()
		err = untarAdapter(bytes.NewReader(body), dir)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%s: %v", name, err)
		require.ErrorContains(t, err, "sparse", name)
		if fi, err := os.Stat(filepath.Join(dir, "adapter_model.safetensors")); err == nil {
			require.Less(t, fi.Size(), int64(len(body)), name)
		}
	}
}
