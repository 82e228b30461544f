package gateway_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/jobs"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestJobsSeeTheGatewaysHubCache: a job's huggingface_hub is pointed at the hub cache the
// gateway itself reads models from (internal/hfcache), here found through XDG_CACHE_HOME as
// huggingface_hub finds it, and sees its model snapshots there, but not the token beside it.
func TestJobsSeeTheGatewaysHubCache(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bubblewrap is not installed (.ci/run installs it)")
		}
		t.Skip("bubblewrap is not installed")
	}
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

	exe, err := os.Executable()
	require.NoError(t, err)
	pol, err := policy.Parse([]byte("default: {allow_jobs: true}\n"))
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: t.TempDir(), Jobs: gateway.JobsConfig{
		Python: func(context.Context, io.Writer) (jobs.Python, error) {
			return jobs.Python{Exe: "/usr/bin/python3"}, nil
		},
		Relay: []string{exe}, RelayEnv: []string{"LOOPS_TEST_RELAY=1"}, WeakLimits: true,
	}}
	cfg.Core.Policy = pol
	url := startJobsServer(t, cfg)

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
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "s.py", Mode: 0o644, Size: int64(len(script)), Typeflag: tar.TypeReg}))
	_, err = tw.Write([]byte(script))
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	const key = "tml-open-mode-key"
	cl := loopsv1connect.NewJobServiceClient(http.DefaultClient, url, withKey(key))
	j, err := cl.SubmitJob(t.Context(), &loopsv1.SubmitJobRequest{Entrypoint: "s.py", Archive: buf.Bytes()})
	require.NoError(t, err)
	var log strings.Builder
	var off int64
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		res, err := cl.ReadJobLogs(t.Context(), &loopsv1.ReadJobLogsRequest{Id: j.GetId(), Offset: off, WaitSeconds: 5})
		require.NoError(t, err)
		log.Write(res.GetData())
		off = res.GetNextOffset()
		if res.GetJob().GetState() != loopsv1.JobState_JOB_STATE_RUNNING && off == res.GetJob().GetLogBytes() {
			break
		}
	}
	require.Contains(t, log.String(), "HUB "+hub+"\n", "the job's HF_HUB_CACHE is the gateway's hub")
	require.Contains(t, log.String(), `CONFIG {"model_type":"tiny"}`, "the model's snapshot is readable")
	require.Contains(t, log.String(), "NO TOKEN", "the token beside the hub is not")
}
