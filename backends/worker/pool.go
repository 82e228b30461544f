package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/pools/ray"
	"github.com/loops-dev/loops/backends/pools/static"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

// PoolOptions select pool mode: the workers come from a pools.Provider and register with a
// Registry the backend serves, instead of being started or dialled one by one.
type PoolOptions struct {
	// Provider is local, static or ray.
	Provider string
	// Replicas per pool (default 1); GPUsPerReplica (default 0); Slots bounds the replicas
	// of all pools together (default 64).
	Replicas int
	// SamplerReplicas, when above 0, gives each model a second pool of that many replicas in
	// the sampler role ("<pool>-sampler"): sampling goes to them (to the trainers only while
	// none serves), training never does, and deployments scale it. 0: the trainer replicas
	// serve sampling too.
	SamplerReplicas int
	GPUsPerReplica  int
	// GPUKind names the kind of GPU the replicas hold (option gpu_kind, "H100"): pools
	// report it and the price sheet prices dedicated GPU time by it.
	GPUKind string
	Slots   int
	// RegistryListen is where the Registry listens (default 127.0.0.1:0 for local and
	// static, 0.0.0.0:7450 for ray; TLS only); RegistryURL is its address as workers dial it
	// (https://; default derived from the listener; for ray set it to an address the Ray
	// nodes reach).
	RegistryListen string
	RegistryURL    string
	// WorkerListen is the host the ray provider's worker actors listen on (default
	// 127.0.0.1: reachable from their own node only, enough when the gateway runs on it).
	// A gateway on another host sets it explicitly (0.0.0.0, or an interface's address):
	// the workers then serve the network, answering only this gateway (mutual TLS).
	WorkerListen string
	// JoinTokenFile holds the join token (default: a random token written under DataDir).
	JoinTokenFile string
	// GPUs is the local provider's inventory of GPU ids.
	GPUs []string
	// RayAddress is the Ray dashboard (http://host:8265) for the ray provider; RayPython
	// the interpreter on the Ray nodes (default python3).
	RayAddress string
	RayPython  string
	// HeartbeatTimeout marks a replica lost (default 10s).
	HeartbeatTimeout time.Duration
	// Preemptible marks the pools' replicas as ones that may be lost at any time (spot
	// capacity): the gateway then keeps every run on them recoverable step by step, so a
	// lost replica costs no step (backends.Preemptible).
	Preemptible bool
	// implicit: the default mode (no provider configured, no worker addresses): one local
	// pool of LocalWorkers replicas, each serving every model, seeing the gateway's GPUs.
	implicit bool
	// KeepWarm is how long a released dedicated pool waits for the next run of its shape
	// before it is deleted (default DefaultKeepWarm; dedicated.go). IdleToZero is how long a
	// bound dedicated pool may go without a call before it is scaled to zero replicas
	// (default DefaultIdleToZero). Negative: none (deleted at once; never scaled to zero).
	KeepWarm, IdleToZero time.Duration
}

var poolNameRE = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// PoolID is the pool that serves a model in pool mode ("torch-" and the model name, other
// characters replaced).
func PoolID(model string) string {
	name, _, _ := strings.Cut(model, "=")
	id := "torch-" + strings.Trim(poolNameRE.ReplaceAllString(name, "-"), "-")
	if len(id) > 128 {
		id = id[:128]
	}
	return id
}

// SamplerPoolID is the pool of sampler replicas of a model (PoolOptions.SamplerReplicas).
func SamplerPoolID(model string) string {
	id := PoolID(model)
	return id[:min(len(id), 120)] + "-sampler"
}

// poolOptionsFromConfig reads the pool keys of a backend's options: provider (LOOPS_POOL_PROVIDER),
// replicas, sampler_replicas, gpus_per_replica, pool_slots, registry_listen, registry_url,
// worker_listen (ray: the actors' listen address), join_token_file
// (LOOPS_JOIN_TOKEN_FILE), gpus (0,1,...), ray_address (LOOPS_RAY_ADDRESS), ray_python,
// heartbeat_timeout, preemptible (true: runs keep step recovery), keep_warm and idle_to_zero
// (dedicated pools, dedicated.go; unset: the defaults; 0s: none). No provider: nil (today's workers/local_workers mode).
func poolOptionsFromConfig(m map[string]string) (*PoolOptions, error) {
	for key, env := range map[string]string{"provider": "LOOPS_POOL_PROVIDER", "join_token_file": "LOOPS_JOIN_TOKEN_FILE", "ray_address": "LOOPS_RAY_ADDRESS"} {
		if _, ok := m[key]; !ok {
			if v := os.Getenv(env); v != "" {
				m[key] = v
			}
		}
	}
	if m["provider"] == "" {
		return nil, nil
	}
	p := &PoolOptions{Provider: m["provider"], RegistryListen: m["registry_listen"], RegistryURL: m["registry_url"],
		JoinTokenFile: m["join_token_file"], RayAddress: m["ray_address"], RayPython: m["ray_python"], WorkerListen: m["worker_listen"]}
	if h := p.WorkerListen; h != "" && net.ParseIP(h) == nil {
		return nil, fmt.Errorf("torch: option worker_listen=%q must be an IP address the worker actors listen on (0.0.0.0 for every interface)", h)
	}
	if u := p.RegistryURL; u != "" && !strings.HasPrefix(u, "https://") {
		return nil, fmt.Errorf("torch: option registry_url=%q must be https://host:port (the registry serves TLS only)", u)
	}
	switch p.Provider {
	case "local", "static", "ray":
	default:
		return nil, fmt.Errorf("torch: option provider=%q must be local, static or ray", p.Provider)
	}
	for key, dst := range map[string]*int{"replicas": &p.Replicas, "sampler_replicas": &p.SamplerReplicas, "gpus_per_replica": &p.GPUsPerReplica, "pool_slots": &p.Slots} {
		if v := m[key]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > pools.MaxReplicas {
				return nil, fmt.Errorf("torch: option %s=%q must be an integer between 0 and %d", key, v, pools.MaxReplicas)
			}
			*dst = n
		}
	}
	if p.GPUKind = m["gpu_kind"]; !pools.ValidGPUKind(p.GPUKind) {
		return nil, fmt.Errorf("torch: option gpu_kind=%q must be 1-64 characters of letters, digits, '.', '_' or '-'", p.GPUKind)
	}
	for _, g := range strings.Split(m["gpus"], ",") {
		if g = strings.TrimSpace(g); g != "" {
			p.GPUs = append(p.GPUs, g)
		}
	}
	if v := m["preemptible"]; v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("torch: option preemptible=%q must be true or false", v)
		}
		p.Preemptible = b
	}
	if v := m["heartbeat_timeout"]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("torch: option heartbeat_timeout=%q is not a duration such as 10s", v)
		}
		p.HeartbeatTimeout = d
	}
	for key, dst := range map[string]*time.Duration{"keep_warm": &p.KeepWarm, "idle_to_zero": &p.IdleToZero} {
		if v := m[key]; v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 30*24*time.Hour {
				return nil, fmt.Errorf("torch: option %s=%q is not a duration between 0s and 720h (0: none)", key, v)
			}
			if d == 0 {
				d = -1 // none (0 in PoolOptions is the default)
			}
			*dst = d
		}
	}
	if p.Provider == "ray" && p.RayAddress == "" {
		return nil, errors.New("torch: provider=ray needs ray_address (the Ray dashboard, e.g. http://127.0.0.1:8265; or LOOPS_RAY_ADDRESS)")
	}
	return p, nil
}

// startPooled sets up pool mode: the Registry and its server, the provider, one pool per
// model, worker slots filled from the Registry's membership.
func (b *Backend) startPooled(ctx context.Context) error {
	po := *b.opts.Pool
	if po.Replicas <= 0 {
		po.Replicas = 1
	}
	if po.Slots <= 0 {
		po.Slots = 64
	}
	// dedicated pools (dedicated.go): 0 takes the default, a negative value means none
	if b.opts.Pool.KeepWarm == 0 {
		b.opts.Pool.KeepWarm = DefaultKeepWarm
	}
	if b.opts.Pool.IdleToZero == 0 {
		b.opts.Pool.IdleToZero = DefaultIdleToZero
	}
	if po.RegistryListen == "" {
		po.RegistryListen = "127.0.0.1:0"
		if po.Provider == "ray" {
			po.RegistryListen = "0.0.0.0:7450"
		}
	}
	token, tokenFile, err := b.joinToken(po.JoinTokenFile)
	if err != nil {
		return err
	}
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: token, MaxRegistrations: po.Slots, HeartbeatTimeout: po.HeartbeatTimeout, Logger: b.opts.Logger})
	srv, err := pools.Serve(reg, po.RegistryListen, b.auth.RegistryConfig())
	if err != nil {
		return fmt.Errorf("the worker registry cannot listen on %s: %w", po.RegistryListen, err)
	}
	b.closers = append(b.closers, func() { reg.Close(); _ = srv.Close() })
	url := po.RegistryURL
	if url == "" {
		url = srv.URL()
		if host, port, _ := net.SplitHostPort(srv.Addr()); net.ParseIP(host).IsUnspecified() {
			url = "https://127.0.0.1:" + port
		}
	}
	var prov pools.Provider
	switch po.Provider {
	case "local":
		cmd := b.workerCommand()
		var env []string
		if pp := b.opts.PythonPath; pp != "" {
			if old := os.Getenv("PYTHONPATH"); old != "" {
				pp += string(os.PathListSeparator) + old
			}
			env = append(env, "PYTHONPATH="+pp)
		}
		prov, err = local.New(local.Options{Registry: reg, RegistryURL: url, JoinTokenFile: tokenFile, Authority: b.auth,
			AllowDirs: append([]string{b.opts.DataDir}, b.opts.AllowDirs...), Command: cmd,
			Env: append(env, b.opts.Env...), GPUs: po.GPUs, Logger: b.opts.Logger, InheritGPUs: po.implicit, OnExit: b.noteExit, Backoff: b.opts.RestartBackoff})
	case "static":
		prov, err = static.New(static.Options{Registry: reg, Authority: b.auth, Pools: map[string][]string{PoolID(b.opts.Models[0]): b.opts.Workers}, Logger: b.opts.Logger})
		if len(b.opts.Models) > 1 {
			err = errors.New("provider=static serves one model (its workers are given by the workers option)")
		}
		po.Replicas = len(b.opts.Workers)
	case "ray":
		env := map[string]string{"PYTHONUNBUFFERED": "1"}
		if b.opts.PythonPath != "" {
			env["PYTHONPATH"] = b.opts.PythonPath
		}
		for _, kv := range b.opts.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		prov, err = ray.New(ray.Options{Client: ray.NewClient(po.RayAddress, nil, nil), Registry: reg, RegistryURL: url, JoinToken: token,
			Authority: b.auth, ListenHost: po.WorkerListen, Python: po.RayPython, EnvVars: env, Logger: b.opts.Logger})
	}
	if err != nil {
		return err
	}
	b.pools, b.registry = prov, reg
	b.poolReplicas, b.poolSlots = po.Replicas, po.Slots
	b.closers = append(b.closers, func() { _ = prov.Close() })
	margs, err := b.modelArgs()
	if err != nil {
		return err
	}
	for i := 0; i < po.Slots; i++ {
		w := b.newWorker(i, "")
		w.pooled = true
		w.why = "no replica has registered in this slot yet"
		b.workers = append(b.workers, w)
	}
	b.samplerReplicas = po.SamplerReplicas
	var ensured []string // the pools to wait for: each must have a replica attached
	for i := 1; i < len(margs); i += 2 {
		args := b.poolArgs()
		if po.implicit { // one pool whose replicas serve every model, as local workers always did
			args = append(slices.Clone(margs[i+1:]), args...)
		}
		specs := []pools.Spec{{ID: PoolID(margs[i]), Role: pools.RoleTrainer, BaseModel: margs[i], Replicas: po.Replicas,
			GPUsPerReplica: po.GPUsPerReplica, GPUKind: po.GPUKind, Preemptible: po.Preemptible, Args: args}}
		if po.SamplerReplicas > 0 && po.Provider != "static" {
			s := specs[0]
			s.ID, s.Role, s.Replicas = SamplerPoolID(margs[i]), pools.RoleSampler, po.SamplerReplicas
			specs = append(specs, s)
		}
		for _, spec := range specs {
			b.mu.Lock()
			b.roles[spec.ID] = spec.Role
			b.shared[spec.ID] = spec
			b.mu.Unlock()
			if err := prov.EnsurePool(ctx, spec); err != nil {
				return err
			}
			if spec.Replicas > 0 {
				ensured = append(ensured, spec.ID)
			}
			b.log.Info("pool ensured", slog.String("pool", spec.ID), slog.String("role", string(spec.Role)), slog.String("provider", po.Provider), slog.Int("replicas", spec.Replicas), slog.String("registry", url))
		}
		if po.implicit {
			break
		}
	}
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		b.followRegistry()
	}()
	go func() {
		defer b.wg.Done()
		b.idleToZero()
	}()
	// wait until one replica of each pool is attached: of each pool, not of each model (a
	// model's sampler replica serves it too, but takes no adapters)
	wctx, cancel := context.WithTimeout(ctx, b.opts.StartTimeout)
	defer cancel()
	for {
		if !slices.ContainsFunc(ensured, func(id string) bool { return !b.poolAttached(id) }) {
			return nil
		}
		if why := b.startFailure(); why != "" && po.implicit {
			// a local worker that cannot start fails the backend at once, with its stderr
			return fmt.Errorf("a local worker exited during start (%s); check the python option (LOOPS_WORKER_PYTHON) or worker_command (LOOPS_WORKER_COMMAND)", why)
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("no worker of the pools registered and answered within %v (provider %s, registry %s)", b.opts.StartTimeout, po.Provider, url)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// noteExit records a local worker's exit (local.Options.OnExit): before any worker served,
// it is the reason the backend does not start.
func (b *Backend) noteExit(pool string, replica int, why string) {
	b.mu.Lock()
	if b.firstExit == "" {
		b.firstExit = fmt.Sprintf("pool %s replica %d: %s", pool, replica, why)
	}
	b.mu.Unlock()
}

// startFailure is the first worker exit recorded by noteExit ("" if none).
func (b *Backend) startFailure() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.firstExit
}

// poolAttached reports whether an alive worker slot is attached to a replica of pool.
func (b *Backend) poolAttached(pool string) bool {
	for _, w := range b.workers {
		w.mu.Lock()
		ok := w.alive && w.pool == pool
		w.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// joinToken reads the token file, or writes a random token to one under DataDir.
func (b *Backend) joinToken(file string) (string, string, error) {
	if file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", "", fmt.Errorf("join token: %w", err)
		}
		tok := strings.TrimSpace(string(raw))
		if tok == "" {
			return "", "", fmt.Errorf("join token file %s is empty", file)
		}
		return tok, file, nil
	}
	var r [24]byte
	_, _ = rand.Read(r[:])
	tok := hex.EncodeToString(r[:])
	dir := filepath.Join(b.opts.DataDir, "pools")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	file = filepath.Join(dir, "join-token")
	if err := os.WriteFile(file, []byte(tok+"\n"), 0o600); err != nil {
		return "", "", err
	}
	return tok, file, nil
}

type slotKey struct {
	pool    string
	replica int
}

// followRegistry maps the registered replicas of the backend's pools onto worker slots: a
// new incarnation in a slot fails the old one (its adapters are lost, their runs reload
// their checkpoints) and brings the slot up at the new address; a lost replica fails its
// slot.
func (b *Backend) followRegistry() {
	slots := map[slotKey]*worker{}
	incarnation := map[*worker]string{}
	var free []*worker
	for i := len(b.workers) - 1; i >= 0; i-- {
		free = append(free, b.workers[i])
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		changed := b.registry.Changed()
		seen := map[slotKey]bool{}
		for _, pool := range b.registry.Pools() {
			for _, m := range b.registry.Members(pool) {
				k := slotKey{m.Pool, m.Replica}
				seen[k] = true
				w := slots[k]
				if w == nil {
					if len(free) == 0 {
						b.log.Warn("more replicas than worker slots; ignoring one", slog.String("pool", m.Pool), slog.Int("replica", m.Replica))
						continue
					}
					w, free = free[len(free)-1], free[:len(free)-1]
					slots[k] = w
				}
				w.mu.Lock()
				alive := w.alive
				w.mu.Unlock()
				if incarnation[w] == m.Incarnation && alive {
					continue
				}
				if incarnation[w] != "" && incarnation[w] != m.Incarnation {
					w.fail(-1, fmt.Sprintf("pool %s replica %d restarted as a new incarnation (%s)", m.Pool, m.Replica, m.Incarnation))
				}
				incarnation[w] = m.Incarnation
				b.attach(w, m)
			}
		}
		for k, w := range slots {
			if !seen[k] {
				why := b.registry.LostReason(k.pool, k.replica)
				if why == "" {
					why = "it left the pool"
				}
				w.fail(-1, fmt.Sprintf("pool %s replica %d was lost: %s", k.pool, k.replica, why))
				// a replica scaled away (or of a pool no longer wanted) is not coming back:
				// the slot holds nothing WaitReady should wait for
				gone := false
				if n, ok := b.registry.Desired(k.pool); !ok || k.replica >= n {
					gone = true
				}
				w.mu.Lock()
				w.pool, w.replica = "", 0
				var dropped *clients
				if gone {
					dropped, w.cl = w.cl, nil
				}
				w.mu.Unlock()
				dropped.close()
				delete(slots, k)
				delete(incarnation, w)
				free = append(free, w)
			}
		}
		select {
		case <-b.ctx.Done():
			return
		case <-changed:
		case <-tick.C: // retry attaching replicas whose first probe failed
		}
	}
}

// attach points a slot at a registered replica once it answers.
func (b *Backend) attach(w *worker, m pools.Member) {
	cl := b.newClients(m.Address, m.Pool)
	ctx, cancel := context.WithTimeout(b.ctx, b.opts.HealthTimeout)
	caps, err := cl.tc.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	cancel()
	if err != nil {
		cl.close()
		b.log.Warn("a registered replica does not answer yet", slog.String("pool", m.Pool), slog.Int("replica", m.Replica), slog.String("address", m.Address), slog.String("err", err.Error()))
		return
	}
	w.mu.Lock()
	old := w.cl
	w.addr, w.cl = m.Address, cl
	w.pool, w.replica = m.Pool, m.Replica
	w.mu.Unlock()
	old.close()
	w.setAlive(caps)
	b.log.Info("replica attached", slog.String("pool", m.Pool), slog.Int("replica", m.Replica), slog.String("address", m.Address), slog.String("incarnation", m.Incarnation))
}

// AdapterReplica says which registered replica holds an adapter in pool mode: its pool and
// replica index. ok is false when the adapter is not held (unknown, deleted, or lost with
// its replica) or the backend is not in pool mode.
func (b *Backend) AdapterReplica(adapterID string) (pool string, replica int, ok bool) {
	b.mu.Lock()
	w := b.adapters[adapterID]
	b.mu.Unlock()
	if w == nil || !w.pooled {
		return "", 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pool == "" {
		return "", 0, false
	}
	return w.pool, w.replica, true
}

var _ backends.Preemptible = (*Backend)(nil)

// Preemptible reports whether baseModel is served by a pool marked preemptible.
func (b *Backend) Preemptible(baseModel string) bool {
	if b.opts.Pool == nil || !b.opts.Pool.Preemptible {
		return false
	}
	for _, m := range b.opts.Models {
		if name, _, _ := strings.Cut(m, "="); name == baseModel {
			return true
		}
	}
	return false
}

// restartReplica has the local provider kill and start again the replica a slot is attached
// to, which the health checks found hung (the registry may still see its heartbeats).
func (b *Backend) restartReplica(w *worker, why string) {
	lp, ok := b.pools.(*local.Provider)
	if !ok || !w.pooled {
		return
	}
	w.mu.Lock()
	pool, replica := w.pool, w.replica
	w.mu.Unlock()
	if pool != "" {
		lp.Restart(pool, replica, why)
	}
}

// Pools returns the pool provider and the Registry in pool mode (nil otherwise).
func (b *Backend) Pools() (pools.Provider, *pools.Registry) { return b.pools, b.registry }

var _ backends.SamplerScaler = (*Backend)(nil)

// ScaleSamplers scales the pool serving baseModel to n replicas, or to the configured
// replicas when more, within the pool slots. Without pool mode it places nothing (ok
// false): the local workers are fixed at start-up.
func (b *Backend) ScaleSamplers(ctx context.Context, baseModel string, n int) (int, bool, error) {
	if b.pools == nil || b.opts.Pool.implicit {
		return 0, false, nil // local workers are as many as configured
	}
	want := min(max(n, b.poolReplicas, 1), b.poolSlots)
	var pool string
	for _, m := range b.opts.Models {
		if name, _, _ := strings.Cut(m, "="); name == baseModel {
			pool = PoolID(m)
			if b.samplerReplicas > 0 { // the sampler pool serves the deployments
				pool, want = SamplerPoolID(m), min(max(n, b.samplerReplicas, 1), b.poolSlots)
			}
		}
	}
	if pool == "" {
		return 0, true, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("base model %q is not served by a pool of this backend", baseModel))
	}
	if err := b.pools.ScalePool(ctx, pool, want); err != nil {
		return 0, true, err
	}
	b.log.Info("pool scaled for deployments", slog.String("pool", pool), slog.Int("replicas", want))
	return want, true, nil
}
