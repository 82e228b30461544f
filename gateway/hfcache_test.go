package gateway_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJobsSeeTheGatewaysHubCache: a job's huggingface_hub is pointed at the hub cache the
// gateway itself reads models from (internal/hfcache), here found through XDG_CACHE_HOME as
// huggingface_hub finds it, and sees its model snapshots there, but not the token beside it.
func TestJobsSeeTheGatewaysHubCache(t *testing.T) {
	xdg := t.TempDir()
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("XDG_CACHE_HOME", xdg)
	hub := filepath.Join(xdg, "huggingface", "hub")
	const commit = "0123456789abcdef0123456789abcdef01234567"
	snap := filepath.Join(hub, "models--org--m", "snapshots", commit)
	require.NoError(t, os.MkdirAll(snap, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(snap, "config.json"), []byte(`{"model_type":"tiny"}`), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(hub, "models--org--m", "refs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(hub, "models--org--m", "refs", "main"), []byte(commit), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(xdg, "huggingface", "token"), []byte("hf_SECRET"), 0o600))

	url := startSandboxJobsServer(t)
	script := `
import os
hub = os.environ.get("HF_HUB_CACHE", "")
print("HUB", hub, flush=True)
repo = os.path.join(hub, "models--org--m")
try:
    commit = open(os.path.join(repo, "refs", "main")).read().strip()
    print("CONFIG", open(os.path.join(repo, "snapshots", commit, "config.json")).read(), flush=True)
except OSError as e:
    print("NO MODEL", e, flush=True)
try:
    print("TOKEN", open(os.path.join(os.environ.get("HF_HOME", "/nowhere"), "token")).read(), flush=True)
except OSError:
    print("NO TOKEN", flush=True)
`
	log := runJobScript(t, url, "tml-open-mode-key", script)
	require.Contains(t, log, "HUB "+hub+"\n", "the job's HF_HUB_CACHE is the gateway's hub")
	require.Contains(t, log, `CONFIG {"model_type":"tiny"}`, "the model's snapshot is readable")
	require.Contains(t, log, "NO TOKEN", "the token beside the hub is not")
}
