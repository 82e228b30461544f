package ckstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
)

func put(t *testing.T, url string, body []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, url, bytes.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(msg))
}

func fileOf(name string, body []byte) ckstore.File {
	h := sha256.Sum256(body)
	return ckstore.File{Name: name, Size: int64(len(body)), SHA256: hex.EncodeToString(h[:])}
}

// TestS3Uploads: a checkpoint written through presigned PUT URLs (as a worker on another
// host writes one) is invisible until committed, then reads back verified, replaces the
// previous version whole, and can be read through presigned GET URLs; a commit whose sizes
// do not match what was uploaded, or that names a file outside the upload, commits nothing
// and removes the upload.
func TestS3Uploads(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	st, err := ckstore.Open(t.Context(), "s3://"+srv.NewBucket(t)+"/up", ckstore.Options{})
	require.NoError(t, err)
	ups, ok := st.(ckstore.Uploads)
	require.True(t, ok, "the S3 store takes uploads")
	local, err := ckstore.Open(t.Context(), t.TempDir(), ckstore.Options{})
	require.NoError(t, err)
	_, ok = local.(ckstore.Uploads)
	require.False(t, ok, "the local store does not")

	ctx := t.Context()
	const key = "ws/run/weights/a"
	old := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(old, "adapter_model.safetensors"), []byte("old"), 0o644))
	_, err = st.Put(ctx, key, old)
	require.NoError(t, err)

	weights, config := bytes.Repeat([]byte("w"), 1<<20), []byte(`{"r":8}`)
	up, err := ups.BeginUpload(ctx, key, []string{"adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors"}, time.Minute)
	require.NoError(t, err)
	put(t, up.URLs["adapter_model.safetensors"], weights)
	put(t, up.URLs["adapter_config.json"], config)
	put(t, up.URLs["optimizer.safetensors"], []byte("not reported, so not committed"))
	m, err := st.Stat(ctx, key)
	require.NoError(t, err)
	require.Equal(t, []string{"adapter_model.safetensors"}, []string{m.Files[0].Name}, "uploaded but uncommitted: the old version is still the checkpoint")

	got, err := ups.CommitUpload(ctx, up, []ckstore.File{fileOf("adapter_model.safetensors", weights), fileOf("adapter_config.json", config)})
	require.NoError(t, err)
	require.Len(t, got.Files, 2)
	dir := filepath.Join(t.TempDir(), "copy")
	_, err = st.Fetch(ctx, key, dir)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "adapter_model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, weights, b)
	require.NoFileExists(t, filepath.Join(dir, "optimizer.safetensors"))

	urls, err := ups.DownloadURLs(ctx, key, got, time.Minute)
	require.NoError(t, err)
	resp, err := http.Get(urls["adapter_config.json"])
	require.NoError(t, err)
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, config, b)

	// Bad commits change nothing and remove the upload.
	for name, files := range map[string][]ckstore.File{
		"size mismatch":     {fileOf("adapter_model.safetensors", []byte("short"))},
		"not in the upload": {fileOf("other.bin", []byte("x"))},
		"bad hash":          {{Name: "adapter_model.safetensors", Size: 5, SHA256: "zz"}},
	} {
		t.Run(name, func(t *testing.T) {
			up, err := ups.BeginUpload(ctx, key, []string{"adapter_model.safetensors"}, time.Minute)
			require.NoError(t, err)
			put(t, up.URLs["adapter_model.safetensors"], []byte("12345678"))
			_, err = ups.CommitUpload(ctx, up, files)
			require.Error(t, err)
			m, err := st.Stat(ctx, key)
			require.NoError(t, err)
			require.Equal(t, got.Generation, m.Generation, "the committed version stays")
			n, err := st.Sweep(ctx, "", 0)
			require.NoError(t, err)
			require.Zero(t, n, "the failed upload was removed at once")
		})
	}
	_, err = ups.BeginUpload(ctx, key, []string{"../x"}, time.Minute)
	require.ErrorIs(t, err, ckstore.ErrInvalid)
	_, err = ups.BeginUpload(ctx, key, []string{"a", "a"}, time.Minute)
	require.ErrorIs(t, err, ckstore.ErrInvalid)
}
