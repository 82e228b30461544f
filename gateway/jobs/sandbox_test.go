package jobs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The jobs escape tests: each submits a script that attacks the sandbox and checks that the
// attack failed. `make test-jobs-sandbox` runs them under a root gateway and under an
// unprivileged one.

// sandboxed is the fixture the escape tests use: small bounds, so that the attacks reach
// them quickly.
func sandboxed(t *testing.T, opts ...func(*Options)) *fixture {
	t.Helper()
	needSandbox(t)
	return fixtureWith(t, append([]func(*Options){testBounds}, opts...)...)
}

// fixtureWith is a fixture on a fresh data dir and store.
func fixtureWith(t *testing.T, opts ...func(*Options)) *fixture {
	t.Helper()
	dir := t.TempDir()
	st := openStore(t, dir)
	t.Cleanup(func() { _ = st.Close() })
	return newFixture(t, dir, st, opts...)
}

// testBounds are the escape tests' bounds: /job and /tmp of 384 MiB each (over ws-mem's
// 256 MiB of memory), 64 processes, 64 connections to the gateway.
func testBounds(o *Options) {
	o.DiskMB = 384
	o.MaxProcesses = 64
	o.MaxJobConns = 64
}

func runScript(t *testing.T, f *fixture, ws, script string, args ...string) (string, *loopsv1.Job) {
	t.Helper()
	j, err := submit(t, f.api, ws, &loopsv1.SubmitJobRequest{
		Archive: tarball(t, false, map[string]string{"s.py": script}), Entrypoint: "s.py", Args: args,
	})
	require.NoError(t, err)
	return wait(t, f.api, ws, j.GetId())
}

// cookbookDir is a folder on the jobs' PYTHONPATH, as the cookbook's source is in the gateway.
func withCookbook(dir string) func(*Options) {
	return func(o *Options) {
		o.Python = func(context.Context, io.Writer) (Python, error) {
			return Python{Exe: "/usr/bin/python3", Env: []string{"PYTHONPATH=" + dir}, Binds: []string{dir}}, nil
		}
	}
}

const escapeScript = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
cook = sys.argv[1]
payload = "import os\nprint('PLANTED' + 'CODE', os.environ.get('TINKER_API_KEY'))\n"

def check(rc):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def attempt(name, fn):
    try:
        fn()
        print(name, "WORKED", flush=True)
    except OSError as e:
        print(name, "refused", e.errno, flush=True)

def plant(path):
    with open(path, "w") as f:
        f.write(payload)

def remount(path):
    MS_REMOUNT, MS_BIND = 32, 4096
    check(libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND, None))

attempt("write-cookbook", lambda: plant(cook + "/sitecustomize.py"))
attempt("remount-cookbook", lambda: (remount(cook), plant(cook + "/sitecustomize.py")))
attempt("remount-root", lambda: (remount("/"), plant("/sitecustomize.py")))
attempt("mount-tmpfs", lambda: check(libc.mount(b"none", cook.encode(), b"tmpfs", 0, None)))
pid = os.fork()
if pid == 0:
    CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
    attempt("unshare-userns", lambda: check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)))
    attempt("userns-remount", lambda: (remount(cook), plant(cook + "/sitecustomize.py")))
    os._exit(0)
os.waitpid(pid, 0)
for p in ["/usr/sitecustomize.py", "/etc/loops-escape", "/loops-escape", "/proc/sys/kernel/hostname"]:
    attempt("write " + p, lambda p=p: plant(p))
attempt("ptrace", lambda: check(libc.ptrace(16, 1, None, None)))
attempt("keyctl", lambda: check(libc.syscall(250, 0, 0, 0, 0, 0)))
for line in open("/proc/self/status"):
    if line.startswith(("Uid:", "Gid:", "CapEff:", "CapPrm:", "CapBnd:", "NoNewPrivs:", "Seccomp:")):
        print(line.strip().replace("\t", " "), flush=True)
print("ready", flush=True)
import time
time.sleep(float(sys.argv[2]))
`

// A job cannot write the folders it shares with other jobs (the cookbook's source on
// PYTHONPATH, the venv, the system), neither directly nor by remounting them, nor in a user
// namespace of its own; it runs as an unprivileged, unmapped host user with no capabilities,
// no_new_privs and a seccomp filter. The next job of another workspace runs unchanged (a
// planted sitecustomize.py would hand it that workspace's key).
func TestSandboxSharedFoldersReadOnly(t *testing.T) {
	cook := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cook, "loops_cookbook_marker.py"), []byte("X = 1\n"), 0o644))
	f := sandboxed(t, withCookbook(cook))
	marker := fmt.Sprintf("escape-%d", time.Now().UnixNano())
	j, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{
		Archive: tarball(t, false, map[string]string{"s.py": escapeScript}), Entrypoint: "s.py", Args: []string{cook, "30", marker},
	})
	require.NoError(t, err)
	waitFor(t, f.api, "ws-a", j.GetId(), "ready\n")
	// The job's processes, seen from the host: never root, never the gateway's user when the
	// gateway is root.
	uids := hostUIDs(t, marker)
	require.NotEmpty(t, uids, "the job's processes are visible on the host")
	for _, uid := range uids {
		if os.Geteuid() == 0 {
			require.NotZero(t, uid, "a job under a root gateway runs as an unprivileged host user")
		} else {
			require.Equal(t, os.Geteuid(), uid, "a job under an unprivileged gateway runs as the gateway's own (unprivileged) user")
		}
	}
	_, err = f.api.CancelJob(wsCtx(t, "ws-a"), &loopsv1.CancelJobRequest{Id: j.GetId()})
	require.NoError(t, err)
	log, _ := wait(t, f.api, "ws-a", j.GetId())
	t.Log(log)
	require.NotContains(t, log, "WORKED")
	for _, want := range []string{"write-cookbook refused", "remount-cookbook refused", "remount-root refused", "mount-tmpfs refused",
		"unshare-userns refused", "userns-remount refused", "ptrace refused", "keyctl refused",
		"CapEff: 0000000000000000", "CapPrm: 0000000000000000", "CapBnd: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2"} {
		require.Contains(t, log, want)
	}
	_, err = os.Stat(filepath.Join(cook, "sitecustomize.py"))
	require.ErrorIs(t, err, fs.ErrNotExist, "nothing was planted in the shared folder")

	log, end := runScript(t, f, "ws-b", "import loops_cookbook_marker\nprint('second job ran')\n")
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, end.GetState(), log)
	require.Contains(t, log, "second job ran")
	require.NotContains(t, log, "PLANTEDCODE")
}

// hostUIDs returns the real uids of the host's processes whose command line holds marker.
func hostUIDs(t *testing.T, marker string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var uids []int
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) || bytes.Contains(cmdline, []byte("bwrap")) {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				uid, err := strconv.Atoi(strings.Fields(rest)[0])
				require.NoError(t, err)
				uids = append(uids, uid)
			}
		}
	}
	return uids
}

// A job sees none of another job's files (its /job, its /tmp, its processes) and none of the
// gateway owner's: the data dir, the Hugging Face token (only model snapshots of the cache
// are bound in).
func TestSandboxCannotReadOthersFiles(t *testing.T) {
	hf := t.TempDir()
	hub := filepath.Join(hf, "hub")
	repo := filepath.Join(hub, "models--org--model")
	for _, d := range []string{"blobs", "refs", "snapshots/rev1", "../datasets--org--private/snapshots/rev1"} {
		require.NoError(t, os.MkdirAll(filepath.Join(repo, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(hf, "token"), []byte("hf_OWNER_SECRET_TOKEN"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(hf, "stored_tokens"), []byte("[t]\nhf_token = hf_OWNER_SECRET_TOKEN\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "blobs", "abc"), []byte(`{"model_type": "tiny"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "refs", "main"), []byte("rev1"), 0o644))
	require.NoError(t, os.Symlink("../../blobs/abc", filepath.Join(repo, "snapshots", "rev1", "config.json")))
	require.NoError(t, os.WriteFile(filepath.Join(hub, "datasets--org--private", "snapshots", "rev1", "data.txt"), []byte("PRIVATE DATASET"), 0o644))
	f := sandboxed(t, withHFHome(hf))

	holder, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{
		Archive:    tarball(t, false, map[string]string{"s.py": "import time\nopen('/job/secret','w').write('JOB_A_SECRET')\nopen('/tmp/secret','w').write('JOB_A_SECRET')\nprint('ready', flush=True)\ntime.sleep(60)\n"}),
		Entrypoint: "s.py",
	})
	require.NoError(t, err)
	waitFor(t, f.api, "ws-a", holder.GetId(), "ready\n")

	script := `
import glob, os, sys
def show(path):
    try:
        with open(path) as f:
            print("READ", path, f.read(100).replace("\n", " "))
    except OSError as e:
        print("unreadable", path, e.errno)
for p in sys.argv[1:]:
    show(p)
for p in glob.glob("/proc/*/root/job/secret") + glob.glob("/proc/*/cwd/secret") + ["/tmp/secret", "/job/secret"]:
    show(p)
hub = os.environ.get("HF_HOME", "") + "/hub"
show(hub + "/models--org--model/snapshots/rev1/config.json")
print("hub lists", sorted(os.listdir(hub)) if os.path.isdir(hub) else None)
`
	log, end := runScript(t, f, "ws-b", script,
		filepath.Join(f.dir, "jobs", holder.GetId(), "files", "secret"),
		filepath.Join(f.dir, "loops.db"),
		filepath.Join(hf, "token"),
		filepath.Join(hf, "stored_tokens"),
		filepath.Join(hub, "datasets--org--private", "snapshots", "rev1", "data.txt"),
	)
	t.Log(log)
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, end.GetState(), log)
	require.NotContains(t, log, "JOB_A_SECRET")
	require.NotContains(t, log, "hf_OWNER_SECRET_TOKEN")
	require.NotContains(t, log, "PRIVATE DATASET")
	require.NotContains(t, log, "READ "+filepath.Join(f.dir, "loops.db"))
	require.Contains(t, log, `READ `+hub+`/models--org--model/snapshots/rev1/config.json {"model_type": "tiny"}`, "model snapshots stay readable (tokenizers)")
	require.Contains(t, log, "hub lists ['models--org--model']")
	_, err = f.api.CancelJob(wsCtx(t, "ws-a"), &loopsv1.CancelJobRequest{Id: holder.GetId()})
	require.NoError(t, err)
}

// What a job writes never reaches the host's disk: the gateway never reads or removes a file
// a job made (links, setuid bits, foreign owners), and the data dir does not grow.
func TestSandboxWritesStayInTheSandbox(t *testing.T) {
	f := sandboxed(t)
	sentinel := filepath.Join(t.TempDir(), "sentinel")
	require.NoError(t, os.WriteFile(sentinel, []byte("keep"), 0o644))
	script := `
import os, sys, time
os.symlink(sys.argv[1], "/job/link-to-host")
os.symlink("/", "/job/link-to-root")
open("/job/written-by-job", "w").write("x")
os.link("/job/written-by-job", "/job/hardlink")
os.chmod("/job/written-by-job", 0o4777)
os.mkdir("/job/sub")
os.symlink(os.path.dirname(sys.argv[1]), "/job/sub/dir-link")
print("ready", flush=True)
time.sleep(60)
`
	j, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{
		Archive: tarball(t, false, map[string]string{"s.py": script}), Entrypoint: "s.py", Args: []string{sentinel},
	})
	require.NoError(t, err)
	waitFor(t, f.api, "ws-a", j.GetId(), "ready\n")
	require.NoError(t, filepath.WalkDir(f.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		require.NotContains(t, []string{"written-by-job", "link-to-host", "link-to-root", "hardlink", "dir-link"}, d.Name(), "%s: a job's file is on the host's disk", p)
		return nil
	}))
	_, err = f.api.CancelJob(wsCtx(t, "ws-a"), &loopsv1.CancelJobRequest{Id: j.GetId()})
	require.NoError(t, err)
	wait(t, f.api, "ws-a", j.GetId())
	b, err := os.ReadFile(sentinel)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))
}

// A fork bomb stops at the job's process limit.
func TestSandboxForkBombBounded(t *testing.T) {
	f := sandboxed(t)
	script := `
import os, signal, time
pids, err = [], None
try:
    while len(pids) < 400:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
except OSError as e:
    err = e.errno
print("forked", len(pids), "errno", err, flush=True)
for p in pids:
    os.kill(p, signal.SIGKILL)
for p in pids:
    os.waitpid(p, 0)
`
	log, _ := runScript(t, f, "ws-a", script)
	t.Log(log)
	require.Contains(t, log, "errno 11", "fork fails with EAGAIN at the limit")
	var n int
	_, err := fmt.Sscanf(log[strings.Index(log, "forked "):], "forked %d", &n)
	require.NoError(t, err)
	require.Less(t, n, 64, "MaxProcesses is 64, the job's threads and the relay's included")
}

// fillScript writes FILE 16 MiB at a time up to MIB MiB, saying how far it got.
const fillScript = `
import sys
path, most = sys.argv[1], int(sys.argv[2])
mb = 0
chunk = b"x" * (16 << 20)
try:
    with open(path, "wb") as f:
        while mb < most:
            f.write(chunk)
            f.flush()
            mb += 16
            print("wrote", mb, flush=True)
except OSError as e:
    print("stopped", mb, "errno", e.errno, flush=True)
print("done", mb, flush=True)
`

// Memory held in the job's tmpfs counts: with a cgroup, against the job's memory limit
// (the job is killed); without one (weak mode), /tmp's size bounds it.
func TestSandboxTmpfsMemoryBounded(t *testing.T) {
	f := sandboxed(t)
	log, end := runScript(t, f, "ws-mem", fillScript, "/tmp/fill", "768")
	t.Log(log)
	require.Contains(t, log, "wrote 16\n", "the job ran")
	require.NotContains(t, log, "done 768", "256 MiB of memory cannot hold 768 MiB in /tmp")
	checkTmpfsBound(t, f, log, end)
}

func checkTmpfsBound(t *testing.T, f *fixture, log string, end *loopsv1.Job) {
	t.Helper()
	if f.svc.cgroups != nil {
		require.Equal(t, loopsv1.JobState_JOB_STATE_FAILED, end.GetState())
		require.Contains(t, end.GetReason(), "over its memory limit of 256 MiB")
		require.NotContains(t, log, "wrote 272\n", "killed at its memory limit")
		return
	}
	// Weak limits: /tmp's size bounds it.
	require.Contains(t, log, "stopped 384 errno 28")
}

// Filling /job stops at its size; the data dir's disk does not fill.
func TestSandboxDiskBounded(t *testing.T) {
	f := sandboxed(t)
	log, _ := runScript(t, f, "ws-a", fillScript, "/job/fill", "512")
	t.Log(log)
	require.NotContains(t, log, "done 512")
	require.Contains(t, log, "errno 28", "ENOSPC at /job's size")
	var size int64
	require.NoError(t, filepath.WalkDir(f.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				size += info.Size()
			}
		}
		return err
	}))
	require.Less(t, size, int64(16<<20), "the data dir did not take what the job wrote")
}

// A job's requests reach the gateway as a job's, never as an operator's, although they
// come from this host: in open mode a loopback peer is an operator.
func TestSandboxRequestsAreNotOperators(t *testing.T) {
	f := sandboxed(t)
	script := `
import os, urllib.request
url = os.environ["TINKER_BASE_URL"]
req = urllib.request.Request(url + "/whoami", headers={"X-Api-Key": os.environ["TINKER_API_KEY"]})
print("gateway says:", urllib.request.urlopen(req, timeout=10).read().decode(), flush=True)
`
	log, _ := runScript(t, f, "ws-a", script)
	require.Contains(t, log, "gateway says: operator=false", log)
}

// The connections a job opens to the gateway are bounded: each costs the gateway one
// descriptor, at most MaxJobConns at once (more wait in the socket's backlog), and the
// gateway's server closes those that send nothing.
func TestSandboxRelayConnectionsBounded(t *testing.T) {
	f := sandboxed(t)
	script := `
import os, socket, time
port = int(os.environ["TINKER_BASE_URL"].rsplit(":", 1)[1])
conns = []
for i in range(200):
    try:
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError as e:
        print("connect", i, "failed", e, flush=True)
        break
print("holding", len(conns), flush=True)
time.sleep(60)
`
	before := openFDs(t)
	j, err := submit(t, f.api, "ws-a", &loopsv1.SubmitJobRequest{Archive: tarball(t, false, map[string]string{"s.py": script}), Entrypoint: "s.py"})
	require.NoError(t, err)
	waitFor(t, f.api, "ws-a", j.GetId(), "holding 200")
	most := 0
	sample := func() int {
		n := openFDs(t) - before
		most = max(most, n)
		return n
	}
	require.Eventually(t, func() bool { return sample() > 32 }, 20*time.Second, 20*time.Millisecond, "the job's connections reach the gateway")
	// The fixture's server closes a connection that sends no request after 1 s: the 200
	// go through 64 at a time, then none is left but the running job's own descriptors
	// (its log, pipes, socket).
	require.Eventually(t, func() bool { return sample() < 12 }, 30*time.Second, 20*time.Millisecond, "idle connections are closed")
	t.Logf("gateway descriptors: %d before, at most %d more while the job held 200 idle connections", before, most)
	require.LessOrEqual(t, most, 64+12, "at most MaxJobConns connections, one descriptor each")
	_, err = f.api.CancelJob(wsCtx(t, "ws-a"), &loopsv1.CancelJobRequest{Id: j.GetId()})
	require.NoError(t, err)
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// A small memory limit bounds the job's Python, not the relay in front of it: a job with
// max_job_memory_mb: 300 runs.
func TestSandboxSmallMemoryLimitRuns(t *testing.T) {
	f := sandboxed(t)
	log, end := runScript(t, f, "ws-small", "print('small job ran')\n")
	require.Equal(t, loopsv1.JobState_JOB_STATE_SUCCEEDED, end.GetState(), log)
	require.Contains(t, log, "small job ran")
}

// A job cannot type into the operator's terminal (TIOCSTI): it runs in a session of its own
// with no controlling terminal and stdin on /dev/null. The gateway runs in a child process
// whose controlling terminal is a pty; what the job injects would be echoed on it.
func TestSandboxNoTerminalInjection(t *testing.T) {
	needSandbox(t)
	master, slave := openPTY(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestTTYGateway$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOOPS_TEST_TTY_GATEWAY=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	_ = slave.Close()
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, master); close(copied) }()
	werr := cmd.Wait()
	_ = master.SetReadDeadline(time.Now().Add(2 * time.Second))
	<-copied
	t.Log(out.String())
	require.NoError(t, werr)
	require.Contains(t, out.String(), "tty gateway: job ended")
	require.NotContains(t, out.String(), "LOOPS_INJECTED_42", "the job typed into the gateway's terminal")
	require.NotContains(t, out.String(), "WORKED")
	require.Contains(t, out.String(), "/dev/tty refused 2", "the sandbox has no /dev/tty")
	require.Contains(t, out.String(), "tiocsti 0 refused 1", "the seccomp filter refuses TIOCSTI (EPERM)")
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
		require.Contains(t, out.String(), "tiocsti-high refused 1", "with high bits set in the request too")
	}
}

// TestTTYGateway is TestSandboxNoTerminalInjection's gateway, in a process whose controlling
// terminal is a pty.
func TestTTYGateway(t *testing.T) {
	if os.Getenv("LOOPS_TEST_TTY_GATEWAY") != "1" {
		t.Skip("the gateway half of TestSandboxNoTerminalInjection")
	}
	f := sandboxed(t)
	script := `
import fcntl, os, termios
text = "echo LOOPS_" + "INJECTED_42\n"
def inject(name, fd):
    try:
        for c in text:
            fcntl.ioctl(fd, termios.TIOCSTI, c.encode())
        print("tiocsti", name, "WORKED", flush=True)
    except OSError as e:
        print("tiocsti", name, "refused", e.errno, flush=True)
try:
    fd = os.open("/dev/tty", os.O_RDWR)
    inject("/dev/tty", fd)
except OSError as e:
    print("/dev/tty", "refused", e.errno, flush=True)
for fd in (0, 1, 2):
    inject(str(fd), fd)
# The kernel reads the request's low 32 bits: the filter must too.
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": 16, "aarch64": 29}.get(platform.machine())
if nr is not None:
    c = ctypes.c_char(b"x")
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_ulong(0xffffffff00000000 | termios.TIOCSTI), ctypes.byref(c))
    print("tiocsti-high", "WORKED" if rc == 0 else "refused", ctypes.get_errno(), flush=True)
print("sid", os.getsid(0), "pid", os.getpid(), flush=True)
`
	log, _ := runScript(t, f, "ws-a", script)
	fmt.Println(strings.ReplaceAll(log, "INJECTED", "injected"))
	fmt.Println("tty gateway: job ended")
}

func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	require.NoError(t, unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(); _ = s.Close() })
	return m, s
}

// withHFHome gives jobs the Hugging Face cache hf, as the gateway does.
func withHFHome(hf string) func(*Options) {
	return func(o *Options) {
		o.ModelCaches = append(o.ModelCaches, filepath.Join(hf, "hub"))
		o.Env = append(o.Env, "HF_HOME="+hf)
	}
}
