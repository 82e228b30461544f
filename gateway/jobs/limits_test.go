package jobs

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// Where no cgroup can bound a job (here: cgroups turned off) jobs are refused with a clear
// FailedPrecondition, unless the operator opted into weak limits.
func TestJobsRefusedWithoutLimits(t *testing.T) {
	f := fixtureWith(t, func(o *Options) { o.CgroupParent, o.WeakLimits = CgroupNone, false })
	_, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: tarball(t, false, map[string]string{"a.py": "print(1)"}), Entrypoint: "a.py"})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "%v", err)
	require.Equal(t, ReasonNoLimits, errs.Reason(err))
	require.ErrorContains(t, err, "cannot bound a job's memory")
	require.ErrorContains(t, err, "--jobs-weak-limits")
	require.ErrorContains(t, err, "--jobs-cgroup none")
	require.Empty(t, f.svc.running, "a refused job holds no slot")
	entries, err := os.ReadDir(filepath.Join(f.dir, "jobs"))
	require.NoError(t, err)
	require.Empty(t, entries, "and leaves no folder")
}

// The limits bind the job's Python (not the relay): in weak mode each process is held to
// the job's memory by RLIMIT_AS; with a cgroup there is no address-space limit (the
// cgroup's memory.max holds the job). RLIMIT_NPROC either way.
func TestJobsLimitsBindPython(t *testing.T) {
	needSandbox(t)
	script := "import resource\nprint('as', resource.getrlimit(resource.RLIMIT_AS)[0], 'nproc', resource.getrlimit(resource.RLIMIT_NPROC)[0])\n"
	f := fixtureWith(t, func(o *Options) { o.CgroupParent, o.WeakLimits = CgroupNone, true })
	log, end := runScript(t, f, "ws-small", script)
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, end.GetState(), log)
	require.Contains(t, log, fmt.Sprintf("as %d nproc 512", 300<<20))

	f = fixtureWith(t)
	if f.svc.cgroups == nil {
		if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
			t.Fatalf("a root gateway in CI must find a cgroup for jobs: %v", f.svc.noCgroups)
		}
		t.Skipf("no cgroup for jobs here: %v", f.svc.noCgroups)
	}
	log, end = runScript(t, f, "ws-small", script)
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, end.GetState(), log)
	require.Contains(t, log, "as -1 nproc 512")
}

// A job's connections: at most max open, each naming the job as its remote address; a
// closed one frees its slot.
func TestListenerBoundsConnections(t *testing.T) {
	l := NewListener(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1})
	defer l.Close()
	dir := t.TempDir()
	sock, err := listenUnix(dir, "gw.sock")
	require.NoError(t, err)
	defer sock.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go l.serveJob(ctx, sock, "job-0000000000000001", 3)
	var clients []net.Conn
	for range 5 {
		c, err := net.Dial("unix", filepath.Join(dir, "gw.sock"))
		require.NoError(t, err)
		defer c.Close()
		clients = append(clients, c)
	}
	var accepted []net.Conn
	for range 3 {
		c, err := l.Accept()
		require.NoError(t, err)
		require.Equal(t, "job-0000000000000001", c.RemoteAddr().String())
		accepted = append(accepted, c)
	}
	got := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			got <- c
		}
	}()
	select {
	case <-got:
		t.Fatal("a fourth connection was handed over while three were open")
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, accepted[0].Close())
	select {
	case c := <-got:
		require.NoError(t, c.Close())
	case <-time.After(5 * time.Second):
		t.Fatal("closing a connection did not free its slot")
	}
	require.NoError(t, l.Close())
	_, err = l.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
	_ = clients
}

// listenUnix binds however long the folder's path: a socket's path is at most 107 bytes.
func TestListenUnixLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100), strings.Repeat("e", 100))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	ln, err := listenUnix(dir, "gw.sock")
	require.NoError(t, err)
	defer ln.Close()
	fi, err := os.Lstat(filepath.Join(dir, "gw.sock"))
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket, fi.Mode().Type())
	// Reached by the relay through a short path inside the sandbox; here through the folder.
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(dir))
	defer func() { _ = os.Chdir(wd) }()
	c, err := net.Dial("unix", "gw.sock")
	require.NoError(t, err)
	require.NoError(t, c.Close())
}
