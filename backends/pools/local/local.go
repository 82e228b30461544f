package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
)

// Options configure the provider. Zero values mean the documented defaults.
type Options struct {
	// Registry is where the workers register (required); RegistryURL is its address as the
	// workers dial it (https://), and JoinTokenFile a file holding the join token (both
	// required).
	Registry      *pools.Registry
	RegistryURL   string
	JoinTokenFile string
	// Authority issues each worker process its credentials (required): written into a
	// folder of its own under the Authority's (mode 0700, files 0600), removed when the
	// process exits.
	Authority *mtls.Authority
	// AllowDirs are the folders the workers may read and write adapters in (the gateway's
	// data dir: its checkpoint staging, spill and local checkpoint store), passed as
	// --allow-dir; a path outside them in a request is refused by the worker.
	AllowDirs []string
	// Command starts a worker (default: python3 -m loops_worker); the provider appends
	// --listen 127.0.0.1:0 --register URL --pool ID --replica N --join-token-file F
	// --tls-cert F --tls-key F --tls-ca F --allow-dir D... --model BASE, --world-size N for a
	// trainer replica of N > 1 GPUs or --vllm-tensor-parallel-size N for such a sampler
	// replica (rankArgs), and the spec's Args.
	Command []string
	// Env are extra KEY=VALUE variables for the workers.
	Env []string
	// GPUs is the inventory of GPU ids (CUDA_VISIBLE_DEVICES values) the provider hands out;
	// a pool asking for more than are free is refused.
	GPUs []string
	// Backoff is the first delay before restarting an exited worker (default 1s), doubling
	// up to MaxBackoff (default 30s) while it keeps exiting within a minute.
	Backoff, MaxBackoff time.Duration
	// Logger receives worker events and stderr lines (default slog.Default()).
	Logger *slog.Logger
	// InheritGPUs: with no GPU inventory, workers keep this process's CUDA_VISIBLE_DEVICES
	// (see every GPU it sees) instead of none. The torch backend's default mode sets it.
	InheritGPUs bool
	// OnExit, when set, is told every time a worker process exits, with why (its exit status
	// and the last lines of its stderr).
	OnExit func(pool string, replica int, why string)
}

// Provider is the local provider.
type Provider struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	pools  map[string]*pool
	free   []string // GPU ids not assigned
	closed bool
	wg     sync.WaitGroup
}

type pool struct {
	spec     pools.Spec
	replicas map[int]*replica
}

type replica struct {
	gpus   []string
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	pid int
}

var (
	_ pools.Provider   = (*Provider)(nil)
	_ pools.SpecReader = (*Provider)(nil)
)

// New returns a provider.
func New(o Options) (*Provider, error) {
	if o.Registry == nil || o.RegistryURL == "" || o.JoinTokenFile == "" || o.Authority == nil {
		return nil, errors.New("local pools: Registry, RegistryURL, JoinTokenFile and Authority are required")
	}
	if len(o.Command) == 0 {
		o.Command = []string{"python3", "-m", "loops_worker"}
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Provider{opts: o, log: o.Logger.With(slog.String("provider", "local")), pools: map[string]*pool{}, free: slices.Clone(o.GPUs)}, nil
}

// EnsurePool implements pools.Provider.
func (p *Provider) EnsurePool(ctx context.Context, spec pools.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("local pools: the provider is closed")
	}
	pl := p.pools[spec.ID]
	if pl != nil && (pl.spec.BaseModel != spec.BaseModel || pl.spec.Role != spec.Role || pl.spec.GPUsPerReplica != spec.GPUsPerReplica || !slices.Equal(pl.spec.Args, spec.Args)) {
		p.mu.Unlock()
		return fmt.Errorf("pool %s exists with another shape (%s %s, %d GPUs per replica); delete it first", spec.ID, pl.spec.Role, pl.spec.BaseModel, pl.spec.GPUsPerReplica)
	}
	if pl == nil {
		if need := spec.Replicas * spec.GPUsPerReplica; need > len(p.free) {
			p.mu.Unlock()
			return fmt.Errorf("pool %s needs %d GPUs (%d replicas × %d) but %d of this host's %d are free (local provider inventory: --backend-opt gpus=0,1,...)", spec.ID, need, spec.Replicas, spec.GPUsPerReplica, len(p.free), len(p.opts.GPUs))
		}
		pl = &pool{spec: spec, replicas: map[int]*replica{}}
		p.pools[spec.ID] = pl
	}
	p.mu.Unlock()
	return p.ScalePool(ctx, spec.ID, spec.Replicas)
}

// ScalePool implements pools.Provider.
func (p *Provider) ScalePool(_ context.Context, id string, n int) error {
	if n < 0 || n > pools.MaxReplicas {
		return fmt.Errorf("pool %s: replicas %d must be between 0 and %d", id, n, pools.MaxReplicas)
	}
	p.mu.Lock()
	pl := p.pools[id]
	if pl == nil {
		p.mu.Unlock()
		return fmt.Errorf("pool %q: %w", id, pools.ErrNoPool)
	}
	g := pl.spec.GPUsPerReplica
	if need := (n - len(pl.replicas)) * g; need > len(p.free) {
		p.mu.Unlock()
		return fmt.Errorf("pool %s: %d more replicas need %d GPUs but %d are free", id, n-len(pl.replicas), need, len(p.free))
	}
	pl.spec.Replicas = n
	var stopping []*replica
	for i, r := range pl.replicas {
		if i >= n {
			r.cancel() // before the registry drains it: its clean exit is then a stop, not a crash
			stopping = append(stopping, r)
			delete(pl.replicas, i)
			p.free = append(p.free, r.gpus...)
		}
	}
	p.opts.Registry.SetDesired(id, n)
	for i := range n {
		if pl.replicas[i] != nil {
			continue
		}
		r := &replica{gpus: slices.Clone(p.free[:g]), done: make(chan struct{})}
		p.free = p.free[g:]
		ctx, cancel := context.WithCancel(context.Background())
		r.cancel = cancel
		pl.replicas[i] = r
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.supervise(ctx, pl.spec, i, r)
		}()
	}
	p.mu.Unlock()
	for _, r := range stopping {
		<-r.done
	}
	return nil
}

// DeletePool implements pools.Provider.
func (p *Provider) DeletePool(_ context.Context, id string) error {
	p.mu.Lock()
	pl := p.pools[id]
	delete(p.pools, id)
	var rs []*replica
	if pl != nil {
		for _, r := range pl.replicas {
			rs = append(rs, r)
			p.free = append(p.free, r.gpus...)
		}
	}
	p.mu.Unlock()
	for _, r := range rs {
		r.cancel()
		<-r.done
	}
	if pl != nil {
		p.opts.Registry.DropPool(id, "the pool was deleted")
	}
	return nil
}

// Watch implements pools.Provider.
func (p *Provider) Watch(ctx context.Context, id string) (<-chan pools.Event, error) {
	p.mu.Lock()
	_, ok := p.pools[id]
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("pool %q: %w", id, pools.ErrNoPool)
	}
	return p.opts.Registry.Watch(ctx, id), nil
}

// PID returns the process id of a replica's current worker (0 if none runs).
func (p *Provider) PID(id string, i int) int {
	r := p.replica(id, i)
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pid
}

// Restart kills the process of replica i of pool id, if one runs, for the provider to start
// it again (a worker the backend found hung). why is logged.
func (p *Provider) Restart(id string, i int, why string) {
	r := p.replica(id, i)
	if r == nil {
		return
	}
	r.mu.Lock()
	pid := r.pid
	r.mu.Unlock()
	if pid > 0 {
		p.log.Warn("killing a worker to restart it", slog.String("pool", id), slog.Int("replica", i), slog.Int("pid", pid), slog.String("why", why))
		_ = syscall.Kill(-pid, syscall.SIGKILL) // its process group (Setpgid)
	}
}

// replica returns replica i of pool id (nil if none).
func (p *Provider) replica(id string, i int) *replica {
	p.mu.Lock()
	pl := p.pools[id]
	var r *replica
	if pl != nil {
		r = pl.replicas[i]
	}
	p.mu.Unlock()
	return r
}

// Spec implements pools.SpecReader.
func (p *Provider) Spec(id string) (pools.Spec, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.pools[id]
	if pl == nil {
		return pools.Spec{}, false
	}
	s := pl.spec
	s.Args = slices.Clone(s.Args)
	return s, true
}

// GPUs returns the GPU ids (its CUDA_VISIBLE_DEVICES) assigned to a replica of a pool;
// nil for a replica that holds none or does not exist.
func (p *Provider) GPUs(id string, i int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl := p.pools[id]; pl != nil {
		if r := pl.replicas[i]; r != nil && len(r.gpus) > 0 {
			return slices.Clone(r.gpus)
		}
	}
	return nil
}

// Close stops every worker process.
func (p *Provider) Close() error {
	p.mu.Lock()
	p.closed = true
	var ids []string
	for id := range p.pools {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		_ = p.DeletePool(context.Background(), id)
	}
	p.wg.Wait()
	return nil
}

// supervise runs replica i until ctx ends, restarting it with back-off.
func (p *Provider) supervise(ctx context.Context, spec pools.Spec, i int, r *replica) {
	defer close(r.done)
	log := p.log.With(slog.String("pool", spec.ID), slog.Int("replica", i))
	delay := p.opts.Backoff
	for ctx.Err() == nil {
		start := time.Now()
		err := p.runOnce(ctx, spec, i, r, log)
		if ctx.Err() != nil {
			p.opts.Registry.Remove(spec.ID, i, "stopped by the provider")
			return
		}
		p.opts.Registry.Remove(spec.ID, i, "its process exited: "+err.Error())
		if p.opts.OnExit != nil {
			p.opts.OnExit(spec.ID, i, err.Error())
		}
		if time.Since(start) > time.Minute {
			delay = p.opts.Backoff
		}
		log.Warn("worker exited; restarting", slog.String("err", err.Error()), slog.Duration("in", delay))
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, p.opts.MaxBackoff)
	}
}

// watchHung reports (once) when replica i of pool, whose process still runs, was declared
// lost by the registry (no heartbeat) and did not register again within a heartbeat timeout:
// a hung process, which is then killed so that supervise starts a new one.
func (p *Provider) watchHung(ctx context.Context, pool string, i int) <-chan string {
	out := make(chan string, 1)
	grace := p.opts.Registry.HeartbeatTimeout()
	go func() {
		evs := p.opts.Registry.Watch(ctx, pool)
		var timer <-chan time.Time
		var why string
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-evs:
				if !ok {
					return
				}
				switch {
				case ev.Replica != i:
				case ev.Kind == pools.Lost:
					why, timer = ev.Reason, time.After(grace)
				case ev.Kind == pools.Up:
					timer = nil // it came back
				}
			case <-timer:
				out <- why
				return
			}
		}
	}()
	return out
}

// credentials issues the credentials of replica i of pool and writes them into a folder
// of its own; remove removes it.
func (p *Provider) credentials(pool string, i int) (files mtls.Files, remove func(), err error) {
	creds, err := p.opts.Authority.Issue(pool, 0)
	if err != nil {
		return mtls.Files{}, nil, err
	}
	dir := filepath.Join(p.opts.Authority.Dir(), "local", pool+"-"+strconv.Itoa(i))
	if files, err = creds.Write(dir); err != nil {
		return mtls.Files{}, nil, err
	}
	return files, func() { _ = os.RemoveAll(dir) }, nil
}

// rankArgs are the worker arguments that spread a replica of N > 1 GPUs over its GPUs: a
// trainer replica is one process group of N ranks (--world-size N: the torch worker's
// sharded training and sampling, its rank 0 starting the others), a sampler replica one
// process whose vLLM is tensor-parallel over the N GPUs (--vllm-tensor-parallel-size N:
// vLLM starts a worker process per GPU); none for one GPU or CPU.
func rankArgs(spec pools.Spec) []string {
	switch {
	case spec.GPUsPerReplica < 2:
		return nil
	case spec.Role == pools.RoleTrainer:
		return []string{"--world-size", strconv.Itoa(spec.GPUsPerReplica)}
	case spec.Role == pools.RoleSampler:
		return []string{"--vllm-tensor-parallel-size", strconv.Itoa(spec.GPUsPerReplica)}
	}
	return nil
}

func (p *Provider) runOnce(ctx context.Context, spec pools.Spec, i int, r *replica, log *slog.Logger) error {
	files, remove, err := p.credentials(spec.ID, i)
	if err != nil {
		return fmt.Errorf("issuing the worker's credentials: %w", err)
	}
	defer remove()
	args := append(slices.Clone(p.opts.Command[1:]), "--listen", "127.0.0.1:0", "--register", p.opts.RegistryURL,
		"--pool", spec.ID, "--replica", strconv.Itoa(i), "--join-token-file", p.opts.JoinTokenFile)
	args = append(args, files.Args()...)
	for _, d := range p.opts.AllowDirs {
		args = append(args, "--allow-dir", d)
	}
	args = append(args, "--model", spec.BaseModel)
	args = append(args, rankArgs(spec)...)
	args = append(args, spec.Args...)
	cmd := exec.Command(p.opts.Command[0], args...)
	cmd.Env = append(os.Environ(), "LOOPS_WORKER_EXIT_ON_STDIN_EOF=1", "PYTHONUNBUFFERED=1")
	if len(r.gpus) > 0 || !p.opts.InheritGPUs || len(p.opts.GPUs) > 0 {
		cmd.Env = append(cmd.Env, "CUDA_VISIBLE_DEVICES="+strings.Join(r.gpus, ","))
	}
	cmd.Env = append(cmd.Env, p.opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe() // closed when we exit: the worker exits too
	if err != nil {
		return err
	}
	defer stdin.Close()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	tail := pools.NewTail(8)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start %s: %w", p.opts.Command[0], err)
	}
	r.mu.Lock()
	r.pid = cmd.Process.Pid
	r.mu.Unlock()
	log.Info("worker started", slog.Int("pid", cmd.Process.Pid), slog.String("gpus", strings.Join(r.gpus, ",")))
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			tail.Add(sc.Text())
			log.Debug("worker stderr", slog.String("line", sc.Text()))
		}
	}()
	exited := make(chan error, 1)
	go func() {
		<-logged
		exited <- cmd.Wait()
	}()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	hung := p.watchHung(wctx, spec.ID, i)
	select {
	case err = <-exited:
	case <-ctx.Done():
		pools.KillGroup(cmd)
		err = <-exited
	case why := <-hung:
		log.Warn("worker stopped heartbeating and did not register again; killing it to restart it", slog.String("why", why), slog.Int("pid", cmd.Process.Pid))
		pools.KillGroup(cmd)
		err = <-exited
		err = fmt.Errorf("killed after it was lost (%s) and did not come back: %v", why, err)
	}
	r.mu.Lock()
	r.pid = 0
	r.mu.Unlock()
	if err == nil { // a clean exit (a drained worker) is still an exit to restart from
		err = errors.New("it exited with status 0")
	}
	if t := tail.String(); t != "" {
		return fmt.Errorf("%v; last stderr: %s", err, t)
	}
	return err
}
