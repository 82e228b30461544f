package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// Defaults of Options and of a workspace's job quotas (policy: 0 takes these).
const (
	DefaultMaxRunningJobs = 2
	DefaultMaxRunningAll  = 8
	DefaultJobSeconds     = 3600
	DefaultJobMemoryMB    = 8192
	DefaultGrace          = 10 * time.Second
	DefaultMaxKeptJobs    = 100
	maxArgs               = 64
	maxArgBytes           = 4096
	maxReadBytes          = 1 << 20
	maxWaitSeconds        = 60
)

// Reasons of the service's errors (google.rpc.ErrorInfo).
const (
	// ReasonJobsNotAllowed: the workspace's policy does not set allow_jobs (403).
	ReasonJobsNotAllowed = "JOBS_NOT_ALLOWED"
	// ReasonJobQuota: the workspace (or the server) runs as many jobs as it may (429).
	ReasonJobQuota = "JOB_QUOTA"
)

// ReasonRestarted is the reason of a job that was running when its gateway stopped without
// stopping it (a crash or a kill), written when the gateway starts again.
const ReasonRestarted = "the gateway stopped while the job ran (it was not shut down cleanly): submit it again"

// Python is the interpreter jobs run with: for a script `Exe SCRIPT ARGS...`, for a recipe
// `Exe -m loops_cookbook run RECIPE ARGS...`. Env is added to the job's environment; Binds
// are host folders the sandbox shows read-only at the same path (the venv, the cookbook's
// source).
type Python struct {
	Exe   string
	Env   []string
	Binds []string
}

// Options configure a Service.
type Options struct {
	// Dir holds the jobs' folders and logs (the gateway uses DATA_DIR/jobs).
	Dir string
	// Store keeps the job records.
	Store store.JobStore
	// Policy gives each workspace's allow_jobs and quotas (nil: no workspace may run jobs).
	Policy *policy.Policy
	// Gateway is the gateway's listening address (host:port); jobs reach it through their
	// relay and see TINKER_BASE_URL=http://127.0.0.1:PORT.
	Gateway string
	// Python prepares the interpreter (called in the job, its output to the job's log).
	Python func(ctx context.Context, log io.Writer) (Python, error)
	// Relay is the command that runs RelayMain (its first element a host path, bound into
	// the sandbox): the gateway uses its own binary and `jobs relay`.
	Relay []string
	// RelayEnv is added to the relay's environment (tests use it to select RelayMain).
	RelayEnv []string
	// Binds are host folders every job sees read-only at the same path (base models'
	// files, for their tokenizers), and Env is added to every job's environment.
	Binds []string
	Env   []string
	// Bwrap is the bubblewrap binary (default: bwrap from PATH). Jobs are refused when it
	// is missing: they never run outside a sandbox.
	Bwrap string
	// MaxArchiveBytes, MaxUnpackedBytes, MaxFiles cap an upload; MaxLogBytes a job's log;
	// MaxRunningAll the jobs running on this gateway, all workspaces together. Zero values
	// take the Default* constants.
	MaxArchiveBytes  int64
	MaxUnpackedBytes int64
	MaxFiles         int
	MaxLogBytes      int64
	MaxRunningAll    int
	// MaxKeptJobs is how many jobs a workspace keeps, records and logs (default 100): when
	// a job ends, the workspace's older finished jobs past that many are deleted.
	MaxKeptJobs int
	// Grace is how long a stopped job has between SIGTERM and SIGKILL (default 10 s).
	Grace time.Duration
	// Logger receives the service's logs (default slog.Default()).
	Logger *slog.Logger
}

// Service runs jobs and answers loops.v1 JobService. Close stops every running job.
type Service struct {
	loopsv1connect.UnimplementedJobServiceHandler
	o Options

	mu      sync.Mutex
	running map[string]*run // job id -> its run
	perWS   map[string]int  // workspace -> jobs running
	closed  bool
	wg      sync.WaitGroup
}

// run is a running job.
type run struct {
	ws     string
	job    *loopsv1.Job // guarded by Service.mu
	log    *logFile
	cancel context.CancelCauseFunc
	done   chan struct{}
}

var errCancelled = errors.New("cancelled")

// New returns a Service, first marking the jobs a previous process left running as failed
// (ReasonRestarted).
func New(ctx context.Context, o Options) (*Service, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxArchiveBytes, DefaultMaxArchiveBytes)
	def(&o.MaxUnpackedBytes, DefaultMaxUnpackedBytes)
	def(&o.MaxLogBytes, DefaultMaxLogBytes)
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.MaxRunningAll <= 0 {
		o.MaxRunningAll = DefaultMaxRunningAll
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.MaxKeptJobs <= 0 {
		o.MaxKeptJobs = DefaultMaxKeptJobs
	}
	if o.Dir == "" || o.Store == nil {
		return nil, errors.New("jobs: Dir and Store are required")
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	n, err := o.Store.FailRunningJobs(ctx, ReasonRestarted, time.Now())
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	if n > 0 {
		o.Logger.Warn("jobs left running by the previous gateway process are marked failed", slog.Int("jobs", n))
	}
	return &Service{o: o, running: map[string]*run{}, perWS: map[string]int{}}, nil
}

// quotas are a workspace's effective job limits.
type quotas struct {
	running  int
	wall     time.Duration
	memoryMB int
}

func (s *Service) quotas(l policy.Limits) quotas {
	q := quotas{running: l.MaxRunningJobs, wall: time.Duration(l.MaxJobSeconds) * time.Second, memoryMB: l.MaxJobMemoryMB}
	if q.running <= 0 {
		q.running = DefaultMaxRunningJobs
	}
	if q.wall <= 0 {
		q.wall = DefaultJobSeconds * time.Second
	}
	if q.memoryMB <= 0 {
		q.memoryMB = DefaultJobMemoryMB
	}
	return q
}

var recipeName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// validate checks a submit request's fields (not the archive's contents).
func (s *Service) validate(m *loopsv1.SubmitJobRequest) error {
	if (m.GetEntrypoint() == "") == (m.GetRecipe() == "") {
		return invalid("give exactly one of entrypoint (a script in the archive) and recipe (a cookbook recipe)")
	}
	if m.GetRecipe() != "" && !recipeName.MatchString(m.GetRecipe()) {
		return invalid("recipe %.80q is not a recipe name (lower-case letters, digits and '_'; `loops cookbook list` lists them)", m.GetRecipe())
	}
	if m.GetEntrypoint() != "" {
		if _, err := CleanPath(m.GetEntrypoint()); err != nil {
			return invalid("entrypoint: %v", err)
		}
		if len(m.GetArchive()) == 0 {
			return invalid("entrypoint %q needs the archive that holds it", m.GetEntrypoint())
		}
	}
	if int64(len(m.GetArchive())) > s.o.MaxArchiveBytes {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("archive is %d bytes, over the %d-byte cap: upload less", len(m.GetArchive()), s.o.MaxArchiveBytes))
	}
	if len(m.GetArgs()) > maxArgs {
		return invalid("%d args, over the %d allowed", len(m.GetArgs()), maxArgs)
	}
	for i, a := range m.GetArgs() {
		if len(a) > maxArgBytes {
			return invalid("args[%d] is %d bytes, over %d", i, len(a), maxArgBytes)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("args[%d] holds a NUL byte", i)
		}
	}
	return nil
}

// apiKey is the request's API key, as the auth middleware read it.
func apiKey(h interface{ Get(string) string }) string {
	if k := h.Get(auth.HeaderName); k != "" {
		return k
	}
	if b, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(b)
	}
	return ""
}

// SubmitJob checks the policy and quotas, unpacks the files and starts the job.
func (s *Service) SubmitJob(ctx context.Context, m *loopsv1.SubmitJobRequest) (*loopsv1.Job, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	lim := s.o.Policy.For(ws)
	if !lim.AllowJobs {
		return nil, errs.New(connect.CodePermissionDenied, ReasonJobsNotAllowed, fmt.Errorf(
			"workspace %q may not run jobs: allow_jobs is off (the default); set allow_jobs: true in its section of the workspace policy file (loops serve --workspace-policy FILE) and restart the gateway", ws))
	}
	if err := s.validate(m); err != nil {
		return nil, err
	}
	if s.o.Python == nil {
		return nil, errs.New(connect.CodeFailedPrecondition, "", errors.New("this gateway has no Python environment for jobs"))
	}
	bwrap := s.o.Bwrap
	if bwrap == "" {
		if bwrap, err = exec.LookPath("bwrap"); err != nil {
			return nil, errs.New(connect.CodeFailedPrecondition, "", errors.New("jobs need bubblewrap on the gateway's host and it is not installed (apt-get install bubblewrap)"))
		}
	}
	key := ""
	if ci, ok := connect.CallInfoForHandlerContext(ctx); ok {
		key = apiKey(ci.RequestHeader())
	}
	q := s.quotas(lim)

	id := newJobID()
	dir := filepath.Join(s.o.Dir, id)
	// Reserve the slot before any disk work, so a burst of submits cannot overrun quotas.
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the gateway is shutting down: submit the job again once it is back"))
	case s.perWS[ws] >= q.running:
		s.mu.Unlock()
		return nil, errs.New(connect.CodeResourceExhausted, ReasonJobQuota, fmt.Errorf(
			"workspace %q runs %d jobs, its max_running_jobs: wait for one to finish or cancel one (loops jobs cancel ID)", ws, q.running))
	case len(s.running) >= s.o.MaxRunningAll:
		s.mu.Unlock()
		return nil, errs.New(connect.CodeResourceExhausted, ReasonJobQuota, fmt.Errorf(
			"this gateway runs %d jobs, its limit for all workspaces: try again later", s.o.MaxRunningAll))
	}
	r := &run{ws: ws, done: make(chan struct{})}
	s.running[id] = r
	s.perWS[ws]++
	s.wg.Add(1)
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.release(id, r)
			_ = os.RemoveAll(dir)
			s.wg.Done()
		}
	}()

	files := filepath.Join(dir, "files")
	if err := os.MkdirAll(files, 0o755); err != nil {
		return nil, s.internal("creating the job's folder", err)
	}
	if len(m.GetArchive()) > 0 {
		if err := Unpack(m.GetArchive(), files, s.o.MaxFiles, s.o.MaxUnpackedBytes); err != nil {
			var ea *errArchive
			if errors.As(err, &ea) {
				return nil, invalid("%s", ea.msg)
			}
			return nil, s.internal("unpacking the archive", err)
		}
	}
	if e := m.GetEntrypoint(); e != "" {
		if fi, err := os.Lstat(filepath.Join(files, filepath.FromSlash(e))); err != nil || !fi.Mode().IsRegular() {
			return nil, invalid("entrypoint %q is not a file of the archive", e)
		}
	}
	lf, err := os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, s.internal("creating the job's log", err)
	}
	job := &loopsv1.Job{
		Id: id, State: loopsv1.JobState_JOB_STATE_RUNNING, Recipe: m.GetRecipe(), Entrypoint: m.GetEntrypoint(),
		Args: m.GetArgs(), CreateTime: timestamppb.Now(),
	}
	if err := s.o.Store.PutJob(ctx, ws, job); err != nil {
		_ = lf.Close()
		return nil, s.internal("recording the job", err)
	}
	jctx, cancel := context.WithCancelCause(context.Background())
	s.mu.Lock()
	r.job, r.log, r.cancel = job, newLogFile(lf, s.o.MaxLogBytes), cancel
	closed := s.closed
	s.mu.Unlock()
	if closed {
		cancel(errShutdown) // Close ran between the reservation and now
	}
	started = true
	go s.execute(jctx, r, dir, bwrap, key, q)
	return s.snapshot(r), nil
}

func (s *Service) internal(what string, err error) error {
	id := errs.NewID()
	s.o.Logger.Error("jobs: "+what, slog.String("error_id", id), slog.Any("err", err))
	return errs.Incident(id, fmt.Sprintf("%s failed (error id %s)", what, id))
}

func newJobID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "job-" + hex.EncodeToString(b[:])
}

// release frees a job's slot.
func (s *Service) release(id string, r *run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, id)
	if s.perWS[r.ws]--; s.perWS[r.ws] <= 0 {
		delete(s.perWS, r.ws)
	}
}

// snapshot returns a copy of a running job with its current log size.
func (s *Service) snapshot(r *run) *loopsv1.Job {
	s.mu.Lock()
	j, l := proto.CloneOf(r.job), r.log
	s.mu.Unlock()
	if l != nil {
		j.LogBytes, _ = l.state()
	}
	return j
}

// execute runs the job to its end and records how it ended.
func (s *Service) execute(ctx context.Context, r *run, dir, bwrap, key string, q quotas) {
	defer s.wg.Done()
	defer close(r.done)
	id := r.job.GetId()
	ctx, stop := context.WithTimeoutCause(ctx, q.wall, fmt.Errorf("its wall time of %s ran out (max_job_seconds)", q.wall))
	defer stop()
	code, reason := s.runSandboxed(ctx, r, dir, bwrap, key, q)
	state := loopsv1.JobState_JOB_STATE_SUCCEEDED
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errCancelled):
		state, reason = loopsv1.JobState_JOB_STATE_CANCELLED, cause.Error()
	case errors.Is(cause, errShutdown):
		state, reason = loopsv1.JobState_JOB_STATE_CANCELLED, cause.Error()
	case cause != nil:
		state, reason = loopsv1.JobState_JOB_STATE_FAILED, "stopped: "+cause.Error()
	case reason != "" || code != 0:
		state = loopsv1.JobState_JOB_STATE_FAILED
		if reason == "" {
			reason = fmt.Sprintf("exited with status %d", code)
		}
	}
	end := fmt.Sprintf("\n[loops: job %s %s", id, strings.ToLower(strings.TrimPrefix(state.String(), "JOB_STATE_")))
	if reason != "" {
		end += ": " + reason
	}
	r.log.finish(end + "]\n")
	// The job's files go; its log stays.
	_ = os.RemoveAll(filepath.Join(dir, "files"))
	_ = os.RemoveAll(filepath.Join(dir, "run"))
	size, _ := r.log.state()
	s.mu.Lock()
	j := proto.CloneOf(r.job)
	j.State, j.ExitCode, j.Reason, j.EndTime, j.LogBytes = state, int32(code), reason, timestamppb.Now(), size
	r.job = j
	s.mu.Unlock()
	// The record must land even while the gateway shuts down.
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.o.Store.PutJob(wctx, r.ws, j); err != nil {
		s.o.Logger.Error("jobs: recording a job's end", slog.String("job", id), slog.Any("err", err))
	}
	s.release(id, r)
	s.prune(wctx, r.ws)
}

// prune deletes the workspace's finished jobs past the newest MaxKeptJobs: records and
// folders (logs).
func (s *Service) prune(ctx context.Context, ws string) {
	list, err := s.o.Store.ListJobs(ctx, ws, min(s.o.MaxKeptJobs+store.DefaultPageLimit, store.MaxPageLimit))
	if err != nil {
		s.o.Logger.Warn("jobs: listing old jobs to prune", slog.Any("err", err))
		return
	}
	for _, j := range list[min(len(list), s.o.MaxKeptJobs):] {
		if j.GetState() == loopsv1.JobState_JOB_STATE_RUNNING {
			continue
		}
		if err := s.o.Store.DeleteJob(ctx, ws, j.GetId()); err != nil && !errors.Is(err, store.ErrNotFound) {
			s.o.Logger.Warn("jobs: pruning an old job", slog.String("job", j.GetId()), slog.Any("err", err))
			continue
		}
		_ = os.RemoveAll(filepath.Join(s.o.Dir, j.GetId()))
	}
}

var errShutdown = errors.New("the gateway shut down")

// runSandboxed prepares Python, starts the relay socket and the sandbox, and waits for it.
// It returns the exit status and, when the job could not run, why.
func (s *Service) runSandboxed(ctx context.Context, r *run, dir, bwrap, key string, q quotas) (int, string) {
	py, err := s.o.Python(ctx, r.log)
	if err != nil {
		return -1, "preparing the Python environment: " + err.Error()
	}
	runDir := filepath.Join(dir, "run")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return -1, "creating the relay's folder: " + err.Error()
	}
	// The job's way to the gateway: a Unix socket bound into its sandbox.
	sock := filepath.Join(runDir, "gw.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return -1, "creating the relay socket: " + err.Error()
	}
	defer ln.Close()
	gw := s.o.Gateway
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go splice(c, func() (net.Conn, error) { return net.DialTimeout("tcp", dialable(gw), 10*time.Second) })
		}
	}()
	_, port, _ := net.SplitHostPort(gw)
	argv := s.sandboxArgs(bwrap, dir, py, r.job, port, q)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = runDir
	cmd.Env = append([]string{
		"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/job", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "HF_HUB_OFFLINE=1",
		"TINKER_API_KEY=" + key, "TINKER_BASE_URL=http://127.0.0.1:" + port, "LOOPS_JOB_ID=" + r.job.GetId(),
	}, append(append(append([]string(nil), s.o.Env...), py.Env...), s.o.RelayEnv...)...)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	// Its own process group: cancel signals the whole sandbox.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return -1, "starting the sandbox: " + err.Error()
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-waited:
	case <-ctx.Done():
		pgid := cmd.Process.Pid
		terminate(pgid)
		select {
		case werr = <-waited:
		case <-time.After(s.o.Grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			werr = <-waited
		}
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1, fmt.Sprintf("killed by signal %s (over its memory limit of %d MiB, or stopped)", ws.Signal(), q.memoryMB)
		}
		return ee.ExitCode(), ""
	}
	if werr != nil {
		return -1, werr.Error()
	}
	return 0, ""
}

// dialable turns a listening address into one to dial (an unspecified host is loopback).
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// sandboxArgs is the command line: prlimit (address space, processes, open files) around
// bwrap around the relay around Python.
func (s *Service) sandboxArgs(bwrap, dir string, py Python, j *loopsv1.Job, port string, q quotas) []string {
	argv := []string{"prlimit",
		"--as=" + strconv.FormatInt(int64(q.memoryMB)<<20, 10),
		"--nofile=4096", "--core=0", "--",
		bwrap,
		"--unshare-all", // its own network (loopback only), pid, ipc, uts and user namespaces
		"--die-with-parent",
		"--hostname", "loops-job",
		"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
	}
	for _, p := range []string{"/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc/alternatives", "/etc/ssl", "/etc/ca-certificates", "/etc/localtime"} {
		argv = append(argv, "--ro-bind-try", p, p)
	}
	for _, p := range append(append([]string(nil), s.o.Binds...), py.Binds...) {
		argv = append(argv, "--ro-bind", p, p)
	}
	relayPath := "/.loops/relay"
	argv = append(argv,
		"--bind", filepath.Join(dir, "files"), "/job",
		"--bind", filepath.Join(dir, "run"), "/.loops/run",
		"--ro-bind", s.o.Relay[0], relayPath,
		"--chdir", "/job",
		"--",
		relayPath)
	argv = append(argv, s.o.Relay[1:]...)
	argv = append(argv, "127.0.0.1:"+port, "/.loops/run/gw.sock", "--", py.Exe)
	if j.GetRecipe() != "" {
		argv = append(argv, "-m", "loops_cookbook", "run", j.GetRecipe())
	} else {
		argv = append(argv, j.GetEntrypoint())
	}
	return append(argv, j.GetArgs()...)
}

// lookup returns a job of the workspace: the running copy, else the record.
func (s *Service) lookup(ctx context.Context, ws, id string) (*loopsv1.Job, *run, error) {
	if r := s.live(ws, id); r != nil {
		return s.snapshot(r), r, nil
	}
	j, err := s.o.Store.GetJob(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("job %.80q not found in this workspace (loops jobs list lists them)", id))
	}
	if err != nil {
		return nil, nil, s.internal("reading the job", err)
	}
	return j, nil, nil
}

// live returns the workspace's running job id once it has started, or nil.
func (s *Service) live(ws, id string) *run {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.running[id]; r != nil && r.ws == ws && r.log != nil {
		return r
	}
	return nil
}

// GetJob returns a job of the workspace.
func (s *Service) GetJob(ctx context.Context, req *loopsv1.GetJobRequest) (*loopsv1.Job, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	j, _, err := s.lookup(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	return j, nil
}

// ListJobs lists the workspace's jobs, newest first.
func (s *Service) ListJobs(ctx context.Context, req *loopsv1.ListJobsRequest) (*loopsv1.ListJobsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if n := req.GetPageSize(); n < 0 || n > store.MaxPageLimit {
		return nil, invalid("page_size %d: use 1 to %d, or 0 for %d", n, store.MaxPageLimit, store.DefaultPageLimit)
	}
	list, err := s.o.Store.ListJobs(ctx, ws, int(req.GetPageSize()))
	if err != nil {
		return nil, s.internal("listing jobs", err)
	}
	for i, j := range list {
		if r := s.live(ws, j.GetId()); r != nil {
			list[i] = s.snapshot(r)
		}
	}
	return &loopsv1.ListJobsResponse{Jobs: list}, nil
}

// CancelJob stops a running job and waits for it to end (at most the grace and a little).
func (s *Service) CancelJob(ctx context.Context, req *loopsv1.CancelJobRequest) (*loopsv1.Job, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	j, r, err := s.lookup(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	if r == nil {
		return j, nil
	}
	r.cancel(fmt.Errorf("%w by a request", errCancelled))
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeDeadlineExceeded, errors.New("the job is stopping; ask again with loops jobs list"))
	}
	return s.snapshot(r), nil
}

// ReadJobLogs returns log bytes from an offset, long-polling while the job runs.
func (s *Service) ReadJobLogs(ctx context.Context, m *loopsv1.ReadJobLogsRequest) (*loopsv1.ReadJobLogsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if m.GetOffset() < 0 {
		return nil, invalid("offset %d is negative", m.GetOffset())
	}
	if w := m.GetWaitSeconds(); w < 0 || w > maxWaitSeconds {
		return nil, invalid("wait_seconds %d: use 0 to %d", w, maxWaitSeconds)
	}
	j, r, err := s.lookup(ctx, ws, m.GetId())
	if err != nil {
		return nil, err
	}
	if r != nil && m.GetWaitSeconds() > 0 {
		size, changed := s.logOf(r).state()
		if size <= m.GetOffset() {
			t := time.NewTimer(time.Duration(m.GetWaitSeconds()) * time.Second)
			select {
			case <-changed:
			case <-r.done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		j = s.snapshot(r)
	}
	data, err := readAt(filepath.Join(s.o.Dir, j.GetId(), "log"), m.GetOffset(), j.GetLogBytes())
	if err != nil {
		return nil, s.internal("reading the job's log", err)
	}
	return &loopsv1.ReadJobLogsResponse{Data: data, NextOffset: m.GetOffset() + int64(len(data)), Job: j}, nil
}

func (s *Service) logOf(r *run) *logFile {
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.log
}

// readAt reads up to maxReadBytes of a log from off, no further than size.
func readAt(file string, off, size int64) ([]byte, error) {
	if off >= size {
		return nil, nil
	}
	n := min(size-off, maxReadBytes)
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	k, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:k], nil
}

// Close stops every running job (SIGTERM, SIGKILL after the grace), records each as
// cancelled, and refuses new ones; it waits within ctx.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for _, r := range s.running {
		if r.cancel != nil { // nil: not started yet; SubmitJob sees closed
			r.cancel(errShutdown)
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("jobs: still stopping at the end of the grace: %w", ctx.Err())
	}
}
