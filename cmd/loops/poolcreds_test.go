package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools/poolstest"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
)

// TestHandStartedWorker: the operator's way to a worker started by hand: loops pools
// credentials issues it credentials from the gateway's data dir (key of mode 0600), the
// worker (loops worker) starts with them, and loops serve's static pool trains on it. A
// worker with another pool's credentials is never used.
func TestHandStartedWorker(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HF_HUB_CACHE", filepath.Join(dir, "hub"))
	const pool = "torch-loops-tiny"
	startWorker := func(pool string) string {
		creds := filepath.Join(t.TempDir(), "creds")
		out, err := runCLI(t, "pools", "credentials", pool, "--data-dir", dir, "--out", creds)
		require.NoError(t, err, out)
		require.Contains(t, out, "--tls-key "+filepath.Join(creds, "key.pem"))
		fi, err := os.Stat(filepath.Join(creds, "key.pem"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		addr, _ := poolstest.StartWorkerProcess(t, []string{goWorkerEnv + "=1", serve.LogLevelEnv + "=WARN"}, os.Args[0],
			"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "worker"), "--threads", "1", "--allow-dir", dir,
			"--tls-cert", filepath.Join(creds, "cert.pem"), "--tls-key", filepath.Join(creds, "key.pem"), "--tls-ca", filepath.Join(creds, "ca.pem"))
		return addr
	}
	other, good := startWorker("torch-other"), startWorker(pool)
	const key, opKey = "tml-hand-started", "tml-hand-operator"
	url, _ := startServe(t, dir, "--backend", "torch", "--api-key", key, "--operator-key", opKey, "--backend-opt", "provider=static",
		"--backend-opt", "workers="+other+","+good)
	run := createRun(t, url, key)
	out, err := runCLI(t, "allocations", "--url", url, "--operator-key", opKey)
	require.NoError(t, err, out)
	require.Contains(t, out, good)
	require.Contains(t, out, run, "the run's adapter is on the worker of the pool")

	_, err = runCLI(t, "pools", "credentials", "../x", "--data-dir", dir, "--out", t.TempDir())
	require.Error(t, err)
}

// TestWorkerStoreOptions: a folder --checkpoint-store is a folder the workers may use; an
// S3 one gives the workers its URLs' origin; options the operator set stay.
func TestWorkerStoreOptions(t *testing.T) {
	local, err := ckstore.Open(t.Context(), t.TempDir(), ckstore.Options{})
	require.NoError(t, err)
	opts := map[string]string{}
	require.NoError(t, workerStoreOptions(t.Context(), local, opts))
	require.Equal(t, map[string]string{"allow_dirs": local.String()}, opts)
	opts = map[string]string{"allow_dirs": "/mine"}
	require.NoError(t, workerStoreOptions(t.Context(), local, opts))
	require.Equal(t, "/mine", opts["allow_dirs"])

	srv := s3test.Start(t)
	srv.SetEnv(t)
	s3, err := ckstore.Open(t.Context(), "s3://"+srv.NewBucket(t)+"/p", ckstore.Options{})
	require.NoError(t, err)
	opts = map[string]string{}
	require.NoError(t, workerStoreOptions(t.Context(), s3, opts))
	require.Equal(t, map[string]string{"checkpoint_origins": srv.Endpoint}, opts)
}
