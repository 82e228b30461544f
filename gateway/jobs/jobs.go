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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
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
	// DefaultDiskMB sizes a job's /job and its /tmp (each a tmpfs).
	DefaultDiskMB = 1024
	// DefaultMaxProcesses bounds a job's processes and threads.
	DefaultMaxProcesses = 512
	// DefaultUIDBase is the first host uid of the jobs of a root gateway: 0x70010000, above
	// systemd's container range (up to 0x6FFFFFFF) and far from regular, system and
	// dynamic users. Job slot i runs as DefaultUIDBase+i (uid and gid).
	DefaultUIDBase = 0x70010000
	maxNofile      = 4096
	maxArgs        = 64
	maxArgBytes    = 4096
	maxReadBytes   = 1 << 20
	maxWaitSeconds = 60
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

// ReasonNoLimits is the reason of a refusal to run a job because the gateway cannot bound
// its memory (no cgroup) and its operator did not opt into weak limits.
const ReasonNoLimits = "JOB_LIMITS_UNAVAILABLE"

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
	// Gateway is the gateway's listening address (host:port): jobs see
	// TINKER_BASE_URL=http://127.0.0.1:PORT, which their relay carries to Listener.
	Gateway string
	// Python prepares the interpreter (called in the job, its output to the job's log).
	Python func(ctx context.Context, log io.Writer) (Python, error)
	// Listener carries the jobs' connections to the gateway's HTTP server, which must
	// serve it (jobs are refused without one).
	Listener *Listener
	// Relay is the command that runs RelayMain (its first element a host path, bound into
	// the sandbox): the gateway uses its own binary and `jobs relay`.
	Relay []string
	// RelayEnv is added to the relay's environment (tests use it to select RelayMain).
	RelayEnv []string
	// Binds are host folders every job sees read-only at the same path (the data dir's
	// built-in models, for their tokenizers), and Env is added to every job's environment.
	Binds []string
	Env   []string
	// ModelCaches are Hugging Face hub caches (HF_HUB_CACHE, HF_HOME/hub): a job sees their
	// model repositories (models--*: snapshots, blobs, refs) read-only at the same path,
	// listed when it starts, and nothing else of them: not the token beside the hub, not
	// the datasets.
	ModelCaches []string
	// DiskMB is the size of a job's /job and of its /tmp, each a tmpfs (default 1024): a
	// job that fills one gets ENOSPC. With a cgroup they count against its memory too.
	DiskMB int
	// MaxProcesses bounds a job's processes and threads (default 512): the cgroup's
	// pids.max and the job's RLIMIT_NPROC (which the kernel counts per job: each job has
	// its own user namespace).
	MaxProcesses int
	// MaxJobConns bounds the connections one job has open to the gateway (default 64).
	MaxJobConns int
	// CgroupParent is where the jobs' cgroups go: empty finds one (the gateway's own cgroup
	// v2 cgroup, else the cgroup v1 memory and pids hierarchies as root); a folder is a
	// cgroup v2 cgroup delegated to the gateway's user, holding no process; CgroupNone
	// turns cgroups off.
	CgroupParent string
	// WeakLimits lets jobs run without a cgroup: each process of a job is then held to the
	// job's memory as an address-space limit (RLIMIT_AS), its processes to RLIMIT_NPROC and
	// its files to the tmpfs sizes, but the job as a whole is not bounded (its processes'
	// memory adds up, and /job, /tmp and /dev/shm come on top) and gets no CPU share of its
	// own. Without it, such a gateway refuses jobs (FailedPrecondition, ReasonNoLimits).
	WeakLimits bool
	// UIDBase is, under a root gateway, the host uid (and gid) of running job slot 0; slot
	// i runs as UIDBase+i (default DefaultUIDBase). Under an unprivileged gateway jobs run
	// as the gateway's own user.
	UIDBase int
	// Bwrap is the bubblewrap binary (default: bwrap from PATH). Jobs are refused when it
	// is missing: they never run outside a sandbox.
	Bwrap string
	// Recipes are the cookbook recipes the jobs' interpreter has (cookbook.Recipes): a job
	// naming another is refused at submit. Nil checks only that the name is well formed.
	Recipes []string
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

	// root: the gateway runs as root (jobs get host uids of their own).
	root bool
	// cgroups is where the jobs' cgroups go (nil: none, noCgroups says why).
	cgroups   *cgroupTree
	noCgroups error
	// filter is the seccomp filter (nil: none for this architecture, noFilter says why).
	filter   []byte
	noFilter error
	// bwrapOnce checks bubblewrap's options once (bwrapErr: why it cannot run jobs).
	bwrapOnce sync.Once
	bwrapErr  error

	mu      sync.Mutex
	running map[string]*run // job id -> its run
	perWS   map[string]int  // workspace -> jobs running
	slots   []bool          // job slots in use (a root gateway's job runs as UIDBase+slot)
	closed  bool
	wg      sync.WaitGroup
}

// run is a running job.
type run struct {
	ws     string
	slot   int
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
	orDefault(&o.MaxArchiveBytes, DefaultMaxArchiveBytes)
	orDefault(&o.MaxUnpackedBytes, DefaultMaxUnpackedBytes)
	orDefault(&o.MaxLogBytes, DefaultMaxLogBytes)
	orDefault(&o.MaxFiles, DefaultMaxFiles)
	orDefault(&o.MaxRunningAll, DefaultMaxRunningAll)
	orDefault(&o.Grace, DefaultGrace)
	orDefault(&o.MaxKeptJobs, DefaultMaxKeptJobs)
	orDefault(&o.DiskMB, DefaultDiskMB)
	orDefault(&o.MaxProcesses, DefaultMaxProcesses)
	orDefault(&o.MaxJobConns, DefaultMaxJobConns)
	orDefault(&o.UIDBase, DefaultUIDBase)
	if o.Dir == "" || o.Store == nil {
		return nil, errors.New("jobs: Dir and Store are required")
	}
	if int64(o.DiskMB)<<20 < o.MaxUnpackedBytes {
		return nil, fmt.Errorf("jobs: DiskMB %d cannot hold an upload of %d bytes unpacked", o.DiskMB, o.MaxUnpackedBytes)
	}
	s := &Service{o: o, running: map[string]*run{}, perWS: map[string]int{}, slots: make([]bool, o.MaxRunningAll), root: os.Geteuid() == 0}
	if s.root && (o.UIDBase+o.MaxRunningAll > 1<<31-1) {
		return nil, fmt.Errorf("jobs: UIDBase %d leaves no room for %d job uids", o.UIDBase, o.MaxRunningAll)
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
	s.removeLeftovers()
	s.cgroups, s.noCgroups = findCgroups(o.CgroupParent)
	switch {
	case s.cgroups != nil:
		s.cgroups.sweep()
		o.Logger.Info("jobs: each job gets a cgroup (memory including its tmpfs, processes, CPU share)", slog.String("cgroups", s.cgroups.String()))
	case o.WeakLimits:
		o.Logger.Warn("jobs run with weak limits: a job's processes are each held to its memory, not the job as a whole, and get no CPU share of their own (no cgroup for jobs)", slog.Any("why", s.noCgroups))
	default:
		o.Logger.Warn("jobs are refused: no cgroup can bound a job's memory (delegate one, or opt into weak limits)", slog.Any("why", s.noCgroups))
	}
	s.filter, s.noFilter = seccompFilter()
	return s, nil
}

// orDefault sets *v to d when it is not positive.
func orDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// removeLeftovers removes what jobs that ran when a previous gateway process died left
// behind in their folders, all but their logs: their uploads and relay sockets (and the
// writable folders of versions before /job was a tmpfs).
func (s *Service) removeLeftovers() {
	ents, err := os.ReadDir(s.o.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !jobIDPattern.MatchString(e.Name()) {
			continue
		}
		for _, sub := range []string{"upload", "run", "files"} {
			if err := os.RemoveAll(filepath.Join(s.o.Dir, e.Name(), sub)); err != nil {
				s.o.Logger.Warn("jobs: removing a folder left by a previous gateway process", slog.String("job", e.Name()), slog.Any("err", err))
			}
		}
	}
}

var jobIDPattern = regexp.MustCompile(`^job-[0-9a-f]{16}$`)

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
	if m.GetRecipe() != "" && s.o.Recipes != nil && !slices.Contains(s.o.Recipes, m.GetRecipe()) {
		return invalid("unknown recipe %q: this server's cookbook has %s (`loops cookbook list`)", m.GetRecipe(), strings.Join(s.o.Recipes, ", "))
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
	r := &run{ws: ws, slot: slices.Index(s.slots, false), done: make(chan struct{})}
	s.slots[r.slot] = true
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

	// The upload, read-only in the sandbox (the relay copies it into the job's /job), and
	// readable by the job's user.
	files := filepath.Join(dir, "upload")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, s.internal("creating the job's folder", err)
	}
	if err := os.Mkdir(files, 0o755); err != nil {
		return nil, s.internal("creating the job's folder", err)
	}
	if err := os.Chmod(files, 0o755); err != nil {
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
	if err := s.canRun(); err != nil {
		return nil, err
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
	go s.execute(jctx, r, dir, key, q)
	return s.snapshot(r), nil
}

// canRun says why this gateway cannot run jobs at all (FailedPrecondition), or nil.
func (s *Service) canRun() error {
	refuse := func(reason, format string, a ...any) error {
		return errs.New(connect.CodeFailedPrecondition, reason, fmt.Errorf(format, a...))
	}
	switch {
	case s.o.Python == nil:
		return refuse("", "this gateway has no Python environment for jobs")
	case s.o.Listener == nil || len(s.o.Relay) == 0:
		return refuse("", "this gateway has no relay for jobs")
	case s.cgroups == nil && !s.o.WeakLimits:
		return refuse(ReasonNoLimits, "this gateway cannot bound a job's memory and processes, so it runs no jobs: there is no cgroup for them (%v). The operator can delegate a cgroup v2 cgroup to the gateway (docs/jobs.md, \"Resources\"), or start it with --jobs-weak-limits to run jobs with per-process limits only", s.noCgroups)
	case s.noFilter != nil:
		return refuse("", "this gateway cannot filter a job's system calls: %v", s.noFilter)
	}
	s.bwrapOnce.Do(func() { s.bwrapErr = s.checkBwrap() })
	if s.bwrapErr != nil {
		return refuse("", "%v", s.bwrapErr)
	}
	return nil
}

// checkBwrap finds bubblewrap and checks that it has the options the sandbox needs.
func (s *Service) checkBwrap() error {
	if s.o.Bwrap == "" {
		p, err := exec.LookPath("bwrap")
		if err != nil {
			return errors.New("jobs need bubblewrap on the gateway's host and it is not installed (apt-get install bubblewrap)")
		}
		s.o.Bwrap = p
	}
	out, err := exec.Command(s.o.Bwrap, "--help").CombinedOutput()
	if len(out) == 0 && err != nil {
		return fmt.Errorf("cannot run bubblewrap at %s: %w", s.o.Bwrap, err)
	}
	for _, opt := range []string{"--userns", "--size", "--perms", "--as-pid-1", "--info-fd", "--new-session", "--seccomp", "--cap-add"} {
		if !strings.Contains(string(out), opt+" ") {
			return fmt.Errorf("bubblewrap at %s has no %s option: jobs need bubblewrap 0.8 or later", s.o.Bwrap, opt)
		}
	}
	return nil
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
	s.slots[r.slot] = false
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
func (s *Service) execute(ctx context.Context, r *run, dir, key string, q quotas) {
	defer s.wg.Done()
	defer close(r.done)
	id := r.job.GetId()
	ctx, stop := context.WithTimeoutCause(ctx, q.wall, fmt.Errorf("its wall time of %s ran out (max_job_seconds)", q.wall))
	defer stop()
	code, reason := s.runSandboxed(ctx, r, dir, key, q)
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
	// The job's upload and socket go (what it wrote went with its tmpfs); its log stays.
	_ = os.RemoveAll(filepath.Join(dir, "upload"))
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

// runSandboxed prepares Python, the relay socket, the user namespace and the cgroup, runs
// the sandbox and waits for it. It returns the exit status and, when the job could not run
// or was killed, why.
func (s *Service) runSandboxed(ctx context.Context, r *run, dir, key string, q quotas) (int, string) {
	py, err := s.o.Python(ctx, r.log)
	if err != nil {
		return -1, "preparing the Python environment: " + err.Error()
	}
	id := r.job.GetId()
	runDir := filepath.Join(dir, "run")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		return -1, "creating the relay's folder: " + err.Error()
	}
	// The job's way to the gateway: a Unix socket bound into its sandbox, whose
	// connections the gateway's HTTP server serves.
	ln, err := listenUnix(runDir, "gw.sock")
	if err != nil {
		return -1, "creating the relay socket: " + err.Error()
	}
	defer ln.Close()
	if err := errors.Join(os.Chmod(runDir, 0o755), os.Chmod(filepath.Join(runDir, "gw.sock"), 0o666)); err != nil {
		return -1, "opening the relay socket to the job: " + err.Error()
	}
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	go s.o.Listener.serveJob(sctx, ln, id, s.o.MaxJobConns)

	hostID := os.Getuid()
	if s.root {
		hostID = s.o.UIDBase + r.slot
	}
	ns, err := userNamespace(s.o.Relay, append(os.Environ(), s.o.RelayEnv...), s.root, hostID)
	if err != nil {
		return -1, err.Error()
	}
	defer ns.Close()
	var cg *jobCgroup
	if s.cgroups != nil {
		if cg, err = s.cgroups.create(id, int64(q.memoryMB)<<20, s.o.MaxProcesses); err != nil {
			return -1, err.Error()
		}
		defer cg.destroy()
	}

	_, port, _ := net.SplitHostPort(s.o.Gateway)
	limits := []string{"-nproc", strconv.Itoa(s.o.MaxProcesses), "-nofile", strconv.Itoa(maxNofile)}
	if cg == nil {
		limits = append(limits, "-as", strconv.FormatInt(int64(q.memoryMB)<<20, 10))
	}
	command := []string{py.Exe}
	if r.job.GetRecipe() != "" {
		command = append(command, "-m", "loops_cookbook", "run", r.job.GetRecipe())
	} else {
		command = append(command, r.job.GetEntrypoint())
	}
	sb := &sandbox{
		bwrap: s.o.Bwrap, root: s.root, upload: filepath.Join(dir, "upload"), run: runDir, relay: s.o.Relay,
		binds: slices.Concat(s.o.Binds, py.Binds, modelBinds(s.o.ModelCaches)), port: port, conns: 4 * s.o.MaxJobConns,
		diskBytes: int64(s.o.DiskMB) << 20, limits: limits, command: append(command, r.job.GetArgs()...),
	}
	argv := sb.args()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = append([]string{
		"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + sandboxJob, "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "HF_HUB_OFFLINE=1",
		"TINKER_API_KEY=" + key, "TINKER_BASE_URL=http://127.0.0.1:" + port, "LOOPS_JOB_ID=" + id,
	}, slices.Concat(s.o.Env, py.Env, s.o.RelayEnv)...)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	// Its own process group (the gateway's terminal's signals do not reach it); bubblewrap
	// dies with the gateway, and the sandbox with bubblewrap.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pipes, err := newSandboxPipes(s.filter)
	if err != nil {
		return -1, err.Error()
	}
	defer pipes.close()
	cmd.ExtraFiles = []*os.File{ns, pipes.seccompR, pipes.infoW, pipes.gateR}
	if err := cmd.Start(); err != nil {
		return -1, "starting the sandbox: " + err.Error()
	}
	pipes.closeChildEnds()
	_ = ns.Close()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	// The sandbox's first process (the relay) waits for the go, sent once the job is in
	// its cgroup.
	relay, err := pipes.childPID()
	if err == nil && cg != nil {
		err = cg.add(cmd.Process.Pid, relay)
	}
	if err == nil {
		_, err = pipes.gateW.Write([]byte{1})
	}
	pipes.close()
	if err != nil {
		_ = cmd.Process.Kill()
		<-waited
		return -1, "starting the sandbox: " + err.Error()
	}
	var werr error
	select {
	case werr = <-waited:
	case <-ctx.Done():
		_ = syscall.Kill(relay, syscall.SIGTERM) // the relay passes it on to the job's processes
		select {
		case werr = <-waited:
		case <-time.After(s.o.Grace):
			_ = syscall.Kill(relay, syscall.SIGKILL)
			_ = cmd.Process.Kill()
			werr = <-waited
		}
	}
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(werr, &ee):
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	case werr != nil:
		return -1, werr.Error()
	}
	switch {
	case cg != nil && cg.oomKilled():
		return code, fmt.Sprintf("killed: over its memory limit of %d MiB (its processes with what it keeps in /job, /tmp and /dev/shm)", q.memoryMB)
	case code > 128 && code < 128+65:
		return code, fmt.Sprintf("killed by signal %d (%s)", code-128, unix.SignalName(syscall.Signal(code-128)))
	}
	return code, ""
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
		if s.cgroups != nil {
			s.cgroups.release()
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("jobs: still stopping at the end of the grace: %w", ctx.Err())
	}
}
