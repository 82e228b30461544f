package jobs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// tarball builds a tar archive (gzip-compressed when gz) of name -> contents.
func tarball(t testing.TB, gz bool, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for name, body := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	if zw != nil {
		require.NoError(t, zw.Close())
	}
	return buf.Bytes()
}

type fixture struct {
	svc   *Service
	api   *client
	st    store.Store
	dir   string
	gw    *httptest.Server
	seen  chan string // the API keys the fake gateway was called with
	other net.Listener
}

func needSandbox(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap is not installed")
	}
	if err := exec.Command("bwrap", "--unshare-all", "--ro-bind", "/", "/", "true").Run(); err != nil {
		t.Skipf("bubblewrap cannot make namespaces here: %v", err)
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
}

const testPolicy = `
workspaces:
  ws-a: {allow_jobs: true, max_running_jobs: 2, max_job_seconds: 30}
  ws-b: {allow_jobs: true}
  ws-short: {allow_jobs: true, max_job_seconds: 8}
  ws-mem: {allow_jobs: true, max_job_memory_mb: 256, max_job_seconds: 60}
  ws-small: {allow_jobs: true, max_job_memory_mb: 300, max_job_seconds: 60}
`

func newFixture(t *testing.T, dir string, st store.Store, opts ...func(*Options)) *fixture {
	t.Helper()
	f := &fixture{dir: dir, st: st, seen: make(chan string, 16)}
	// The gateway in open mode (no keys), as `loops serve` runs on loopback by default: the
	// auth middleware decides who is an operator.
	var open auth.Keys
	f.gw = httptest.NewUnstartedServer(open.Middleware(auth.Policy{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case f.seen <- r.Header.Get("X-Api-Key"):
		default:
		}
		if r.URL.Path == "/whoami" {
			fmt.Fprintf(w, "operator=%v", auth.IsOperator(r.Context()))
			return
		}
		fmt.Fprint(w, "hello from the gateway")
	})))
	// As the gateway's server: a connection that sends no request is closed (here sooner).
	f.gw.Config.ReadHeaderTimeout = time.Second
	f.gw.Start()
	// The jobs' connections, served by the same server as the gateway serves them.
	jobsLn := NewListener(f.gw.Listener.Addr())
	go func() { _ = f.gw.Config.Serve(jobsLn) }()
	t.Cleanup(func() { _ = jobsLn.Close() })
	t.Cleanup(f.gw.Close)
	var err error
	f.other, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.other.Close() })
	pol, err := policy.Parse([]byte(testPolicy))
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	o := Options{
		Dir: filepath.Join(dir, "jobs"), Store: st, Policy: pol, Gateway: f.gw.Listener.Addr().String(),
		Python: func(context.Context, io.Writer) (Python, error) {
			return Python{Exe: "/usr/bin/python3", Env: []string{"EXTRA=1"}}, nil
		},
		Relay: []string{exe}, RelayEnv: []string{"LOOPS_TEST_RELAY=1"}, Listener: jobsLn,
		// Jobs run where the tests run: with a cgroup when the host gives one (root here),
		// else with per-process limits (the refusal has its own test).
		WeakLimits: true,
		// Set, so that the checks before a job starts run without bubblewrap too; the tests
		// that run jobs call needSandbox.
		Bwrap: bwrapPath(),
		Grace: 2 * time.Second, MaxLogBytes: 4096, MaxKeptJobs: 3,
	}
	for _, opt := range opts {
		opt(&o)
	}
	f.svc, err = New(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.svc.Close(context.Background()) })
	f.api = serve(t, f.svc)
	return f
}

func bwrapPath() string {
	if p, err := exec.LookPath("bwrap"); err == nil {
		return p
	}
	return "/nonexistent/bwrap"
}

func openStore(t *testing.T, dir string) store.Store {
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	return st
}

func wsCtx(t *testing.T, ws string) context.Context {
	return auth.WithWorkspace(t.Context(), ws)
}

func submit(t *testing.T, s *client, ws string, m *loopsv1.SubmitJobRequest) (*loopsv1.Job, error) {
	return s.SubmitJob(wsCtx(t, ws), m)
}

// wait follows a job's log to its end and returns the log and the final job.
func wait(t *testing.T, s *client, ws, id string) (string, *loopsv1.Job) {
	t.Helper()
	var log bytes.Buffer
	var off int64
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		res, err := s.ReadJobLogs(wsCtx(t, ws), &loopsv1.ReadJobLogsRequest{Id: id, Offset: off, WaitSeconds: 5})
		require.NoError(t, err)
		log.Write(res.GetData())
		off = res.GetNextOffset()
		j := res.GetJob()
		if j.GetState() != loopsv1.JobState_JOB_STATE_RUNNING && off == j.GetLogBytes() {
			return log.String(), j
		}
	}
	t.Fatalf("job %s did not end", id)
	return "", nil
}

// The script runs in the sandbox with the key and base URL injected, reaches the gateway
// through the relay and nothing else, sees neither the data dir nor the host's files, and
// its log and exit status persist.
func TestJobRunsSandboxed(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	_, otherPort, _ := net.SplitHostPort(f.other.Addr().String())
	script := fmt.Sprintf(`
import os, sys, socket, urllib.request
print("key", os.environ["TINKER_API_KEY"], "extra", os.environ.get("EXTRA"))
url = os.environ["TINKER_BASE_URL"]
req = urllib.request.Request(url + "/x", headers={"X-Api-Key": os.environ["TINKER_API_KEY"]})
print("gateway says:", urllib.request.urlopen(req, timeout=10).read().decode())
try:
    socket.create_connection(("127.0.0.1", %s), timeout=3)
    print("other port: reached")
except OSError as e:
    print("other port: refused")
print("data dir visible:", os.path.exists(%q))
print("cwd", os.getcwd(), sorted(os.listdir(".")))
print("args", sys.argv[1:])
sys.exit(3)
`, otherPort, dir)
	j, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{
		Archive: tarball(t, true, map[string]string{"train.py": script, "data/x.txt": "x"}), Entrypoint: "train.py", Args: []string{"--steps", "2"},
	})
	require.NoError(t, err)
	require.Equal(t, loopsv1.JobState_JOB_STATE_RUNNING, j.GetState())
	require.True(t, strings.HasPrefix(j.GetId(), "job-"))

	log, end := wait(t, f.api, "ws-a", j.GetId())
	require.Contains(t, log, "key "+keyOf("ws-a")+" extra 1")
	require.Contains(t, log, "gateway says: hello from the gateway")
	require.Contains(t, log, "other port: refused", "the sandbox reaches the gateway and nothing else")
	require.Contains(t, log, "data dir visible: False")
	require.Contains(t, log, "cwd /job ['data', 'train.py']")
	require.Contains(t, log, "args ['--steps', '2']")
	require.Equal(t, keyOf("ws-a"), <-f.seen, "the job called the gateway with the submitting key")
	require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, end.GetState())
	require.Equal(t, int32(3), end.GetExitCode())
	require.Equal(t, "exited with status 3", end.GetReason())

	rec, err := st.GetJob(t.Context(), "ws-a", j.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, rec.GetState(), "the end is recorded")
	require.Equal(t, end.GetLogBytes(), rec.GetLogBytes())
	_, err = os.Stat(filepath.Join(dir, "jobs", j.GetId(), "files"))
	require.True(t, os.IsNotExist(err), "the job's files go when it ends; its log stays")
}

// Another workspace sees none of a workspace's jobs.
func TestJobsWorkspaceIsolation(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	j, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: tarball(t, false, map[string]string{"a.py": "print('ok')"}), Entrypoint: "a.py"})
	require.NoError(t, err)
	log, end := wait(t, f.api, "ws-a", j.GetId())
	require.Contains(t, log, "ok\n")
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, end.GetState())

	ctxB := wsCtx(t, "ws-b")
	_, err = f.api.GetJob(ctxB, &loopsv1.GetJobRequest{Id: j.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = f.api.ReadJobLogs(ctxB, &loopsv1.ReadJobLogsRequest{Id: j.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = f.api.CancelJob(ctxB, &loopsv1.CancelJobRequest{Id: j.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	list, err := f.api.ListJobs(ctxB, &loopsv1.ListJobsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetJobs())
	list, err = f.api.ListJobs(wsCtx(t, "ws-a"), &loopsv1.ListJobsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetJobs(), 1)
}

// Jobs are off unless the policy allows them: 403 naming the flag.
func TestJobsPolicy(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	_, err := submit(t, f.api, "ws-other", &loopsv1.SubmitJobRequest{Recipe: "sft_chat"})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.Equal(t, ReasonJobsNotAllowed, errs.Reason(err))
	require.ErrorContains(t, err, "allow_jobs: true")
	require.ErrorContains(t, err, "--workspace-policy")
}

// A workspace runs at most max_running_jobs at once (429); cancel stops a job (SIGTERM,
// then SIGKILL after the grace for one that ignores it) and frees its slot.
func TestJobsQuotaAndCancel(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	polite := tarball(t, false, map[string]string{"s.py": "import signal, sys, time\ndef stop(*_):\n    print('stopping cleanly', flush=True)\n    sys.exit(0)\nsignal.signal(signal.SIGTERM, stop)\nprint('up', flush=True)\ntime.sleep(600)\n"})
	stubborn := tarball(t, false, map[string]string{"s.py": "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)\n"})
	j1, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: polite, Entrypoint: "s.py"})
	require.NoError(t, err)
	j2, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: stubborn, Entrypoint: "s.py"})
	require.NoError(t, err)
	_, err = submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: polite, Entrypoint: "s.py"})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Equal(t, ReasonJobQuota, errs.Reason(err))
	require.ErrorContains(t, err, "max_running_jobs")

	// Another workspace is not held back by ws-a's quota.
	jb, err := submit(t, f.api, "ws-b", &loopsv1.SubmitJobRequest{Archive: tarball(t, false, map[string]string{"b.py": "print('b')"}), Entrypoint: "b.py"})
	require.NoError(t, err)
	_, endB := wait(t, f.api, "ws-b", jb.GetId())
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, endB.GetState())

	for i, j := range []*loopsv1.Job{j1, j2} {
		waitFor(t, f.api, "ws-a", j.GetId(), "up\n")
		start := time.Now()
		res, err := f.api.CancelJob(wsCtx(t, "ws-a"), &loopsv1.CancelJobRequest{Id: j.GetId()})
		took := time.Since(start)
		require.NoError(t, err)
		require.Equal(t, loopsv1.JobState_JOB_STATE_CANCELLED, res.GetState())
		require.Equal(t, "cancelled by a request", res.GetReason())
		log, _ := wait(t, f.api, "ws-a", j.GetId())
		if i == 0 {
			require.Contains(t, log, "stopping cleanly", "SIGTERM reaches the script, which stops on its own")
			require.Less(t, took, 2*time.Second, "before the grace")
		} else {
			require.NotContains(t, log, "stopping cleanly")
			require.GreaterOrEqual(t, took, 2*time.Second, "SIGKILL comes after the 2 s grace")
			require.Less(t, took, 20*time.Second)
		}
	}
	j3, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: polite, Entrypoint: "s.py"})
	require.NoError(t, err, "cancelled jobs free their slots")
	_, err = f.api.CancelJob(wsCtx(t, "ws-a"), &loopsv1.CancelJobRequest{Id: j3.GetId()})
	require.NoError(t, err)
}

// waitFor long-polls a job's log until it holds want.
func waitFor(t *testing.T, s *client, ws, id, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		res, err := s.ReadJobLogs(wsCtx(t, ws), &loopsv1.ReadJobLogsRequest{Id: id, WaitSeconds: 1})
		require.NoError(t, err)
		if strings.Contains(string(res.GetData()), want) {
			return
		}
	}
	t.Fatalf("job %s never printed %q", id, want)
}

// A job over its wall time is stopped and failed with the reason; its log is capped. The wall
// time (8 s) leaves room for Python to start in the sandbox and print on a loaded CI machine
// under -race: at 1 s it sometimes ran out before the first line was written.
func TestJobsWallTimeAndLogCap(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	j, err := submit(t, f.api, "ws-short", &loopsv1.SubmitJobRequest{
		Archive: tarball(t, false, map[string]string{"s.py": "import time\nprint('x' * 10000, flush=True)\ntime.sleep(600)\n"}), Entrypoint: "s.py",
	})
	require.NoError(t, err)
	log, end := wait(t, f.api, "ws-short", j.GetId())
	require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, end.GetState())
	require.Contains(t, end.GetReason(), "wall time of 8s ran out (max_job_seconds)")
	require.Contains(t, log, "the log reached its 4096-byte cap")
	require.Less(t, len(log), 4096+400)
}

// Gateway shutdown stops running jobs and records them cancelled; a job left running by a
// process that died is marked failed when the service starts again.
func TestJobsShutdownAndRestart(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	j, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: tarball(t, false, map[string]string{"s.py": "import time\nprint('up', flush=True)\ntime.sleep(600)\n"}), Entrypoint: "s.py"})
	require.NoError(t, err)
	waitFor(t, f.api, "ws-a", j.GetId(), "up\n")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, f.svc.Close(ctx))
	rec, err := st.GetJob(t.Context(), "ws-a", j.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.JobState_JOB_STATE_CANCELLED, rec.GetState())
	require.Equal(t, "the gateway shut down", rec.GetReason())
	_, err = submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Recipe: "sft_chat"})
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))

	// A crash: the record says running, nothing runs it.
	crashed := &loopsv1.Job{Id: "job-00000000000000aa", State: loopsv1.JobState_JOB_STATE_RUNNING, Entrypoint: "s.py"}
	require.NoError(t, st.PutJob(t.Context(), "ws-a", crashed))
	f2 := newFixture(t, dir, st)
	res, err := f2.api.GetJob(wsCtx(t, "ws-a"), &loopsv1.GetJobRequest{Id: crashed.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, res.GetState())
	require.Equal(t, ReasonRestarted, res.GetReason())
}

// Bad submissions get InvalidArgument saying what was wrong.
func TestSubmitValidation(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st, func(o *Options) { o.Recipes = []string{"sft_chat", "dpo"} })
	ok := tarball(t, false, map[string]string{"a.py": "print(1)"})
	for name, c := range map[string]struct {
		m    *loopsv1.SubmitJobRequest
		want string
	}{
		"neither":        {&loopsv1.SubmitJobRequest{}, "exactly one of entrypoint"},
		"both":           {&loopsv1.SubmitJobRequest{Recipe: "sft_chat", Entrypoint: "a.py", Archive: ok}, "exactly one of entrypoint"},
		"bad recipe":     {&loopsv1.SubmitJobRequest{Recipe: "../x"}, "not a recipe name"},
		"unknown recipe": {&loopsv1.SubmitJobRequest{Recipe: "sft_chta"}, `unknown recipe "sft_chta": this server's cookbook has sft_chat, dpo`},
		"no archive":     {&loopsv1.SubmitJobRequest{Entrypoint: "a.py"}, "needs the archive"},
		"escape":         {&loopsv1.SubmitJobRequest{Entrypoint: "../a.py", Archive: ok}, "'..'"},
		"missing script": {&loopsv1.SubmitJobRequest{Entrypoint: "b.py", Archive: ok}, "not a file of the archive"},
		"not tar":        {&loopsv1.SubmitJobRequest{Entrypoint: "a.py", Archive: []byte("hello, this is not a tar archive at all, but long enough to look like one")}, "not a readable tar"},
		"traversal":      {&loopsv1.SubmitJobRequest{Entrypoint: "a.py", Archive: tarball(t, false, map[string]string{"../../x.py": "x"})}, "'..'"},
		"nul arg":        {&loopsv1.SubmitJobRequest{Recipe: "sft_chat", Args: []string{"a\x00b"}}, "NUL"},
	} {
		_, err := submit(t, f.api, "ws-a", c.m)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), name)
		require.ErrorContains(t, err, c.want, name)
	}
	require.Empty(t, f.svc.running, "refused submissions hold no slot")
}

// client calls the service over Connect, through the gateway's key middleware, with the
// key of the workspace its context names (wsCtx).
type client struct {
	c loopsv1connect.JobServiceClient
}

func keyOf(ws string) string { return "tml-key-" + ws }

func keyed(ctx context.Context) context.Context {
	ctx, ci := connect.NewClientContext(ctx)
	ci.RequestHeader().Set(auth.HeaderName, keyOf(auth.Workspace(ctx)))
	return ctx
}

func (c *client) SubmitJob(ctx context.Context, m *loopsv1.SubmitJobRequest) (*loopsv1.Job, error) {
	return c.c.SubmitJob(keyed(ctx), m)
}
func (c *client) GetJob(ctx context.Context, m *loopsv1.GetJobRequest) (*loopsv1.Job, error) {
	return c.c.GetJob(keyed(ctx), m)
}
func (c *client) ListJobs(ctx context.Context, m *loopsv1.ListJobsRequest) (*loopsv1.ListJobsResponse, error) {
	return c.c.ListJobs(keyed(ctx), m)
}
func (c *client) CancelJob(ctx context.Context, m *loopsv1.CancelJobRequest) (*loopsv1.Job, error) {
	return c.c.CancelJob(keyed(ctx), m)
}
func (c *client) ReadJobLogs(ctx context.Context, m *loopsv1.ReadJobLogsRequest) (*loopsv1.ReadJobLogsResponse, error) {
	return c.c.ReadJobLogs(keyed(ctx), m)
}

// serve puts the service behind the key middleware on a test server.
func serve(t *testing.T, svc *Service) *client {
	var entries []string
	for _, ws := range []string{"ws-a", "ws-b", "ws-other", "ws-short", "ws-mem", "ws-small"} {
		entries = append(entries, keyOf(ws)+"="+ws)
	}
	keys, err := auth.ParseKeys(entries)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(loopsv1connect.NewJobServiceHandler(svc))
	srv := httptest.NewServer(keys.Middleware(auth.Policy{}, mux))
	t.Cleanup(srv.Close)
	return &client{loopsv1connect.NewJobServiceClient(srv.Client(), srv.URL)}
}

// A workspace keeps its newest MaxKeptJobs jobs (3 here): older finished ones go, record and
// log, when a job ends.
func TestJobsRetention(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	f := newFixture(t, dir, st)
	var ids []string
	for i := range 5 {
		j, err := submit(t, f.api, "ws-b", &loopsv1.SubmitJobRequest{Archive: tarball(t, false, map[string]string{"a.py": fmt.Sprintf("print(%d)", i)}), Entrypoint: "a.py"})
		require.NoError(t, err)
		wait(t, f.api, "ws-b", j.GetId())
		ids = append(ids, j.GetId())
		time.Sleep(10 * time.Millisecond) // distinct create times
	}
	require.Eventually(t, func() bool {
		list, err := f.api.ListJobs(wsCtx(t, "ws-b"), &loopsv1.ListJobsRequest{})
		return err == nil && len(list.GetJobs()) == 3
	}, 10*time.Second, 20*time.Millisecond)
	list, err := f.api.ListJobs(wsCtx(t, "ws-b"), &loopsv1.ListJobsRequest{})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[3], ids[2]}, []string{list.GetJobs()[0].GetId(), list.GetJobs()[1].GetId(), list.GetJobs()[2].GetId()})
	for _, id := range ids[:2] {
		_, err := os.Stat(filepath.Join(dir, "jobs", id))
		require.True(t, os.IsNotExist(err), "%s's folder and log are gone", id)
	}
	_, err = os.Stat(filepath.Join(dir, "jobs", ids[2], "log"))
	require.NoError(t, err)
}

// An upload's mistakes are client errors that name the entry, never the data dir: a file
// then a folder of the same name, a file where a folder is needed.
func TestUnpackConflicts(t *testing.T) {
	for name, entries := range map[string][]tarEntry{
		"file then folder":          {{"a", tar.TypeReg, "x"}, {"a/", tar.TypeDir, ""}},
		"file then file below it":   {{"a", tar.TypeReg, "x"}, {"a/b", tar.TypeReg, "y"}},
		"file then folder below it": {{"a", tar.TypeReg, "x"}, {"a/b/", tar.TypeDir, ""}},
		"folder then file":          {{"a/", tar.TypeDir, ""}, {"a", tar.TypeReg, "x"}},
		"file twice":                {{"a", tar.TypeReg, "x"}, {"a", tar.TypeReg, "y"}},
		"deep file then file":       {{"d/e/f", tar.TypeReg, "x"}, {"d/e", tar.TypeReg, "y"}},
	} {
		dir := filepath.Join(t.TempDir(), "files")
		require.NoError(t, os.Mkdir(dir, 0o755))
		err := Unpack(rawTar(t, entries), dir, 10, 1<<20)
		var ea *errArchive
		require.ErrorAs(t, err, &ea, name)
		require.NotContains(t, err.Error(), dir, "%s: the message must not show the gateway's folders", name)
		require.NotContains(t, err.Error(), "/files", name)
	}
}

// Through the API: 400 with the message, never a 500.
func TestSubmitUnpackConflictIsClientError(t *testing.T) {
	f := fixtureWith(t)
	dir := f.dir
	_, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Entrypoint: "a.py", Archive: rawTar(t, []tarEntry{{"a.py", tar.TypeReg, "x"}, {"a.py/", tar.TypeDir, ""}})})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.NotContains(t, err.Error(), dir)
	_, err = submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Entrypoint: "a.py", Archive: rawTar(t, []tarEntry{{"a.py", tar.TypeReg, "x"}, {"a.py/b", tar.TypeReg, ""}})})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.NotContains(t, err.Error(), dir)
}

type tarEntry struct {
	name string
	typ  byte
	body string
}

// rawTar builds a tar archive of the entries, in order.
func rawTar(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		} else {
			h.Mode = 0o755
		}
		require.NoError(t, tw.WriteHeader(h))
		if e.typ == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

// A gateway that died while jobs ran left their folders: the next start removes them (the
// logs stay) and marks the records failed.
func TestJobsStartupCleansLeftovers(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	id := "job-00000000000000bb"
	require.NoError(t, st.PutJob(t.Context(), "ws-a", &loopsv1.Job{Id: id, State: loopsv1.JobState_JOB_STATE_RUNNING, Entrypoint: "s.py"}))
	jd := filepath.Join(dir, "jobs", id)
	for _, sub := range []string{"files/d", "upload/d", "run"} {
		require.NoError(t, os.MkdirAll(filepath.Join(jd, sub), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(jd, "files", "d", "big"), []byte("left behind"), 0o644))
	require.NoError(t, os.Symlink("/", filepath.Join(jd, "files", "root-link")))
	require.NoError(t, os.WriteFile(filepath.Join(jd, "log"), []byte("the log\n"), 0o600))
	f := newFixture(t, dir, st)
	res, err := f.api.GetJob(wsCtx(t, "ws-a"), &loopsv1.GetJobRequest{Id: id})
	require.NoError(t, err)
	require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, res.GetState())
	for _, sub := range []string{"files", "upload", "run"} {
		_, err := os.Lstat(filepath.Join(jd, sub))
		require.ErrorIs(t, err, fs.ErrNotExist, "%s is removed at start-up", sub)
	}
	b, err := os.ReadFile(filepath.Join(jd, "log"))
	require.NoError(t, err)
	require.Equal(t, "the log\n", string(b))
}
