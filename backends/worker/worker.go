// Package worker is the "torch" backend: a backends.Backend that talks to Loops workers
// (python -m loops_worker, package backends/torch; or the Go CPU worker, loops worker,
// package backends/serve, through the worker_command option) over gRPC with the generated
// connect-go clients. It starts local worker processes itself, or connects to remote ones
// by address.
//
// Failure handling: each worker is health-checked (its grpc.health.v1 service, over the
// worker protocol's mutual TLS; GetCapabilities for a worker that does not serve it); a
// local worker whose process exits, stops answering or answers NOT_SERVING (the Python
// worker's engine broke: a device error) is killed and restarted. Calls in flight on a worker that dies fail at
// once with CodeUnavailable ("worker … died: …"). Adapters live in worker memory, so after a
// restart they are gone: calls naming them get CodeNotFound, which the gateway turns into its
// recovery path (reload the run's last checkpoint). A worker that does not serve the model
// asked for refuses with CodeInvalidArgument naming the models it serves.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	"github.com/loops-dev/loops/internal/telemetry"
)

// Name is the name the backend registers under.
const Name = "torch"

// ReadyPrefix starts the line a worker prints on stdout once it serves.
const ReadyPrefix = "LOOPS_WORKER_LISTENING "

// Options configure the backend. Zero values mean the documented defaults.
type Options struct {
	// Workers are addresses (host:port) of remote workers. Empty: start local workers.
	Workers []string
	// LocalWorkers is how many local worker processes to start (default 1). They are the
	// replicas of one pool of the local provider (backends/pools/local: restarts with
	// back-off, logs, hung ones killed), each serving every model and seeing this process's
	// GPUs, registering with the backend's registry on loopback.
	LocalWorkers int
	// Python is the interpreter for local workers (default $LOOPS_WORKER_PYTHON, else python3).
	Python string
	// PythonPath is prepended to PYTHONPATH of local workers (default $LOOPS_WORKER_PYTHONPATH),
	// for running from a checkout: "<repo>/backends/torch:<repo>/gen/python".
	PythonPath string
	// Command, when set, starts local workers instead of `Python -m loops_worker` (default
	// $LOOPS_WORKER_COMMAND, split at spaces), e.g. {"/usr/local/bin/loops", "worker"} for
	// the Go CPU worker. It is given the same arguments (--listen, --model, ...).
	Command []string
	// Models to serve; "loops/tiny" is the built-in model (written under DataDir). Default:
	// just "loops/tiny".
	Models []string
	// DataDir is where the built-in model is written.
	DataDir string
	// MaxLoraRank caps adapter ranks (default 64).
	MaxLoraRank int
	// Args are extra command-line arguments for local workers (e.g. --device cpu).
	Args []string
	// Env are extra environment variables (KEY=VALUE) for local workers.
	Env []string
	// StartTimeout bounds a local worker's start, model loading included (default 10m); a
	// local worker whose process exits before any serves fails the start at once.
	StartTimeout time.Duration
	// HealthInterval is the time between health checks (default 5s); HealthTimeout bounds
	// one check (default 10s); after HealthFailures failed checks in a row (default 3) the
	// worker is declared dead (a local one is killed and restarted).
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	HealthFailures int
	// CallTimeout, when positive, declares a worker hung (and kills a local one) when one call
	// runs longer. Zero: no limit (long GPU passes are normal).
	CallTimeout time.Duration
	// RestartBackoff is the first delay before restarting a dead local worker (default 1s,
	// doubling up to 30s while it keeps exiting within a minute).
	RestartBackoff time.Duration
	// TLSDir holds the certificate authorities of the worker protocol's mutual TLS
	// (backends/pools/mtls; default DataDir/pools/tls, mode 0700): the gateway issues its
	// workers' credentials from them, and talks only to workers whose certificates they
	// signed. Workers started by hand get theirs from loops pools credentials, which reads
	// the same folder.
	TLSDir string
	// AllowDirs are folders, besides DataDir, that the workers this backend starts may read
	// and write adapters in (a --checkpoint-store folder outside the data dir); DataDir is
	// always one. Passed as --allow-dir; a folder a request names outside them is refused.
	AllowDirs []string
	// CheckpointOrigins are the checkpoint store's scheme://host[:port] that the workers
	// this backend starts may fetch and put checkpoint files at (presigned URLs of an S3
	// store); any other URL is refused. Passed as --checkpoint-origin.
	CheckpointOrigins []string
	// Logger receives worker events and the workers' stderr (default slog.Default()).
	Logger *slog.Logger
	// Pool, when set, selects pool mode (pool.go): workers come from a pools.Provider and
	// register with a Registry this backend serves; Workers and LocalWorkers are then unused
	// (except by the static provider, which takes Workers as its addresses).
	Pool *PoolOptions
}

func init() {
	backends.Register(Name, func(ctx context.Context, cfg backends.Config) (backends.Backend, error) {
		o, err := OptionsFromConfig(cfg)
		if err != nil {
			return nil, err
		}
		return New(ctx, o)
	})
}

// OptionsFromConfig reads backends.Config. Options keys (environment fallbacks in
// parentheses): workers (LOOPS_WORKERS; host:port,...),
// local_workers, python (LOOPS_WORKER_PYTHON), pythonpath (LOOPS_WORKER_PYTHONPATH),
// worker_command (LOOPS_WORKER_COMMAND; space-separated command that replaces
// `<python> -m loops_worker` for the workers this backend starts, local_workers and
// provider=local alike, e.g. "/usr/local/bin/loops worker" for the Go CPU worker), args
// (LOOPS_WORKER_ARGS; space-separated extra worker arguments, e.g. "--sampler vllm"),
// device (LOOPS_WORKER_DEVICE; shortcut for --device), health_interval,
// health_timeout, health_failures, call_timeout, start_timeout (Go durations), tls_dir
// (LOOPS_WORKER_TLS_DIR), allow_dirs (LOOPS_WORKER_ALLOW_DIRS; folders separated by
// commas), checkpoint_origins (LOOPS_WORKER_CHECKPOINT_ORIGINS; scheme://host[:port]
// separated by commas).
func OptionsFromConfig(cfg backends.Config) (Options, error) {
	o := Options{Models: cfg.Models, DataDir: cfg.DataDir, MaxLoraRank: cfg.MaxLoraRank}
	m := map[string]string{}
	// Environment fallbacks, for `loops serve` (which has no backend-options flag yet).
	for key, env := range map[string]string{"workers": "LOOPS_WORKERS", "args": "LOOPS_WORKER_ARGS", "device": "LOOPS_WORKER_DEVICE",
		"tls_dir": "LOOPS_WORKER_TLS_DIR", "allow_dirs": "LOOPS_WORKER_ALLOW_DIRS", "checkpoint_origins": "LOOPS_WORKER_CHECKPOINT_ORIGINS"} {
		if v := os.Getenv(env); v != "" {
			m[key] = v
		}
	}
	for k, v := range cfg.Options {
		if !slices.Contains(optionKeys, k) {
			return o, fmt.Errorf("torch: unknown backend option %q (known: %s); worker arguments go in args, e.g. --backend-opt \"args=--attn-implementation eager\"", k, strings.Join(optionKeys, ", "))
		}
		m[k] = v
	}
	po, err := poolOptionsFromConfig(m)
	if err != nil {
		return o, err
	}
	o.Pool = po
	o.Workers = commaList(m["workers"])
	o.Python, o.PythonPath, o.TLSDir = m["python"], m["pythonpath"], m["tls_dir"]
	o.AllowDirs, o.CheckpointOrigins = commaList(m["allow_dirs"]), commaList(m["checkpoint_origins"])
	o.Command = strings.Fields(m["worker_command"])
	if v := m["args"]; v != "" {
		o.Args = strings.Fields(v)
	}
	if v := m["device"]; v != "" {
		o.Args = append(o.Args, "--device", v)
	}
	if v := m["local_workers"]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return o, fmt.Errorf("torch: option local_workers=%q is not a positive integer", v)
		}
		o.LocalWorkers = n
	}
	if v := m["health_failures"]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return o, fmt.Errorf("torch: option health_failures=%q is not a positive integer", v)
		}
		o.HealthFailures = n
	}
	for key, dst := range map[string]*time.Duration{"health_interval": &o.HealthInterval,
		"health_timeout": &o.HealthTimeout, "call_timeout": &o.CallTimeout, "start_timeout": &o.StartTimeout} {
		if v := m[key]; v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return o, fmt.Errorf("torch: option %s=%q is not a duration such as 10s", key, v)
			}
			*dst = d
		}
	}
	return o, nil
}

// optionKeys are the backend options OptionsFromConfig and poolOptionsFromConfig read; any
// other key is refused rather than ignored.
var optionKeys = []string{"workers", "local_workers", "python", "pythonpath", "worker_command", "args", "device",
	"health_interval", "health_timeout", "health_failures", "call_timeout", "start_timeout", "tls_dir", "allow_dirs",
	"checkpoint_origins", "provider", "registry_listen", "registry_url", "join_token_file", "ray_address", "ray_python",
	"worker_listen", "replicas", "sampler_replicas", "gpus_per_replica", "gpu_kind", "pool_slots", "gpus", "preemptible",
	"heartbeat_timeout", "keep_warm", "idle_to_zero"}

// commaList splits a comma-separated option into its non-empty, trimmed elements.
func commaList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Backend is the worker client backend.
type Backend struct {
	opts   Options
	log    *slog.Logger
	auth   *mtls.Authority // the worker protocol's mutual TLS
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	workers  []*worker
	adapters map[string]*worker
	lost     map[string]lostEntry // adapter id -> why it is gone (lost.go: bounded)
	// full are the adapters that are full fine-tuning runs (LoRA rank 0), known from their
	// CreateAdapter or their checkpoint folder; an entry goes with DeleteAdapter. Placement
	// keeps them apart (pickAdapter): a worker holds few of them (--full-finetune-runs).
	full map[string]bool
	// lostOrder are the records of lost, oldest first; lostSeq numbers them
	lostOrder []lostRef
	lostSeq   uint64
	rr        int
	wg        sync.WaitGroup

	// pool mode (pool.go): the provider, the registry, the configured replicas per pool
	// (the floor of ScaleSamplers) and the slots for all pools
	pools        pools.Provider
	registry     *pools.Registry
	poolReplicas int
	poolSlots    int
	closers      []func()
	// dedicated pools by id (dedicated.go), guarded by mu
	dedicated map[string]*dedicatedPool
	// roles of the pools (sampler pools serve sampling only), guarded by mu; and the
	// configured sampler replicas per model (0: no sampler pools)
	roles           map[string]pools.Role
	samplerReplicas int
	// shared holds the specs of the shared pools as configured, so that one an operator
	// deleted can be created again by scaling it (poolmgr.go); guarded by mu
	shared map[string]pools.Spec
	// firstExit is the first exit of a local worker (pool.go, noteExit)
	firstExit string
}

var _ backends.Backend = (*Backend)(nil)

// New starts (or connects to) the workers and waits until each serves.
func New(ctx context.Context, o Options) (*Backend, error) {
	if o.LocalWorkers <= 0 {
		o.LocalWorkers = 1
	}
	if o.Python == "" {
		o.Python = os.Getenv("LOOPS_WORKER_PYTHON")
	}
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.PythonPath == "" {
		o.PythonPath = os.Getenv("LOOPS_WORKER_PYTHONPATH")
	}
	if len(o.Command) == 0 {
		o.Command = strings.Fields(os.Getenv("LOOPS_WORKER_COMMAND"))
	}
	if o.MaxLoraRank <= 0 {
		o.MaxLoraRank = 64
	}
	if len(o.Models) == 0 {
		o.Models = []string{tiny.Name}
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Minute
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 5 * time.Second
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = 10 * time.Second
	}
	if o.HealthFailures <= 0 {
		o.HealthFailures = 3
	}
	if o.RestartBackoff <= 0 {
		o.RestartBackoff = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DataDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			d = os.TempDir()
		}
		o.DataDir = filepath.Join(d, "loops")
	}
	if o.TLSDir == "" {
		o.TLSDir = filepath.Join(o.DataDir, "pools", "tls")
	}
	auth, err := mtls.Open(o.TLSDir)
	if err != nil {
		return nil, fmt.Errorf("torch: %w", err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	b := &Backend{opts: o, log: o.Logger.With(slog.String("backend", Name)), auth: auth,
		ctx: bctx, cancel: cancel, adapters: map[string]*worker{}, lost: map[string]lostEntry{}, dedicated: map[string]*dedicatedPool{}, roles: map[string]pools.Role{}, shared: map[string]pools.Spec{}}
	if o.Pool == nil && len(o.Workers) == 0 {
		// The default mode: LocalWorkers processes serving every model, supervised by the
		// local pool provider (restart with back-off, logs, hung workers killed).
		o.Pool = &PoolOptions{Provider: "local", Replicas: o.LocalWorkers, implicit: true}
		b.opts.Pool = o.Pool
	}
	if o.Pool != nil {
		if err := b.startPooled(ctx); err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("torch: %w", err)
		}
	} else {
		for i, addr := range o.Workers {
			w := b.newWorker(i, addr)
			w.pool = PoolID(o.Models[0]) // the identity its certificate must name
			b.workers = append(b.workers, w)
		}
	}
	errs := make([]error, len(b.workers))
	var wg sync.WaitGroup
	for i, w := range b.workers {
		if w.pooled {
			continue // registered replicas are attached as they come
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.start(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("torch: %w", err)
	}
	for _, w := range b.workers {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			w.healthLoop()
		}()
	}
	return b, nil
}

// Trainer returns the TrainerService side.
func (b *Backend) Trainer() backends.Trainer { return (*trainer)(b) }

// Sampler returns the SamplerService side.
func (b *Backend) Sampler() backends.Sampler { return (*sampler)(b) }

// Close stops local workers and health checks.
func (b *Backend) Close() error {
	b.cancel()
	for _, w := range b.workers {
		w.stop()
	}
	for _, c := range b.closers {
		c()
	}
	b.wg.Wait()
	for _, w := range b.workers {
		w.mu.Lock()
		cl := w.cl
		w.mu.Unlock()
		cl.close()
	}
	return nil
}

// Workers returns the workers' current addresses (for tests and status pages).
func (b *Backend) Workers() []string {
	var out []string
	for _, w := range b.workers {
		w.mu.Lock()
		out = append(out, w.addr)
		w.mu.Unlock()
	}
	return out
}

// WorkerPID returns the process id of local worker i (replica i of the first model's pool
// with the local provider; 0 if none is running).
func (b *Backend) WorkerPID(i int) int {
	lp, ok := b.pools.(*local.Provider)
	if !ok || len(b.opts.Models) == 0 {
		return 0
	}
	return lp.PID(PoolID(b.opts.Models[0]), i)
}

// WaitReady waits until every worker is alive again (after a restart). In pool mode it
// waits for the slots that hold a replica (attached, or lost and expected back), and stops
// waiting for one whose replica is scaled away meanwhile.
func (b *Backend) WaitReady(ctx context.Context) error {
	for _, w := range b.workers {
		if err := w.waitAlive(ctx); err != nil {
			return err
		}
	}
	return nil
}

// ---- one worker ----------------------------------------------------------------------------

type worker struct {
	b      *Backend
	idx    int
	pooled bool // a slot for registered replicas (pool mode)

	mu     sync.Mutex
	addr   string
	gen    int
	alive  bool
	why    string // why it is down
	life   context.Context
	kill   context.CancelCauseFunc
	up     chan struct{} // closed when alive
	cl     *clients
	caps   *backendv1.GetCapabilitiesResponse
	nAdapt int
	nFull  int         // of nAdapt, the full fine-tuning runs (Backend.full)
	load   samplerLoad // route.go
	// pool mode: the registered replica the slot is attached to (pool empty when none)
	pool    string
	replica int
}

func (b *Backend) newWorker(i int, addr string) *worker {
	return &worker{b: b, idx: i, addr: addr, up: make(chan struct{}), why: "starting"}
}

func (w *worker) name() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return "worker " + w.addr
}

// clients are the gRPC clients of one worker address, over mutual TLS with a connection
// of their own.
type clients struct {
	hc     *http.Client
	tc     backendv1connect.TrainerServiceClient
	sc     backendv1connect.SamplerServiceClient
	health *grpchealth.Client
}

// newClients dials the worker of pool at addr: the gateway presents its certificate, and
// talks only to a worker whose certificate its authority issued for that pool.
func (b *Backend) newClients(addr, pool string) *clients {
	hc := mtls.HTTPClient(b.auth.DialConfig(pool))
	url := "https://" + addr
	opts := []connect.ClientOption{connect.WithGRPC(), connect.WithReadMaxBytes(1 << 30), connect.WithSendMaxBytes(1 << 30)}
	if ic := telemetry.ConnectInterceptor(); ic != nil { // the call's traceparent, for the worker's spans
		opts = append(opts, connect.WithInterceptors(ic))
	}
	return &clients{hc: hc, tc: backendv1connect.NewTrainerServiceClient(hc, url, opts...),
		sc: backendv1connect.NewSamplerServiceClient(hc, url, opts...), health: grpchealth.NewClient(hc, url, connect.WithGRPC())}
}

// probe is a health check (pools.Probe), with the worker's capabilities when caps.
func (c *clients) probe(ctx context.Context, caps bool) (*backendv1.GetCapabilitiesResponse, error) {
	return pools.Probe(ctx, c.health, c.tc, caps)
}

// close closes the clients' idle connections (those in use close when their calls end).
func (c *clients) close() {
	if c != nil {
		c.hc.CloseIdleConnections()
	}
}

// workerCommand is the command that starts a local worker, before its arguments: the
// Command option, or the interpreter running loops_worker.
func (b *Backend) workerCommand() []string {
	if len(b.opts.Command) > 0 {
		return slices.Clone(b.opts.Command)
	}
	return []string{b.opts.Python, "-m", "loops_worker"}
}

// modelArgs turns the configured models into worker --model arguments; the built-in tiny
// model is written to disk first and passed as NAME=PATH.
func (b *Backend) modelArgs() ([]string, error) {
	var args []string
	for _, m := range b.opts.Models {
		if m == tiny.Name {
			dir := filepath.Join(b.opts.DataDir, "models", "loops-tiny")
			if err := tiny.Write(dir); err != nil {
				return nil, fmt.Errorf("writing the built-in model: %w", err)
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return nil, err
			}
			m = m + "=" + abs
		}
		args = append(args, "--model", m)
	}
	return args, nil
}

// start probes a worker given by address.
func (w *worker) start(ctx context.Context) error {
	cl := w.b.newClients(w.addr, w.pool)
	w.mu.Lock()
	w.cl = cl
	w.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, w.b.opts.HealthTimeout)
	defer cancel()
	caps, err := cl.tc.GetCapabilities(cctx, &backendv1.GetCapabilitiesRequest{})
	if err != nil {
		return fmt.Errorf("worker %s is not reachable: %w (is `loops worker --listen %s` or `python -m loops_worker --listen %s` running there?)", w.addr, err, w.addr, w.addr)
	}
	w.setAlive(caps)
	return nil
}

func (w *worker) setAlive(caps *backendv1.GetCapabilitiesResponse) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	w.alive = true
	w.why = ""
	w.caps = caps
	w.life, w.kill = context.WithCancelCause(context.Background())
	select {
	case <-w.up:
	default:
		close(w.up)
	}
}

// fail marks the worker dead (if gen matches, or gen < 0 for any), fails its in-flight
// calls and forgets its adapters.
func (w *worker) fail(gen int, reason string) {
	w.mu.Lock()
	if !w.alive || (gen >= 0 && gen != w.gen) {
		w.mu.Unlock()
		return
	}
	w.alive = false
	w.why = reason
	w.up = make(chan struct{})
	w.load.held = nil // a restarted worker has loaded nothing
	kill := w.kill
	name := fmt.Sprintf("worker %s", w.addr)
	w.mu.Unlock()
	closing := w.b.ctx.Err() != nil
	if !closing {
		w.b.log.Error("worker died", slog.Int("worker", w.idx), slog.String("reason", reason))
	}
	if kill != nil {
		kill(fmt.Errorf("%s died: %s", name, reason))
	}
	w.b.mu.Lock()
	now := time.Now()
	for id, aw := range w.b.adapters {
		if aw == w {
			delete(w.b.adapters, id)
			w.b.addLostLocked(id, fmt.Sprintf("%s died (%s) and its adapters are gone", name, reason), now)
		}
	}
	w.nAdapt = 0
	w.nFull = 0
	w.b.mu.Unlock()
}

func (w *worker) stop() { w.fail(-1, "the backend is closing") }

// healthLoop probes the worker; HealthFailures failures in a row declare it dead. A dead
// remote worker is probed until it answers again.
func (w *worker) healthLoop() {
	fails := 0
	t := time.NewTicker(w.b.opts.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-w.b.ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		alive, gen, cl := w.alive, w.gen, w.cl
		w.mu.Unlock()
		if !alive && w.pooled {
			fails = 0
			continue // the registry brings it back
		}
		if cl == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(w.b.ctx, w.b.opts.HealthTimeout)
		caps, err := cl.probe(ctx, !alive) // back: what it serves now
		cancel()
		switch {
		case err == nil && !alive:
			w.setAlive(caps)
			w.b.log.Warn("worker is back; the adapters it held are gone until their runs reload a checkpoint", slog.Int("worker", w.idx))
			fails = 0
		case err == nil:
			fails = 0
		case alive:
			fails++
			if fails >= w.b.opts.HealthFailures {
				why := fmt.Sprintf("it failed %d health checks in a row (%v)", fails, err)
				w.fail(gen, why)
				w.b.restartReplica(w, why)
				fails = 0
			}
		}
	}
}

// acquire returns the worker's life context if it is alive; otherwise an Unavailable error.
func (w *worker) acquire() (context.Context, int, *clients, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.alive {
		name := "worker " + w.addr
		return nil, 0, nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s is down (%s); it is being restarted, retry shortly", name, w.why))
	}
	return w.life, w.gen, w.cl, nil
}

// waitAlive waits until w is up. A pool slot is waited for only while it holds a
// replica's client (attached, or lost and expected back, e.g. restarting): it returns as
// soon as the slot holds none (never attached, or its replica was scaled away, which can
// happen during the wait, hence the poll).
func (w *worker) waitAlive(ctx context.Context) error {
	for {
		w.mu.Lock()
		held, up := w.cl != nil, w.up
		w.mu.Unlock()
		var poll <-chan time.Time
		if w.pooled {
			if !held {
				return nil
			}
			poll = time.After(100 * time.Millisecond)
		}
		select {
		case <-up:
			if _, _, _, err := w.acquire(); err == nil {
				return nil
			}
		case <-poll: // the slot may have been freed
		case <-ctx.Done():
			_, _, _, err := w.acquire()
			return err
		}
	}
}

// call runs one RPC on w, failing it with CodeUnavailable when the worker dies meanwhile.
func call[Req, Resp any](ctx context.Context, w *worker, method string, pick func(*clients) func(context.Context, *Req) (*Resp, error), req *Req) (*Resp, error) {
	life, gen, cl, err := w.acquire()
	if err != nil {
		return nil, err
	}
	f := pick(cl)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(life, cancel)
	defer stop()
	if d := w.b.opts.CallTimeout; d > 0 {
		t := time.AfterFunc(d, func() {
			why := fmt.Sprintf("a %s call ran for more than %v (call_timeout); it is presumed hung", method, d)
			w.fail(gen, why)
			w.b.restartReplica(w, why)
		})
		defer t.Stop()
	}
	resp, err := f(cctx, req)
	if err == nil {
		return resp, nil
	}
	if life.Err() != nil {
		return nil, connect.NewError(connect.CodeUnavailable, context.Cause(life))
	}
	if ctx.Err() != nil || errors.Is(err, errSinkGone) {
		return nil, err
	}
	// The caller did not cancel, so Canceled here is a reset connection (connect-go maps some
	// resets to it), as are Unavailable and transport-level Unknown errors.
	code := connect.CodeOf(err)
	if code == connect.CodeUnavailable || code == connect.CodeCanceled || code == connect.CodeUnknown && isTransport(err) {
		return nil, w.dropped(ctx, life, gen, cl, err)
	}
	return nil, err
}

// dropWait bounds how long a call whose connection dropped waits for the worker's
// liveness to say whether the worker died: the other workers' results of a batch wait for
// this one's answer.
const dropWait = 750 * time.Millisecond

// dropped answers a call whose connection to w dropped (err), as soon as the worker's own
// liveness says what happened, and within dropWait: its life ends (the local provider saw
// the process exit, the registry lost its lease), or a probe on a new connection is
// refused (nothing listens there any more: the worker is marked down at once, its
// adapters lost) or answered (the worker lives; only the call was lost). Either way the
// answer is Unavailable: the gateway's recovery path.
func (w *worker) dropped(ctx context.Context, life context.Context, gen int, cl *clients, err error) error {
	pctx, cancel := context.WithTimeout(ctx, dropWait)
	defer cancel()
	probe := make(chan error, 1)
	go func() {
		_, perr := cl.tc.GetCapabilities(pctx, &backendv1.GetCapabilitiesRequest{})
		probe <- perr
	}()
	select {
	case <-life.Done():
		return connect.NewError(connect.CodeUnavailable, context.Cause(life))
	case perr := <-probe:
		if life.Err() != nil {
			return connect.NewError(connect.CodeUnavailable, context.Cause(life))
		}
		if perr == nil {
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s dropped the call's connection (%v); it still answers, so retry", w.name(), err))
		}
		if refused(perr) {
			why := fmt.Sprintf("it dropped a call's connection and refuses new ones (%v)", perr)
			w.fail(gen, why)
			w.b.restartReplica(w, why)
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s died: %s", w.name(), why))
		}
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s is unreachable: %v", w.name(), err))
	}
}

// refused reports whether err is a connection refused: nothing listens at the address.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

func isTransport(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// ---- routing ---------------------------------------------------------------------------------

func (b *Backend) adapterWorker(id string) (*worker, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.adapters[id]; ok {
		b.touchLocked(w)
		return w, nil
	}
	if why, ok := b.lostLocked(id, time.Now()); ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("adapter %q does not exist any more: %s; load the run's last checkpoint to continue", id, why))
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("adapter %q does not exist; create it with CreateAdapter first", id))
}

func serves(caps *backendv1.GetCapabilitiesResponse, names ...string) bool {
	for _, m := range caps.GetModels() {
		for _, n := range names {
			if n != "" && (m.GetName() == n || m.GetTokenizerId() == n) {
				return true
			}
		}
	}
	return false
}

// pick chooses a worker of pool ("": the shared pools) serving the model (fewest adapters
// first; alive preferred).
func (b *Backend) pick(pool string, names ...string) (*worker, error) {
	return b.pickAdapter(pool, false, names...)
}

// pickAdapter is pick for a new adapter; full (a full fine-tuning run, LoRA rank 0) prefers
// the workers holding the fewest full runs, before the fewest adapters: each such run holds
// its own copy of the model, and a worker holds few (the torch worker's
// --full-finetune-runs).
func (b *Backend) pickAdapter(pool string, full bool, names ...string) (*worker, error) {
	var best *worker
	var served []string
	seen := map[string]bool{}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.workers)
	for k := range n {
		w := b.workers[(b.rr+k)%n]
		w.mu.Lock()
		caps, alive, na, nf, wpool := w.caps, w.alive, w.nAdapt, w.nFull, w.pool
		w.mu.Unlock()
		if !b.inPoolLocked(wpool, pool) || b.roles[wpool] == pools.RoleSampler {
			continue // another pool's, or a sampler replica (pick places adapters)
		}
		for _, m := range caps.GetModels() {
			if !seen[m.GetName()] {
				seen[m.GetName()] = true
				served = append(served, m.GetName())
			}
		}
		if caps == nil || !serves(caps, names...) {
			continue
		}
		if best == nil {
			best = w
			continue
		}
		best.mu.Lock()
		bAlive, bN, bF := best.alive, best.nAdapt, best.nFull
		best.mu.Unlock()
		if !full {
			nf, bF = 0, 0
		}
		if (alive && !bAlive) || (alive == bAlive && (nf < bF || nf == bF && na < bN)) {
			best = w
		}
	}
	b.rr++
	if best == nil && b.configured(names...) {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("no trainer replica serving base model %q is up yet (starting, restarting or being attached); retry shortly", names[0]))
	}
	if best == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("base model %q is not served by any worker of this backend; served models: %v (start the workers with that model, e.g. --model %s)", names[0], served, names[0]))
	}
	return best, nil
}

// configured reports whether one of names is a model the backend was configured to
// serve (its workers are started with it, so none serving it is a passing state).
func (b *Backend) configured(names ...string) bool {
	for _, m := range b.opts.Models {
		name, _, _ := strings.Cut(m, "=")
		if slices.Contains(names, name) {
			return true
		}
	}
	return false
}

type trainer Backend

type sampler Backend

var (
	_ backendv1connect.TrainerServiceHandler = (*trainer)(nil)
	_ backends.Sampler                       = (*sampler)(nil)
)

func (b *Backend) capabilities() *backendv1.GetCapabilitiesResponse {
	out := &backendv1.GetCapabilitiesResponse{Implementation: Name}
	seen := map[string]bool{}
	known := 0
	for _, w := range b.workers {
		w.mu.Lock()
		caps := w.caps
		w.mu.Unlock()
		if caps == nil {
			continue
		}
		if out.LossFunctions == nil {
			out.LossFunctions = caps.GetLossFunctions()
		}
		// an adapter may land on any worker: gradients move only if every worker moves them
		out.SavesGradients = caps.GetSavesGradients() && (known == 0 || out.SavesGradients)
		// and checkpoints come as URLs only if every worker takes them
		out.CheckpointUrls = caps.GetCheckpointUrls() && (known == 0 || out.CheckpointUrls)
		known++
		out.MaxAdapters += caps.GetMaxAdapters()
		for _, m := range caps.GetModels() {
			if !seen[m.GetName()] {
				seen[m.GetName()] = true
				out.Models = append(out.Models, m)
			}
		}
	}
	return out
}

func (t *trainer) GetCapabilities(context.Context, *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return (*Backend)(t).capabilities(), nil
}

func (s *sampler) GetCapabilities(context.Context, *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return (*Backend)(s).capabilities(), nil
}

func (t *trainer) CreateAdapter(ctx context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	b := (*Backend)(t)
	if req.GetAdapterId() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("adapter_id is required"))
	}
	b.mu.Lock()
	_, exists := b.adapters[req.GetAdapterId()]
	b.mu.Unlock()
	if exists {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("adapter %q already exists; delete it first or pick another id", req.GetAdapterId()))
	}
	if err := b.usePool(ctx, req.GetPool(), false); err != nil {
		return nil, err
	}
	full := req.GetLora() != nil && req.GetLora().GetRank() == 0
	w, err := b.pickAdapter(req.GetPool(), full, req.GetBaseModel())
	if err != nil {
		return nil, err
	}
	create := func(c *clients) func(context.Context, *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
		return c.tc.CreateAdapter
	}
	resp, err := call(ctx, w, "CreateAdapter", create, req)
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		// The worker holds an adapter this backend no longer binds: one left on a replica
		// that was declared lost (missed heartbeats) and came back as the same incarnation.
		// It is an orphan: replace it.
		b.log.Warn("a replica still held an adapter it had been declared to have lost; replacing it", slog.String("adapter", req.GetAdapterId()), slog.String("worker", w.name()))
		if _, derr := call(ctx, w, "DeleteAdapter", func(c *clients) func(context.Context, *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
			return c.tc.DeleteAdapter
		}, &backendv1.DeleteAdapterRequest{AdapterId: req.GetAdapterId()}); derr != nil {
			return nil, derr
		}
		resp, err = call(ctx, w, "CreateAdapter", create, req)
	}
	if err != nil {
		return nil, err
	}
	b.bind(req.GetAdapterId(), w, full)
	return resp, nil
}

// unbindLocked forgets that worker w holds adapter id (a deleted adapter); b.mu is held.
func (b *Backend) unbindLocked(id string, w *worker) {
	if b.adapters[id] == w {
		delete(b.adapters, id)
		w.mu.Lock()
		w.nAdapt--
		if b.full[id] {
			w.nFull--
		}
		w.mu.Unlock()
	}
	delete(b.full, id)
}

// bind records that worker w holds adapter id; full marks it a full fine-tuning run.
func (b *Backend) bind(id string, w *worker, full bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if full {
		if b.full == nil {
			b.full = map[string]bool{}
		}
		b.full[id] = true
	}
	if old, ok := b.adapters[id]; ok && old == w {
		return
	}
	b.adapters[id] = w
	delete(b.lost, id)
	w.mu.Lock()
	w.nAdapt++
	if b.full[id] {
		w.nFull++
	}
	w.mu.Unlock()
}

func (t *trainer) DeleteAdapter(ctx context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	b := (*Backend)(t)
	b.mu.Lock()
	w, ok := b.adapters[req.GetAdapterId()]
	delete(b.lost, req.GetAdapterId())
	b.mu.Unlock()
	if !ok {
		return &backendv1.DeleteAdapterResponse{}, nil
	}
	resp, err := call(ctx, w, "DeleteAdapter", func(c *clients) func(context.Context, *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
		return c.tc.DeleteAdapter
	}, req)
	if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
		return nil, err
	}
	b.mu.Lock()
	b.unbindLocked(req.GetAdapterId(), w)
	b.mu.Unlock()
	if resp == nil {
		resp = &backendv1.DeleteAdapterResponse{}
	}
	return resp, nil
}

func itemErr(err error) *backendv1.ForwardBackwardItemResult {
	return &backendv1.ForwardBackwardItemResult{Outcome: &backendv1.ForwardBackwardItemResult_Error{
		Error: &backendv1.ItemError{Code: int32(connect.CodeOf(err)), Message: errMessage(err)}}}
}

func errMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

func (t *trainer) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	b := (*Backend)(t)
	if len(req.GetItems()) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the request has no items"))
	}
	results := make([]*backendv1.ForwardBackwardItemResult, len(req.GetItems()))
	type group struct {
		w   *worker
		idx []int
		req *backendv1.ForwardBackwardRequest
	}
	var groups []*group
	byW := map[*worker]*group{}
	for i, it := range req.GetItems() {
		w, err := b.adapterWorker(it.GetAdapterId())
		if err != nil {
			results[i] = itemErr(err)
			continue
		}
		g := byW[w]
		if g == nil {
			g = &group{w: w, req: &backendv1.ForwardBackwardRequest{}}
			byW[w] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.req.Items = append(g.req.Items, it)
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for gi, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := call(ctx, g.w, "ForwardBackward", func(c *clients) func(context.Context, *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
				return c.tc.ForwardBackward
			}, g.req)
			if err == nil && len(resp.GetResults()) != len(g.idx) {
				err = connect.NewError(connect.CodeInternal, fmt.Errorf("%s answered %d results for %d items", g.w.name(), len(resp.GetResults()), len(g.idx)))
			}
			if err != nil {
				errs[gi] = err
				for _, i := range g.idx {
					results[i] = itemErr(err)
				}
				return
			}
			for k, i := range g.idx {
				results[i] = resp.GetResults()[k]
			}
		}()
	}
	wg.Wait()
	// A whole-call failure of the only worker involved is the call's error (the gateway
	// then fails every operation of the batch with it).
	if len(groups) == 1 && errs[0] != nil && len(groups[0].idx) == len(results) {
		return nil, errs[0]
	}
	return &backendv1.ForwardBackwardResponse{Results: results}, nil
}

func (t *trainer) OptimStep(ctx context.Context, req *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	w, err := (*Backend)(t).adapterWorker(req.GetAdapterId())
	if err != nil {
		return nil, err
	}
	return call(ctx, w, "OptimStep", func(c *clients) func(context.Context, *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
		return c.tc.OptimStep
	}, req)
}

func (t *trainer) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	w, err := (*Backend)(t).adapterWorker(req.GetAdapterId())
	if err != nil {
		return nil, err
	}
	return call(ctx, w, "SaveAdapter", func(c *clients) func(context.Context, *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
		return c.tc.SaveAdapter
	}, req)
}

// LoadAdapter loads into the adapter's worker; an unknown adapter is created on a worker
// serving the folder's base_model_name_or_path (as the reference engine does).
func (t *trainer) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	b := (*Backend)(t)
	if req.GetAdapterId() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("adapter_id is required"))
	}
	w, err := b.adapterWorker(req.GetAdapterId())
	full := false
	if err != nil {
		base := folderBaseModel(req.GetDir())
		if base == "" {
			base, full = fullFolderBaseModel(req.GetDir())
		}
		if base == "" {
			return nil, err
		}
		w2, perr := b.pickAdapter("", full, base)
		if perr != nil {
			return nil, err
		}
		w = w2
	}
	resp, err := call(ctx, w, "LoadAdapter", func(c *clients) func(context.Context, *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
		return c.tc.LoadAdapter
	}, req)
	if err != nil {
		return nil, err
	}
	b.bind(req.GetAdapterId(), w, full)
	return resp, nil
}

// FullMarker is the file that makes a folder a full fine-tuning checkpoint of the torch
// worker (its full.MARKER): JSON naming base_model, among other fields.
const FullMarker = "loops_full_finetune.json"

// fullFolderBaseModel returns the base model a full fine-tuning checkpoint folder names
// (its FullMarker, read through a 64 KiB cap) and true, or "" and false.
func fullFolderBaseModel(dir string) (string, bool) {
	if !filepath.IsAbs(dir) {
		return "", false
	}
	f, err := os.Open(filepath.Join(dir, FullMarker))
	if err != nil {
		return "", false
	}
	defer f.Close()
	var m struct {
		BaseModel string `json:"base_model"`
	}
	if json.NewDecoder(io.LimitReader(f, 64<<10)).Decode(&m) != nil || m.BaseModel == "" {
		return "", false
	}
	return m.BaseModel, true
}

func folderBaseModel(dir string) string {
	if !filepath.IsAbs(dir) {
		return ""
	}
	c, _ := peft.ReadConfig(dir) // best effort: a field of the wrong type spoils no other
	return c.BaseModel
}

func (s *sampler) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	b := (*Backend)(s)
	if err := b.usePool(ctx, req.GetPool(), true); err != nil {
		return nil, err
	}
	w, done, err := b.pickSampler(req.GetPool(), req.GetBaseModel(), adapterKey(req))
	if err != nil {
		return nil, err
	}
	defer done()
	return call(ctx, w, "Sample", func(c *clients) func(context.Context, *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
		return c.sc.Sample
	}, req)
}

// ---- helpers -----------------------------------------------------------------------------------

var _ backends.WorkerHealth = (*Backend)(nil)

// WorkerHealth counts the workers that serve and those that are down; a pool slot that
// holds no replica (never attached, or its replica scaled away) is neither.
func (b *Backend) WorkerHealth() (up, down int) {
	b.mu.Lock()
	ws := slices.Clone(b.workers)
	b.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		switch {
		case w.alive:
			up++
		case !w.pooled || w.cl != nil:
			down++
		}
		w.mu.Unlock()
	}
	return up, down
}
