package gateway_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/jobs"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// jobsServer runs a gateway on dataDir whose policy lets team-b run jobs; keyC's team-c may not.
func jobsServer(t *testing.T, dataDir string) string {
	t.Helper()
	keys, err := auth.ParseKeys([]string{keyB + "=team-b", keyC + "=team-c"})
	require.NoError(t, err)
	pol, err := policy.Parse([]byte("workspaces:\n  team-b: {allow_jobs: true}\n"))
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: dataDir, Keys: keys}
	cfg.Core.Policy = pol
	return startJobsServer(t, cfg)
}

// startJobsServer starts a gateway with cfg and returns its URL.
func startJobsServer(t *testing.T, cfg gateway.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

func rest(t *testing.T, method, url, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(auth.HeaderName, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, out
}

// The gateway serves JobService on every surface: a workspace without allow_jobs gets 403
// naming the flag; a job left running by a gateway that died is failed, with the reason, once
// the gateway is back; another workspace does not see it.
func TestJobServiceServed(t *testing.T) {
	dir := t.TempDir()
	url := jobsServer(t, dir)

	code, body := rest(t, "POST", url+"/v1/jobs", keyC, `{"recipe":"sft_chat"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body["message"], "allow_jobs: true")
	require.Contains(t, body["message"], "--workspace-policy")
	_, err := loopsv1connect.NewJobServiceClient(http.DefaultClient, url, withKey(keyC)).
		SubmitJob(t.Context(), &loopsv1.SubmitJobRequest{Recipe: "sft_chat"})
	require.Equal(t, jobs.ReasonJobsNotAllowed, errs.Reason(err))
	code, body = rest(t, "POST", url+"/v1/jobs", keyB, `{"recipe":"sft_chat","entrypoint":"a.py"}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	code, _ = rest(t, "GET", url+"/v1/jobs/job-0000000000000001", keyB, "")
	require.Equal(t, http.StatusNotFound, code)
	list, err := loopsv1connect.NewJobServiceClient(http.DefaultClient, url, withKey(keyB)).
		ListJobs(t.Context(), &loopsv1.ListJobsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetJobs())
}

func TestJobsLeftRunningFailOnStart(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), dir+"/loops.db")
	require.NoError(t, err)
	require.NoError(t, st.PutJob(t.Context(), "team-b", &loopsv1.Job{Id: "job-00000000000000ab", State: loopsv1.JobState_JOB_STATE_RUNNING, Recipe: "sft_chat"}))
	require.NoError(t, st.Close())

	url := jobsServer(t, dir)
	code, body := rest(t, "GET", url+"/v1/jobs/job-00000000000000ab", keyB, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "JOB_STATE_FAILED", body["state"])
	require.Equal(t, jobs.ReasonRestarted, body["reason"])
	code, _ = rest(t, "GET", url+"/v1/jobs/job-00000000000000ab", keyC, "")
	require.Equal(t, http.StatusNotFound, code, "another workspace does not see it")
}

// A job's requests reach the gateway through its relay, from this host, yet never as an
// operator's: in open mode (no keys) a loopback client is an operator (PoolService answers
// it), the job is not (403), and its own workspace's calls work.
func TestJobsAreNotOperators(t *testing.T) {
	url := startSandboxJobsServer(t)
	const key = "tml-open-mode-key"
	// PoolService answers an operator (this backend has no pools: 400 NO_POOLS) and refuses
	// anyone else (403).
	code, body := rest(t, "GET", url+"/v1/pools", key, "")
	require.NotEqual(t, http.StatusForbidden, code, "a loopback client is an operator in open mode: %v", body)

	script := `
import os, urllib.request, urllib.error
base, key = os.environ["TINKER_BASE_URL"], os.environ["TINKER_API_KEY"]
for path in ("/v1/pools", "/v1/jobs"):
    try:
        r = urllib.request.urlopen(urllib.request.Request(base + path, headers={"X-Api-Key": key}), timeout=10)
        print(path, r.status, flush=True)
    except urllib.error.HTTPError as e:
        print(path, e.code, flush=True)
`
	log := runJobScript(t, url, key, script)
	require.Contains(t, log, "/v1/pools 403", "a job is not an operator")
	require.Contains(t, log, "/v1/jobs 200", "a job calls its workspace's API")
}

// startSandboxJobsServer starts an open-mode gateway whose jobs run in the bubblewrap
// sandbox with the system's Python (skipped without bubblewrap, but on CI), and returns its
// URL.
func startSandboxJobsServer(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bubblewrap is not installed (.ci/run installs it)")
		}
		t.Skip("bubblewrap is not installed")
	}
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
	return startJobsServer(t, cfg)
}

// runJobScript submits the Python script as a job with key and returns its log once it has
// ended (or after a minute).
func runJobScript(t *testing.T, url, key, script string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "s.py", Mode: 0o644, Size: int64(len(script)), Typeflag: tar.TypeReg}))
	_, err := tw.Write([]byte(script))
	require.NoError(t, err)
	require.NoError(t, tw.Close())
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
	return log.String()
}
