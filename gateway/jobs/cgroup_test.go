package jobs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeCgroupFS makes a folder tree shaped like cgroupfs for the parsing and the files the
// gateway writes (the kernel's rules, such as EBUSY, are not modelled: the escape tests run
// the real thing) and points cgroupFiles at its mountinfo and /proc/self/cgroup.
func fakeCgroupFS(t *testing.T, mountinfo, self string) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
	}
	mountinfo = strings.ReplaceAll(mountinfo, "ROOT", root)
	write(filepath.Join(root, "mountinfo"), mountinfo)
	write(filepath.Join(root, "self"), self)
	old, oldMkdir := cgroupFiles, mkdirCgroup
	cgroupFiles.mountinfo, cgroupFiles.self = filepath.Join(root, "mountinfo"), filepath.Join(root, "self")
	mkdirCgroup = func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cgroup.procs", "memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "cpu.weight",
			"memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cpu.shares", "cgroup.kill"} {
			if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 0o644)
	}
	t.Cleanup(func() { cgroupFiles, mkdirCgroup = old, oldMkdir })
	return root
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(b)
}

// cgroup v2 found on its own: the gateway's cgroup gives memory, pids and cpu to
// loops-jobs, whose children are the jobs' cgroups with their limits.
func TestCgroupV2(t *testing.T) {
	root := fakeCgroupFS(t, "30 23 0:26 / ROOT/cg rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", "0::/system.slice/loops.service\n")
	own := filepath.Join(root, "cg", "system.slice", "loops.service")
	require.NoError(t, os.MkdirAll(own, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(own, "cgroup.controllers"), []byte("cpuset cpu io memory pids\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(own, "cgroup.subtree_control"), nil, 0o644))
	// The kernel makes these files in a new cgroup; here loops-jobs gets them by hand.
	jobsDir := filepath.Join(own, cgroupJobsDir)
	require.NoError(t, os.Mkdir(jobsDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(jobsDir, "cgroup.subtree_control"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(jobsDir, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644))

	tree, err := findCgroups("")
	require.NoError(t, err)
	require.Equal(t, jobsDir, tree.v2)
	require.True(t, tree.cpu)
	require.Equal(t, "+memory +pids +cpu", read(t, filepath.Join(own, "cgroup.subtree_control")))
	require.Equal(t, "+memory +pids +cpu", read(t, filepath.Join(jobsDir, "cgroup.subtree_control")))

	cg, err := tree.create("job-0000000000000001", 300<<20, 64)
	require.NoError(t, err)
	d := filepath.Join(jobsDir, "job-0000000000000001")
	require.Equal(t, fmt.Sprint(300<<20), read(t, filepath.Join(d, "memory.max")))
	require.Equal(t, "0", read(t, filepath.Join(d, "memory.swap.max")))
	require.Equal(t, "1", read(t, filepath.Join(d, "memory.oom.group")))
	require.Equal(t, "64", read(t, filepath.Join(d, "pids.max")))
	require.Equal(t, "100", read(t, filepath.Join(d, "cpu.weight")))
	require.NoError(t, cg.add(1234))
	require.Equal(t, "1234", read(t, filepath.Join(d, "cgroup.procs")))
	require.True(t, cg.oomKilled(), "memory.events counts an oom_kill")

	// A previous process's leftover is swept when empty and old; a young one (another
	// gateway's job being set up) stays.
	leftover := filepath.Join(jobsDir, "job-00000000000000ff")
	require.NoError(t, os.Mkdir(leftover, 0o755))
	tree.sweep()
	require.DirExists(t, leftover, "too young to be a leftover")
	old := time.Now().Add(-2 * cgroupSweepAge)
	require.NoError(t, os.Chtimes(leftover, old, old))
	tree.sweep()
	_, err = os.Stat(leftover)
	require.True(t, os.IsNotExist(err))
}

// An operator's delegated cgroup v2 folder: the jobs' cgroups go right under it; one
// without the memory and pids controllers is refused, saying how to delegate them.
func TestCgroupV2Explicit(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpu memory pids"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), nil, 0o644))
	tree, err := findCgroups(dir)
	require.NoError(t, err)
	require.Equal(t, dir, tree.v2)
	require.Equal(t, "cgroup v2 under "+dir, tree.String())

	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpu io"), 0o644))
	_, err = findCgroups(dir)
	require.ErrorContains(t, err, "not memory and pids")
	require.ErrorContains(t, err, "Delegate=yes")
	_, err = findCgroups(filepath.Join(dir, "missing"))
	require.ErrorContains(t, err, "not a cgroup v2 folder")
	_, err = findCgroups(CgroupNone)
	require.ErrorContains(t, err, "turned off")
}

// cgroup v1 (a hybrid host, as root): memory, pids and cpu hierarchies, each with a
// loops-jobs folder in the gateway's own cgroup.
func TestCgroupV1(t *testing.T) {
	root := fakeCgroupFS(t, strings.Join([]string{
		"32 31 0:29 / ROOT/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct",
		"35 31 0:32 / ROOT/memory rw,relatime - cgroup cgroup rw,memory",
		"39 31 0:36 / ROOT/pids rw,relatime - cgroup cgroup rw,pids",
		"41 31 0:38 / ROOT/unified rw,relatime - cgroup2 cgroup2 rw",
	}, "\n"), "8:pids:/\n4:memory:/session/abc\n1:cpu,cpuacct:/\n0::/\n")
	for _, d := range []string{"cpu", "memory/session/abc", "pids", "unified"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "unified", "cgroup.controllers"), []byte("hugetlb\n"), 0o644))
	tree, err := findCgroups("")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "memory", "session", "abc", cgroupJobsDir), tree.v1["memory"])
	require.Equal(t, filepath.Join(root, "pids", cgroupJobsDir), tree.v1["pids"])
	require.Equal(t, filepath.Join(root, "cpu", cgroupJobsDir), tree.v1["cpu"])
	cg, err := tree.create("job-0000000000000002", 256<<20, 32)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(256<<20), read(t, filepath.Join(tree.v1["memory"], "job-0000000000000002", "memory.limit_in_bytes")))
	require.Equal(t, fmt.Sprint(256<<20), read(t, filepath.Join(tree.v1["memory"], "job-0000000000000002", "memory.memsw.limit_in_bytes")))
	require.Equal(t, "32", read(t, filepath.Join(tree.v1["pids"], "job-0000000000000002", "pids.max")))
	require.Equal(t, "1024", read(t, filepath.Join(tree.v1["cpu"], "job-0000000000000002", "cpu.shares")))
	require.Len(t, cg.dirs, 3)

	// Another gateway process on the host released the shared folders between its jobs
	// (they were empty): the next job's cgroup makes them again.
	for _, d := range cg.dirs { // a real cgroup goes with rmdir; the fake's files need RemoveAll
		require.NoError(t, os.RemoveAll(d))
	}
	other := *tree
	other.made = true
	other.release()
	require.NoDirExists(t, tree.v1["pids"])
	_, err = tree.create("job-0000000000000003", 256<<20, 32)
	require.NoError(t, err, "a job still gets its cgroup")
	require.FileExists(t, filepath.Join(tree.v1["pids"], "job-0000000000000003", "pids.max"))

	// Neither v2 controllers nor v1 memory: no cgroup, and the reason names both.
	fakeCgroupFS(t, "41 31 0:38 / ROOT/unified rw,relatime - cgroup2 cgroup2 rw\n", "0::/\n")
	_, err = findCgroups("")
	require.ErrorContains(t, err, "cgroup v1: the memory and pids controllers are not both mounted")
}

func TestMountinfoUnescape(t *testing.T) {
	m := mountinfo(`36 25 0:31 / /sys/fs/cgroup/with\040space rw - cgroup2 cgroup2 rw`)
	require.Equal(t, [][4]string{{"/sys/fs/cgroup/with space", "/", "cgroup2", "rw"}}, m)
	require.Equal(t, "/mnt/x", under("/mnt", "/sub", "/sub/x"), "a mount of the hierarchy at /sub shows /sub/x at x")
}
