package jobs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupNone is the Options.CgroupParent (--jobs-cgroup) that turns cgroups off: jobs are
// refused unless Options.WeakLimits allows running them with per-process limits only.
const CgroupNone = "none"

// The folders the gateway makes in its own cgroup when it finds one on its own (no
// Options.CgroupParent): loops-jobs holds the jobs' cgroups; under cgroup v2 the gateway
// moves itself into loops-gateway first when its cgroup holds processes, since a v2
// cgroup with processes cannot give controllers to its children.
const (
	cgroupJobsDir    = "loops-jobs"
	cgroupGatewayDir = "loops-gateway"
)

// cgroupTree is where the jobs' cgroups are made: one cgroup v2 folder whose children get
// the memory and pids controllers (and cpu when there), or the folders of the cgroup v1
// memory, pids (and cpu) hierarchies.
type cgroupTree struct {
	v2  string
	v1  map[string]string // controller -> folder
	cpu bool
	// made: the gateway made the folders (loops-jobs), and removes them when done.
	made bool
}

// cgroupFiles are where the kernel describes the cgroups (variables, for tests).
var cgroupFiles = struct{ mountinfo, self string }{"/proc/self/mountinfo", "/proc/self/cgroup"}

// mkdirCgroup makes a cgroup (the kernel fills it with its files; tests replace it).
var mkdirCgroup = func(dir string) error { return os.Mkdir(dir, 0o755) }

// v2Setup serializes setting up this process's cgroup v2 layout (it may move the process).
var v2Setup sync.Mutex

// findCgroups returns where jobs' cgroups go, or an error that says why there is none.
// parent is Options.CgroupParent: CgroupNone turns cgroups off; a folder is a cgroup v2
// cgroup delegated to the gateway (writable by its user, holding no process) whose children
// the jobs' cgroups become; empty looks on its own: the gateway's own cgroup v2 cgroup
// (moving the gateway into a loops-gateway child when needed), else the cgroup v1 memory and
// pids hierarchies where the gateway may write (as root).
func findCgroups(parent string) (*cgroupTree, error) {
	switch parent {
	case CgroupNone:
		return nil, errors.New("cgroups are turned off (--jobs-cgroup none)")
	case "":
	default:
		dir, err := setupV2(parent, true)
		if err != nil {
			return nil, err
		}
		return &cgroupTree{v2: dir, cpu: hasController(dir, "cpu")}, nil
	}
	mounts, err := os.ReadFile(cgroupFiles.mountinfo)
	if err != nil {
		return nil, fmt.Errorf("reading the mounts: %w", err)
	}
	self, err := os.ReadFile(cgroupFiles.self)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway's cgroups: %w", err)
	}
	var whyV2 error
	if dir, ok := v2Dir(string(mounts), string(self)); ok {
		jobs, err := setupV2(dir, false)
		if err == nil {
			return &cgroupTree{v2: jobs, cpu: hasController(jobs, "cpu"), made: true}, nil
		}
		whyV2 = err
	} else {
		whyV2 = errors.New("no cgroup v2 hierarchy is mounted")
	}
	v1, err := setupV1(string(mounts), string(self))
	if err == nil {
		return &cgroupTree{v1: v1, cpu: v1["cpu"] != "", made: true}, nil
	}
	return nil, fmt.Errorf("%w; and cgroup v1: %w", whyV2, err)
}

// String says which cgroups the jobs get, for the logs and the refusals.
func (t *cgroupTree) String() string {
	if t.v2 != "" {
		return "cgroup v2 under " + t.v2
	}
	var parts []string
	for _, c := range []string{"memory", "pids", "cpu"} {
		if d := t.v1[c]; d != "" {
			parts = append(parts, d)
		}
	}
	return "cgroup v1 under " + strings.Join(parts, ", ")
}

// mountinfo parses /proc/self/mountinfo into (mount point, root, fs type, super options).
func mountinfo(s string) [][4]string {
	var out [][4]string
	for _, line := range strings.Split(s, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		out = append(out, [4]string{unescapeMount(f[4]), unescapeMount(f[3]), g[0], g[2]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// selfPath returns the gateway's cgroup path in the hierarchy whose controller list (from
// /proc/self/cgroup: "ID:CONTROLLERS:PATH") matches: "" for v2.
func selfPath(self string, match func(controllers string) bool) (string, bool) {
	for _, line := range strings.Split(self, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && match(parts[1]) {
			return parts[2], true
		}
	}
	return "", false
}

// under joins a cgroup path to the folder its hierarchy is mounted on, whose own root is
// root (a cgroup namespace's mount shows "/").
func under(mount, root, path string) string {
	if root != "/" {
		path = strings.TrimPrefix(path, root)
	}
	return filepath.Join(mount, filepath.FromSlash(path))
}

// v2Dir is the gateway's own cgroup v2 folder.
func v2Dir(mounts, self string) (string, bool) {
	path, ok := selfPath(self, func(c string) bool { return c == "" })
	if !ok {
		return "", false
	}
	for _, m := range mountinfo(mounts) {
		if m[2] == "cgroup2" {
			return under(m[0], m[1], path), true
		}
	}
	return "", false
}

func hasController(dir, c string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	return err == nil && slices.Contains(strings.Fields(string(b)), c)
}

// setupV2 makes dir's children get the memory, pids (and cpu) controllers and returns the
// folder the jobs' cgroups go in: dir itself when the operator gave it (explicit), else
// dir/loops-jobs, the gateway moving itself into dir/loops-gateway first when dir holds
// processes.
func setupV2(dir string, explicit bool) (string, error) {
	v2Setup.Lock()
	defer v2Setup.Unlock()
	if !explicit && filepath.Base(dir) == cgroupGatewayDir {
		dir = filepath.Dir(dir) // this process set its cgroup up before
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return "", fmt.Errorf("%s is not a cgroup v2 folder the gateway can read: %w", dir, err)
	}
	have := strings.Fields(string(b))
	if !slices.Contains(have, "memory") || !slices.Contains(have, "pids") {
		return "", fmt.Errorf("the cgroup v2 folder %s offers the controllers %q, not memory and pids: delegate them to it (systemd: Delegate=yes on the gateway's unit; else enable them in its parents' cgroup.subtree_control)", dir, strings.Join(have, " "))
	}
	enable := "+memory +pids"
	if slices.Contains(have, "cpu") {
		enable += " +cpu"
	}
	err = writeCgroup(dir, "cgroup.subtree_control", enable)
	if err != nil && !explicit && errors.Is(err, syscall.EBUSY) {
		// dir holds processes (the gateway's own, at least): move the gateway into a leaf.
		leaf := filepath.Join(dir, cgroupGatewayDir)
		if merr := os.Mkdir(leaf, 0o755); merr != nil && !errors.Is(merr, os.ErrExist) {
			return "", fmt.Errorf("making %s: %w", leaf, merr)
		}
		if merr := writeCgroup(leaf, "cgroup.procs", strconv.Itoa(os.Getpid())); merr != nil {
			return "", fmt.Errorf("moving the gateway into %s: %w", leaf, merr)
		}
		err = writeCgroup(dir, "cgroup.subtree_control", enable)
	}
	if err != nil {
		if explicit {
			return "", fmt.Errorf("enabling %s for the children of %s: %w (the folder must hold no process, the gateway's included: give the gateway an empty cgroup of its own for jobs)", enable, dir, err)
		}
		return "", fmt.Errorf("enabling %s for the children of %s: %w (other processes share the gateway's cgroup: run it in a cgroup of its own, e.g. a systemd unit with Delegate=yes, or give --jobs-cgroup an empty delegated cgroup)", enable, dir, err)
	}
	if explicit {
		return dir, nil
	}
	jobs := filepath.Join(dir, cgroupJobsDir)
	if err := makeWritable(jobs); err != nil {
		return "", err
	}
	if err := writeCgroup(jobs, "cgroup.subtree_control", enable); err != nil {
		return "", fmt.Errorf("enabling %s for the children of %s: %w", enable, jobs, err)
	}
	return jobs, nil
}

// setupV1 returns, for the memory, pids and cpu controllers mounted as cgroup v1, the folder
// loops-jobs in the gateway's own cgroup, made when missing (root may; others rarely).
func setupV1(mounts, self string) (map[string]string, error) {
	out := map[string]string{}
	for _, c := range []string{"memory", "pids", "cpu"} {
		for _, m := range mountinfo(mounts) {
			if m[2] != "cgroup" || !slices.Contains(strings.Split(m[3], ","), c) {
				continue
			}
			path, ok := selfPath(self, func(list string) bool { return slices.Contains(strings.Split(list, ","), c) })
			if !ok {
				continue
			}
			dir := filepath.Join(under(m[0], m[1], path), cgroupJobsDir)
			if err := makeWritable(dir); err != nil {
				if c == "cpu" {
					break // optional
				}
				return nil, err
			}
			out[c] = dir
			break
		}
	}
	if out["memory"] == "" || out["pids"] == "" {
		return nil, errors.New("the memory and pids controllers are not both mounted")
	}
	return out, nil
}

// makeWritable makes the folder dir when missing and checks that the gateway may make
// cgroups in it.
func makeWritable(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("the gateway may not make cgroups in %s: %w", dir, err)
	}
	return nil
}

func writeCgroup(dir, file, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// jobCgroup is one job's cgroup (one folder under v2, one per controller under v1).
type jobCgroup struct {
	dirs []string
	v2   bool
}

// create makes a job's cgroup: memory (swap none; under v2 the whole group is killed on
// OOM), processes and an equal CPU share.
func (t *cgroupTree) create(name string, memory int64, pids int) (*jobCgroup, error) {
	c := &jobCgroup{v2: t.v2 != ""}
	set := func(dir string, settings [][2]string, optional map[string]bool) error {
		err := mkdirCgroup(dir)
		if errors.Is(err, os.ErrNotExist) && !c.v2 {
			// Another gateway process on this host released the shared loops-jobs folder
			// between its jobs (release): make it again.
			if err = makeWritable(filepath.Dir(dir)); err == nil {
				err = mkdirCgroup(dir)
			}
		}
		if err != nil {
			return fmt.Errorf("making the job's cgroup: %w", err)
		}
		c.dirs = append(c.dirs, dir)
		for _, s := range settings {
			if err := writeCgroup(dir, s[0], s[1]); err != nil && !(optional[s[0]] && errors.Is(err, os.ErrNotExist)) {
				return fmt.Errorf("setting the job's %s: %w", s[0], err)
			}
		}
		return nil
	}
	mem, n := strconv.FormatInt(memory, 10), strconv.Itoa(pids)
	var err error
	if c.v2 {
		s := [][2]string{{"memory.max", mem}, {"memory.swap.max", "0"}, {"memory.oom.group", "1"}, {"pids.max", n}}
		if t.cpu {
			s = append(s, [2]string{"cpu.weight", "100"})
		}
		err = set(filepath.Join(t.v2, name), s, map[string]bool{"memory.swap.max": true})
	} else {
		err = set(filepath.Join(t.v1["memory"], name), [][2]string{{"memory.limit_in_bytes", mem}, {"memory.memsw.limit_in_bytes", mem}}, map[string]bool{"memory.memsw.limit_in_bytes": true})
		if err == nil {
			err = set(filepath.Join(t.v1["pids"], name), [][2]string{{"pids.max", n}}, nil)
		}
		if err == nil && t.cpu {
			err = set(filepath.Join(t.v1["cpu"], name), [][2]string{{"cpu.shares", "1024"}}, nil)
		}
	}
	if err != nil {
		c.destroy()
		return nil, err
	}
	return c, nil
}

// add moves processes into the cgroup.
func (c *jobCgroup) add(pids ...int) error {
	for _, d := range c.dirs {
		for _, pid := range pids {
			if err := writeCgroup(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
				return fmt.Errorf("moving the job into its cgroup: %w", err)
			}
		}
	}
	return nil
}

// oomKilled reports whether the kernel killed a process of the cgroup for memory.
func (c *jobCgroup) oomKilled() bool {
	file := "memory.oom_control" // v1: the memory folder comes first
	if c.v2 {
		file = "memory.events"
	}
	if len(c.dirs) == 0 {
		return false
	}
	f, err := os.Open(filepath.Join(c.dirs[0], file))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "oom_kill" {
			n, _ := strconv.Atoi(v)
			return n > 0
		}
	}
	return false
}

// destroy kills what is left in the cgroup and removes it.
func (c *jobCgroup) destroy() {
	for _, d := range c.dirs {
		if c.v2 {
			_ = writeCgroup(d, "cgroup.kill", "1")
		}
		for try := 0; try < 100; try++ {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// release removes the loops-jobs folders the gateway made, once empty (another gateway
// process using them keeps them), so that they do not hold up the removal of the cgroups
// they are in.
func (t *cgroupTree) release() {
	if !t.made {
		return
	}
	for _, d := range []string{t.v2, t.v1["memory"], t.v1["pids"], t.v1["cpu"]} {
		if d != "" {
			_ = os.Remove(d)
		}
	}
}

// cgroupSweepAge is how old an empty job cgroup must be before sweep removes it: one just
// made by another gateway process sharing the tree holds no process yet (tests set 0).
var cgroupSweepAge = 2 * time.Minute

// sweep removes the empty job cgroups a previous gateway process left (it died before it
// could); those of a live gateway sharing the tree hold processes, or are younger than
// cgroupSweepAge, and stay.
func (t *cgroupTree) sweep() {
	dirs := []string{t.v2}
	if t.v2 == "" {
		dirs = []string{t.v1["memory"], t.v1["pids"], t.v1["cpu"]}
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "job-") {
				continue
			}
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < cgroupSweepAge {
				continue
			}
			_ = os.Remove(filepath.Join(d, e.Name()))
		}
	}
}
