package ray

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
)

// JoinTokenEnv is the environment variable that carries the join token to the pool driver
// (in the job's runtime_env, with the workers' TLS credentials, mtls.EnvCert, EnvKey and
// EnvCA: whoever reads the Ray dashboard's job details reads them, as whoever may submit
// a job there runs code on the cluster; keep the dashboard private).
const JoinTokenEnv = "LOOPS_JOIN_TOKEN"

// Options configure the provider. Zero values mean the documented defaults.
type Options struct {
	// Client reaches the Ray dashboard (required).
	Client *Client
	// Registry is where the workers register (required); RegistryURL is its address as the
	// Ray nodes dial it (https://, required); JoinToken is the Registry's token (required).
	Registry    *pools.Registry
	RegistryURL string
	JoinToken   string
	// Authority issues each pool's worker credentials (required), passed to its driver in
	// the job's runtime_env.
	Authority *mtls.Authority
	// ListenHost is the host the worker actors listen on (default 127.0.0.1: reachable
	// only from their own node). A gateway on another host than the Ray nodes needs it set
	// explicitly, to 0.0.0.0 or a node interface's address; the workers then advertise
	// their node's address, and accept only the gateway (mutual TLS).
	ListenHost string
	// Python runs the pool driver on the head node (default python3); it needs ray and
	// loops_worker importable (through EnvVars' PYTHONPATH, or installed).
	Python string
	// EnvVars are set for the driver and its actors (runtime_env env_vars).
	EnvVars map[string]string
	// ActorRestarts is the worker actors' max_restarts (default -1: always).
	ActorRestarts int
	// MonitorInterval is the time between job status checks (default 5s).
	MonitorInterval time.Duration
	Logger          *slog.Logger
}

// DriverSpec is what the pool driver is told (--spec JSON; no secret: those are in its
// environment).
type DriverSpec struct {
	Pool          pools.Spec `json:"pool"`
	RegistryURL   string     `json:"registry_url"`
	ActorRestarts int        `json:"actor_restarts"`
	// ListenHost is where the actors listen (Options.ListenHost).
	ListenHost string `json:"listen_host"`
}

// Provider is the ray provider.
type Provider struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	pools map[string]*pool
	wg    sync.WaitGroup
}

type pool struct {
	spec   pools.Spec
	cancel context.CancelFunc
	done   chan struct{}
}

var (
	_ pools.Provider   = (*Provider)(nil)
	_ pools.SpecReader = (*Provider)(nil)
)

// New returns a provider.
func New(o Options) (*Provider, error) {
	if o.Client == nil || o.Registry == nil || o.RegistryURL == "" || o.JoinToken == "" || o.Authority == nil {
		return nil, errors.New("ray pools: Client, Registry, RegistryURL, JoinToken and Authority are required")
	}
	if o.ListenHost == "" {
		o.ListenHost = "127.0.0.1"
	}
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.ActorRestarts == 0 {
		o.ActorRestarts = -1
	}
	if o.MonitorInterval <= 0 {
		o.MonitorInterval = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Provider{opts: o, log: o.Logger.With(slog.String("provider", "ray")), pools: map[string]*pool{}}, nil
}

// JobID is the submission id of a pool's driver job.
func JobID(pool string) string { return "loops-pool-" + pool }

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// submitRequest is the driver job of spec. It carries secrets (the join token, the
// workers' key) in its runtime_env: never log it.
func (p *Provider) submitRequest(spec pools.Spec) (SubmitRequest, error) {
	b, err := json.Marshal(DriverSpec{Pool: spec, RegistryURL: p.opts.RegistryURL, ActorRestarts: p.opts.ActorRestarts, ListenHost: p.opts.ListenHost})
	if err != nil {
		return SubmitRequest{}, err
	}
	creds, err := p.opts.Authority.Issue(spec.ID, 0)
	if err != nil {
		return SubmitRequest{}, err
	}
	env := map[string]string{}
	for k, v := range p.opts.EnvVars {
		env[k] = v
	}
	env[JoinTokenEnv] = p.opts.JoinToken
	for k, v := range creds.Env() {
		env[k] = v
	}
	return SubmitRequest{
		Entrypoint:   shellQuote(p.opts.Python) + " -m loops_worker.ray_pool --spec " + shellQuote(string(b)),
		SubmissionID: JobID(spec.ID),
		RuntimeEnv:   map[string]any{"env_vars": env},
		Metadata:     map[string]string{"loops_pool": spec.ID, "loops_role": string(spec.Role)},
		// no entrypoint resources: the driver then runs on the head node (Ray's default), not
		// on a worker node whose loss would take it down with its replicas
	}, nil
}

// EnsurePool implements pools.Provider: it records the desired size, then submits the
// driver job unless one for the pool is already pending or running (a gateway restarted).
func (p *Provider) EnsurePool(ctx context.Context, spec pools.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	pl := p.pools[spec.ID]
	if pl != nil {
		same := pl.spec.BaseModel == spec.BaseModel && pl.spec.Role == spec.Role && pl.spec.GPUsPerReplica == spec.GPUsPerReplica && slices.Equal(pl.spec.Args, spec.Args)
		p.mu.Unlock()
		if !same {
			return fmt.Errorf("pool %s exists with another shape (%s %s, %d GPUs per replica); delete it first", spec.ID, pl.spec.Role, pl.spec.BaseModel, pl.spec.GPUsPerReplica)
		}
		return p.ScalePool(ctx, spec.ID, spec.Replicas)
	}
	p.mu.Unlock()
	// The registry knows the pool before its driver starts: a driver whose first WatchPool
	// finds no pool exits (NOT_FOUND means deleted), and the monitor would submit it again.
	p.opts.Registry.SetDesired(spec.ID, spec.Replicas)
	if err := p.submit(ctx, spec); err != nil {
		p.mu.Lock()
		if p.pools[spec.ID] == nil { // nobody else made it meanwhile
			p.opts.Registry.DropPool(spec.ID, "its driver could not be submitted")
		}
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pools[spec.ID] != nil { // a concurrent EnsurePool won
		return nil
	}
	mctx, cancel := context.WithCancel(context.Background())
	pl = &pool{spec: spec, cancel: cancel, done: make(chan struct{})}
	p.pools[spec.ID] = pl
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(pl.done)
		p.monitor(mctx, spec)
	}()
	return nil
}

// submit starts the driver job, adopting a live one and clearing a finished one.
func (p *Provider) submit(ctx context.Context, spec pools.Spec) error {
	id := JobID(spec.ID)
	req, err := p.submitRequest(spec)
	if err != nil {
		return err
	}
	info, err := p.opts.Client.Job(ctx, id)
	if err == nil && !Terminal(info.Status) && info.Entrypoint != req.Entrypoint {
		// a driver of another gateway configuration (registry URL, model, args): replace it
		p.log.Warn("stopping a pool driver started with another spec", slog.String("pool", spec.ID), slog.String("job", id))
		if _, err := p.opts.Client.Stop(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("pool %s: stopping the stale driver job %s: %w", spec.ID, id, err)
		}
		for i := 0; i < 60 && err == nil && !Terminal(info.Status); i++ {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
			info, err = p.opts.Client.Job(ctx, id)
		}
	}
	switch {
	case err == nil && !Terminal(info.Status):
		if info.Entrypoint != req.Entrypoint {
			return fmt.Errorf("pool %s: the stale driver job %s did not stop within 30s (status %s)", spec.ID, id, info.Status)
		}
		p.log.Info("adopting the running pool driver", slog.String("pool", spec.ID), slog.String("job", id), slog.String("status", info.Status))
		return nil
	case err == nil:
		if _, err := p.opts.Client.Delete(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("pool %s: clearing the finished driver job %s: %w", spec.ID, id, err)
		}
	case !errors.Is(err, ErrNotFound):
		return fmt.Errorf("pool %s: %w", spec.ID, err)
	}
	if err := p.submitFreed(ctx, req); err != nil {
		// the dashboard's answer may quote the request: none of its secrets goes further
		return fmt.Errorf("pool %s: submitting the pool driver: %w", spec.ID, redacted(err, req.RuntimeEnv))
	}
	p.log.Info("pool driver submitted", slog.String("pool", spec.ID), slog.String("job", id), slog.Int("replicas", spec.Replicas))
	return nil
}

// idFreedWithin bounds how long submit waits for the cluster to free a deleted driver
// job's submission id, and idFreedPoll is how often it asks meanwhile.
const (
	idFreedWithin = 30 * time.Second
	idFreedPoll   = 250 * time.Millisecond
)

// submitFreed submits req once its submission id is free: Ray deletes a job's record
// asynchronously, so a submission right after the delete can find the id still taken
// (ErrExists); it is tried again until the id is free, for up to idFreedWithin.
func (p *Provider) submitFreed(ctx context.Context, req SubmitRequest) error {
	deadline := time.Now().Add(idFreedWithin)
	for {
		_, err := p.opts.Client.Submit(ctx, req)
		if !errors.Is(err, ErrExists) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(idFreedPoll):
		}
	}
}

// monitor resubmits the driver when its job ends while the pool should exist.
func (p *Provider) monitor(ctx context.Context, spec pools.Spec) {
	delay := p.opts.MonitorInterval
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.opts.MonitorInterval):
		}
		info, err := p.opts.Client.Job(ctx, JobID(spec.ID))
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			p.log.Warn("cannot read the pool driver's status", slog.String("pool", spec.ID), slog.String("err", err.Error()))
			continue
		}
		if err == nil && !Terminal(info.Status) {
			delay = p.opts.MonitorInterval
			continue
		}
		why := "the driver job is gone"
		if info != nil {
			why = fmt.Sprintf("the driver job ended %s: %s", info.Status, info.Message)
			if logs, lerr := p.opts.Client.Logs(ctx, JobID(spec.ID)); lerr == nil {
				why += "; log tail: " + lastLines(logs, 5)
			}
		}
		p.log.Warn("pool driver ended; submitting it again", slog.String("pool", spec.ID), slog.String("why", why), slog.Duration("after", delay))
		for _, m := range p.opts.Registry.Members(spec.ID) {
			p.opts.Registry.Remove(spec.ID, m.Replica, why)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Minute)
		if n, ok := p.opts.Registry.Desired(spec.ID); ok {
			spec.Replicas = n
		}
		if err := p.submit(ctx, spec); err != nil && ctx.Err() == nil {
			p.log.Warn("resubmitting the pool driver failed", slog.String("pool", spec.ID), slog.String("err", err.Error()))
		}
	}
}

// redacted is err with every secret of a job's runtime_env env_vars (the join token, the
// workers' credentials, line by line) replaced.
func redacted(err error, runtimeEnv map[string]any) error {
	env, _ := runtimeEnv["env_vars"].(map[string]string)
	msg := err.Error()
	if tok := env[JoinTokenEnv]; tok != "" {
		msg = strings.ReplaceAll(msg, tok, "[redacted]")
	}
	for _, k := range []string{mtls.EnvKey, mtls.EnvCert} {
		for line := range strings.SplitSeq(env[k], "\n") {
			if line = strings.TrimSpace(line); len(line) >= 16 {
				msg = strings.ReplaceAll(msg, line, "[redacted]")
			}
		}
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// ScalePool implements pools.Provider: the driver follows the desired size (WatchPool).
func (p *Provider) ScalePool(_ context.Context, id string, n int) error {
	if n < 0 || n > pools.MaxReplicas {
		return fmt.Errorf("pool %s: replicas %d must be between 0 and %d", id, n, pools.MaxReplicas)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.pools[id]
	if pl == nil {
		return fmt.Errorf("pool %q: %w", id, pools.ErrNoPool)
	}
	pl.spec.Replicas = n
	p.opts.Registry.SetDesired(id, n)
	// replicas beyond n are dropped now; the driver kills their actors
	for _, m := range p.opts.Registry.Members(id) {
		if m.Replica >= n {
			p.opts.Registry.Remove(id, m.Replica, "scaled down")
		}
	}
	return nil
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

// DeletePool implements pools.Provider: the Registry forgets the pool (the driver's
// WatchPool ends and it exits, the workers' leases end), and the job is stopped.
func (p *Provider) DeletePool(ctx context.Context, id string) error {
	p.mu.Lock()
	pl := p.pools[id]
	delete(p.pools, id)
	p.mu.Unlock()
	if pl == nil {
		return nil
	}
	pl.cancel()
	<-pl.done
	p.opts.Registry.DropPool(id, "the pool was deleted")
	if _, err := p.opts.Client.Stop(ctx, JobID(id)); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("pool %s: stopping the driver job: %w", id, err)
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

// Close stops monitoring. The pools stay on the cluster: their workers keep trying to
// register, and a gateway that ensures the same pools again adopts them.
func (p *Provider) Close() error {
	p.mu.Lock()
	for _, pl := range p.pools {
		pl.cancel()
	}
	p.pools = map[string]*pool{}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}
