package jobs

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// RelayMain is the gateway binary's `loops jobs relay` (hidden), in three roles.
//
// As `relay [FLAGS] -- COMMAND...` it is the first process of a job's sandbox (its pid 1).
// It waits for the gateway's go on -gate (sent once the job is in its cgroup); under a
// root gateway, where bubblewrap leaves it root of the job's user namespace, it gives
// -job to the job's user and drops to -uid/-gid for good (its capabilities go with uid 0),
// and checks that no capability is left; it copies the upload (-upload) into -job. The
// sandbox has its own network namespace with nothing but loopback, so the job cannot reach
// any host: the relay listens on -listen (127.0.0.1 and the gateway's port) and carries
// each connection to -socket, a Unix socket the gateway bound into the sandbox for this
// job, which leads to the gateway and nothing else (at most -conns at once). It runs COMMAND through `relay limit`
// (so that the address-space limit binds the job, not the relay), reaps the orphans the
// job leaves (it is pid 1), passes SIGTERM and SIGINT on to every process of the job, and
// exits with COMMAND's status (128+signal when a signal ended it).
//
// As `relay limit -as BYTES -nproc N -nofile N -- COMMAND...` it sets those resource limits
// on itself and executes COMMAND.
//
// As `relay hold` it waits for its standard input to close: the gateway starts it in a new
// user namespace and opens that namespace meanwhile (userNamespace).
//
// It returns the exit status.
func RelayMain(args []string, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "hold":
			_, _ = io.Copy(io.Discard, os.Stdin)
			return 0
		case "limit":
			return limitMain(args[1:], stderr)
		}
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "loops relay: "+format+"\n", a...)
		return code
	}
	fl := flag.NewFlagSet("relay", flag.ContinueOnError)
	fl.SetOutput(stderr)
	listen := fl.String("listen", "", "address to listen on for the job (127.0.0.1:PORT)")
	socket := fl.String("socket", "", "the gateway's Unix socket")
	gate := fl.Int("gate", -1, "descriptor to read the gateway's go from")
	uid := fl.Int("uid", sandboxID, "the job's uid")
	gid := fl.Int("gid", sandboxID, "the job's gid")
	upload := fl.String("upload", "", "folder to copy into -job")
	job := fl.String("job", "", "the job's folder")
	limits := fl.String("limits", "", "`relay limit` flags for the command (space-separated)")
	self := fl.String("self", "", "this binary and its arguments up to the role (space-separated), to run `limit`")
	conns := fl.Int("conns", 256, "connections carried at once (more wait in the listen backlog)")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	argv := fl.Args()
	if len(argv) == 0 || *listen == "" || *socket == "" || *self == "" {
		return fail(2, "usage: relay -listen ADDR -socket PATH -self RELAY [FLAGS] -- COMMAND [ARG...]")
	}
	if *gate >= 0 {
		g := os.NewFile(uintptr(*gate), "gate")
		var b [1]byte
		n, _ := g.Read(b[:])
		_ = g.Close()
		if n != 1 {
			return fail(125, "the gateway did not start the job")
		}
	}
	if err := closeOnExec(*gate); err != nil {
		return fail(125, "%v", err)
	}
	if os.Getuid() == 0 {
		// The thread that drops the bounding set is the one that starts the job (which
		// inherits that thread's set).
		runtime.LockOSThread()
		if err := dropBoundingSet(); err != nil {
			return fail(125, "%v", err)
		}
		if *job != "" {
			if err := os.Lchown(*job, *uid, *gid); err != nil {
				return fail(125, "giving %s to the job: %v", *job, err)
			}
		}
		if err := dropToJob(*uid, *gid); err != nil {
			return fail(125, "%v", err)
		}
	}
	if os.Getuid() != *uid || os.Getgid() != *gid {
		return fail(125, "running as uid %d gid %d, not the job's %d and %d", os.Getuid(), os.Getgid(), *uid, *gid)
	}
	if err := noCapabilities(); err != nil {
		return fail(125, "%v", err)
	}
	if *upload != "" && *job != "" {
		if err := copyTree(*upload, *job); err != nil {
			return fail(125, "copying the job's files: %v", err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(125, "%v", err)
	}
	// The relay is the job's, and so is its memory: a cgroup counts it; without one, the
	// connections it carries at once bound it.
	slots := make(chan struct{}, max(*conns, 1))
	go func() {
		for {
			slots <- struct{}{}
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { <-slots }()
				splice(c, func() (net.Conn, error) { return net.Dial("unix", *socket) })
			}()
		}
	}()
	full := append(append(strings.Fields(*self), "limit"), strings.Fields(*limits)...)
	full = append(append(full, "--"), argv...)
	return runReaping(full, stderr)
}

// dropToJob makes the process (every thread) the job's user with no supplementary group.
// Leaving uid 0 clears every capability (the namespace's root is mapped, so the kernel
// treats it as root).
func dropToJob(uid, gid int) error {
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("dropping the groups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("becoming gid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("becoming uid %d: %w", uid, err)
	}
	return nil
}

// dropBoundingSet empties the calling thread's capability bounding set.
func dropBoundingSet() error {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return fmt.Errorf("reading the last capability: %w", err)
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("reading the last capability: %w", err)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// closeOnExec marks every descriptor the relay inherited (but keep) close-on-exec, so that
// the job gets none of the sandbox's set-up descriptors.
func closeOnExec(keep int) error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing the relay's descriptors: %w", err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 && fd != keep {
			syscall.CloseOnExec(fd)
		}
	}
	return nil
}

// noCapabilities checks that no thread of the process holds a capability.
func noCapabilities() error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("listing the relay's threads: %w", err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "status"))
		if err != nil {
			continue // a thread that ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, k := range []string{"CapEff:", "CapPrm:", "CapAmb:"} {
				if v, ok := strings.CutPrefix(line, k); ok && strings.Trim(strings.TrimSpace(v), "0") != "" {
					return fmt.Errorf("thread %s still holds capabilities (%s%s)", t.Name(), k, v)
				}
			}
		}
	}
	return nil
}

// copyTree copies the regular files and folders of src into dst (which exists).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			return os.Mkdir(to, 0o755)
		case info.Mode().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, info.Mode().Perm()&0o755)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, in)
			return errors.Join(err, out.Close())
		}
		return nil
	})
}

// runReaping runs argv and waits for it, reaping every other child the process inherits as
// the sandbox's pid 1, and passing SIGTERM and SIGINT on to all the job's processes.
func runReaping(argv []string, stderr io.Writer) int {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintf(stderr, "loops relay: starting %s: %v\n", argv[len(argv)-1], err)
		return 127
	}
	for s := range sig {
		if s != syscall.SIGCHLD {
			// Every process of the sandbox the relay may signal: the job's (kill(-1) spares
			// the caller).
			_ = syscall.Kill(-1, s.(syscall.Signal))
			continue
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid != p.Pid {
				continue
			}
			switch {
			case ws.Signaled():
				return 128 + int(ws.Signal())
			case ws.Exited():
				return ws.ExitStatus()
			}
		}
	}
	return 125
}

// limitMain is `relay limit`: it sets its resource limits and executes the command.
func limitMain(args []string, stderr io.Writer) int {
	fl := flag.NewFlagSet("limit", flag.ContinueOnError)
	fl.SetOutput(stderr)
	as := fl.Int64("as", 0, "address space in bytes (0: no limit)")
	nproc := fl.Int64("nproc", 0, "processes and threads of the job's user (0: no limit)")
	nofile := fl.Int64("nofile", 0, "open files (0: as it is)")
	if err := fl.Parse(args); err != nil || len(fl.Args()) == 0 {
		fmt.Fprintln(stderr, "usage: relay limit [-as BYTES] [-nproc N] [-nofile N] -- COMMAND [ARG...]")
		return 2
	}
	// A limit never rises above the hard limit the job inherited (only root could raise it).
	set := func(res int, v int64) error {
		if v <= 0 {
			return nil
		}
		var cur syscall.Rlimit
		if err := syscall.Getrlimit(res, &cur); err != nil {
			return err
		}
		return syscall.Setrlimit(res, &syscall.Rlimit{Cur: min(uint64(v), cur.Max), Max: min(uint64(v), cur.Max)})
	}
	if err := errors.Join(syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{}), set(syscall.RLIMIT_NOFILE, *nofile), set(unix.RLIMIT_NPROC, *nproc), set(syscall.RLIMIT_AS, *as)); err != nil {
		fmt.Fprintf(stderr, "loops relay: setting the job's limits: %v\n", err)
		return 125
	}
	argv := fl.Args()
	err := syscall.Exec(argv[0], argv, os.Environ())
	fmt.Fprintf(stderr, "loops relay: starting %s: %v\n", argv[0], err)
	return 127
}

// splice dials the other side and copies both ways until either side closes.
func splice(c net.Conn, dial func() (net.Conn, error)) {
	defer c.Close()
	o, err := dial()
	if err != nil {
		return
	}
	defer o.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(o, c)
	go cp(c, o)
	<-done
	<-done
}
