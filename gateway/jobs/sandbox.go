package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/internal/hfcache"
)

// Where things are inside a job's sandbox.
const (
	sandboxJob    = "/job"
	sandboxLoops  = "/.loops"
	sandboxRelay  = sandboxLoops + "/relay"
	sandboxUpload = sandboxLoops + "/upload"
	sandboxRun    = sandboxLoops + "/run"
	sandboxSocket = sandboxRun + "/gw.sock"
	// shmBytes is the size of a job's /dev/shm.
	shmBytes = 64 << 20
	// maxModelRepos bounds the Hugging Face model repositories bound into a job.
	maxModelRepos = 256
)

// The descriptors bubblewrap gets (exec.Cmd.ExtraFiles, in this order from 3).
const (
	fdUserNS = 3 + iota
	fdSeccomp
	fdInfo
	fdGate
)

// systemDirs are the host folders every sandbox sees read-only (when they exist).
var systemDirs = []string{"/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc/alternatives", "/etc/ssl", "/etc/ca-certificates", "/etc/localtime"}

// sandbox is one job's sandbox as bubblewrap builds it.
type sandbox struct {
	bwrap string
	// root: the gateway is root; bubblewrap then sets the sandbox up as root of the job's
	// user namespace and the relay drops to the job's user (userNamespace).
	root bool
	// upload and run are the job's host folders: its files (read-only, copied into /job
	// by the relay) and the folder of the gateway's socket.
	upload, run string
	// relay is the relay's command on the host (its first element bound into the sandbox).
	relay []string
	// binds are host folders shown read-only at the same path.
	binds []string
	// port is the gateway's port (the relay listens on 127.0.0.1:port inside); conns bounds
	// the connections the relay carries at once.
	port  string
	conns int
	// diskBytes sizes /job and /tmp; limits are `relay limit` flags for the command.
	diskBytes int64
	limits    []string
	command   []string
}

// args is bubblewrap's command line.
//
// The job gets its own user (userNamespace), pid, network, IPC, UTS and cgroup
// namespaces; a new session with no controlling terminal (no TIOCSTI into the operator's
// shell); no capability; the seccomp filter; its own /proc; a /dev of its own with only
// null, zero, full, random and urandom (no tty, no pts); size-limited tmpfs for /job, /tmp
// and /dev/shm; the system folders and binds read-only; everything else of the root
// read-only and empty. The relay is pid 1, so no process of bubblewrap's stays in the
// sandbox.
func (s *sandbox) args() []string {
	a := []string{s.bwrap, "--userns", strconv.Itoa(fdUserNS), "--cap-drop", "ALL"}
	if s.root {
		// What the relay needs to give /job to the job and drop to its user; it drops them
		// all, bounding set included, before the job starts.
		for _, c := range []string{"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_SETPCAP"} {
			a = append(a, "--cap-add", c)
		}
	} else {
		a = append(a, "--uid", strconv.Itoa(sandboxID), "--gid", strconv.Itoa(sandboxID))
	}
	a = append(a,
		"--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
		"--as-pid-1", "--die-with-parent", "--new-session", "--hostname", "loops-job",
		"--seccomp", strconv.Itoa(fdSeccomp), "--info-fd", strconv.Itoa(fdInfo),
		"--proc", "/proc",
		"--perms", "0755", "--size", "65536", "--tmpfs", "/dev",
	)
	for _, d := range []string{"null", "zero", "full", "random", "urandom"} {
		a = append(a, "--dev-bind", "/dev/"+d, "/dev/"+d)
	}
	a = append(a,
		"--symlink", "/proc/self/fd", "/dev/fd",
		"--symlink", "/proc/self/fd/0", "/dev/stdin",
		"--symlink", "/proc/self/fd/1", "/dev/stdout",
		"--symlink", "/proc/self/fd/2", "/dev/stderr",
		"--perms", "1777", "--size", strconv.Itoa(shmBytes), "--tmpfs", "/dev/shm",
		"--perms", "1777", "--size", strconv.FormatInt(s.diskBytes, 10), "--tmpfs", "/tmp",
		"--perms", "0755", "--size", strconv.FormatInt(s.diskBytes, 10), "--tmpfs", sandboxJob,
	)
	// bubblewrap makes a bind's missing parents 0700 (0.8): make them 0755 first, or the
	// job could not reach what is bound below them.
	var parents []string
	for _, b := range slices.Concat(systemDirs, s.binds, []string{sandboxUpload}) {
		for d := filepath.Dir(b); d != "/" && d != "."; d = filepath.Dir(d) {
			if !slices.Contains(parents, d) {
				parents = append(parents, d)
			}
		}
	}
	slices.SortStableFunc(parents, func(x, y string) int { return strings.Count(x, "/") - strings.Count(y, "/") })
	for _, d := range parents {
		a = append(a, "--perms", "0755", "--dir", d)
	}
	for _, p := range systemDirs {
		a = append(a, "--ro-bind-try", p, p)
	}
	for _, p := range s.binds {
		a = append(a, "--ro-bind", p, p)
	}
	a = append(a,
		"--ro-bind", s.upload, sandboxUpload,
		"--ro-bind", s.run, sandboxRun,
		"--ro-bind", s.relay[0], sandboxRelay,
		"--remount-ro", "/dev", "--remount-ro", "/",
		"--chdir", sandboxJob,
		"--", sandboxRelay)
	a = append(a, s.relay[1:]...)
	self := strings.Join(append([]string{sandboxRelay}, s.relay[1:]...), " ")
	a = append(a,
		"-listen", "127.0.0.1:"+s.port, "-socket", sandboxSocket, "-gate", strconv.Itoa(fdGate),
		"-upload", sandboxUpload, "-job", sandboxJob, "-self", self, "-limits", strings.Join(s.limits, " "),
		"-conns", strconv.Itoa(s.conns),
		"--")
	return append(a, s.command...)
}

// modelBinds returns the model repositories (models--*) of the Hugging Face hub caches:
// their snapshots, blobs (which the snapshots link to) and refs. Nothing else of a cache
// (another repository type, the token beside the hub, lock files) is bound.
func modelBinds(caches []string) []string {
	var out []string
	repos := 0
	for _, c := range caches {
		ents, err := os.ReadDir(c)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), hfcache.ModelRepoPrefix) || repos >= maxModelRepos {
				continue
			}
			repos++
			for _, sub := range []string{"snapshots", "blobs", "refs"} {
				p := filepath.Join(c, e.Name(), sub)
				if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// sandboxPipes are the pipes between the gateway and bubblewrap: the seccomp filter (read by
// bubblewrap), bubblewrap's report of the sandbox's first process (--info-fd), and the gate
// the relay waits on.
type sandboxPipes struct {
	seccompR, infoR, infoW, gateR, gateW *os.File
}

func newSandboxPipes(filter []byte) (*sandboxPipes, error) {
	p := &sandboxPipes{}
	var seccompW *os.File
	var err error
	if p.seccompR, seccompW, err = os.Pipe(); err == nil {
		// A filter is a few hundred bytes: it fits the pipe's buffer.
		_, err = seccompW.Write(filter)
		_ = seccompW.Close()
	}
	if err == nil {
		p.infoR, p.infoW, err = os.Pipe()
	}
	if err == nil {
		p.gateR, p.gateW, err = os.Pipe()
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("making the sandbox's pipes: %w", err)
	}
	return p, nil
}

// closeChildEnds closes the ends bubblewrap has (once it started).
func (p *sandboxPipes) closeChildEnds() {
	for _, f := range []*os.File{p.seccompR, p.infoW, p.gateR} {
		_ = f.Close()
	}
}

func (p *sandboxPipes) close() {
	for _, f := range []*os.File{p.seccompR, p.infoR, p.infoW, p.gateR, p.gateW} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// childPID reads bubblewrap's report and returns the host pid of the sandbox's first
// process (the relay).
func (p *sandboxPipes) childPID() (int, error) {
	_ = p.infoR.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(io.LimitReader(p.infoR, 64<<10))
	if err != nil {
		return 0, fmt.Errorf("reading bubblewrap's report: %w", err)
	}
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	if err := json.Unmarshal(b, &info); err != nil || info.ChildPID <= 0 {
		return 0, errors.New("bubblewrap did not set the sandbox up (its error is in the job's log)")
	}
	return info.ChildPID, nil
}
