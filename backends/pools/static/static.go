package static

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// Options configure the provider. Zero values mean the documented defaults.
type Options struct {
	// Registry is where live workers are announced (required).
	Registry *pools.Registry
	// Pools maps a pool id to its workers' addresses (host:port), replica i at index i.
	Pools map[string][]string
	// ProbeInterval is the time between probes (default 2s); ProbeTimeout bounds one (default
	// 5s); ProbeFailures failed probes in a row mark a replica lost (default 2).
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	ProbeFailures int
	// Authority is the gateway's (required): the workers' certificates must be its, of
	// their pool (mtls).
	Authority *mtls.Authority
	Logger    *slog.Logger
}

// Provider is the static provider.
type Provider struct {
	opts Options

	mu    sync.Mutex
	pools map[string]*pool
	wg    sync.WaitGroup
}

type pool struct {
	spec    pools.Spec
	probers map[int]context.CancelFunc
	done    map[int]chan struct{}
}

var (
	_ pools.Provider   = (*Provider)(nil)
	_ pools.SpecReader = (*Provider)(nil)
)

// New returns a provider.
func New(o Options) (*Provider, error) {
	if o.Registry == nil || o.Authority == nil {
		return nil, errors.New("static pools: Registry and Authority are required")
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 2 * time.Second
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = 5 * time.Second
	}
	if o.ProbeFailures <= 0 {
		o.ProbeFailures = 2
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Provider{opts: o, pools: map[string]*pool{}}, nil
}

// EnsurePool implements pools.Provider.
func (p *Provider) EnsurePool(ctx context.Context, spec pools.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	addrs := p.opts.Pools[spec.ID]
	if spec.Replicas > len(addrs) {
		return fmt.Errorf("pool %s: %d replicas asked but %d addresses are configured for it (static provider: one address per replica)", spec.ID, spec.Replicas, len(addrs))
	}
	p.mu.Lock()
	if p.pools[spec.ID] == nil {
		p.pools[spec.ID] = &pool{spec: spec, probers: map[int]context.CancelFunc{}, done: map[int]chan struct{}{}}
	}
	p.mu.Unlock()
	return p.ScalePool(ctx, spec.ID, spec.Replicas)
}

// ScalePool implements pools.Provider: replicas beyond n are no longer probed nor announced
// (the workers themselves keep running: this provider starts and stops nothing).
func (p *Provider) ScalePool(_ context.Context, id string, n int) error {
	p.mu.Lock()
	pl := p.pools[id]
	if pl == nil {
		p.mu.Unlock()
		return fmt.Errorf("pool %q: %w", id, pools.ErrNoPool)
	}
	if addrs := p.opts.Pools[id]; n < 0 || n > len(addrs) {
		p.mu.Unlock()
		return fmt.Errorf("pool %s: replicas %d must be between 0 and the %d configured addresses", id, n, len(addrs))
	}
	pl.spec.Replicas = n
	p.opts.Registry.SetDesired(id, n)
	var stop []chan struct{}
	for i, cancel := range pl.probers {
		if i >= n {
			cancel()
			stop = append(stop, pl.done[i])
			delete(pl.probers, i)
			delete(pl.done, i)
		}
	}
	for i := range n {
		if pl.probers[i] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		pl.probers[i], pl.done[i] = cancel, done
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer close(done)
			p.probe(ctx, id, i, p.opts.Pools[id][i])
		}()
	}
	p.mu.Unlock()
	for _, d := range stop {
		<-d
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

// DeletePool implements pools.Provider.
func (p *Provider) DeletePool(ctx context.Context, id string) error {
	p.mu.Lock()
	_, ok := p.pools[id]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	if err := p.ScalePool(ctx, id, 0); err != nil {
		return err
	}
	p.mu.Lock()
	delete(p.pools, id)
	p.mu.Unlock()
	p.opts.Registry.DropPool(id, "the pool was deleted")
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

// Close stops probing.
func (p *Provider) Close() error {
	p.mu.Lock()
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

func (p *Provider) probe(ctx context.Context, id string, i int, addr string) {
	defer p.opts.Registry.Remove(id, i, "no longer probed (scaled down or deleted)")
	hc := mtls.HTTPClient(p.opts.Authority.DialConfig(id))
	defer hc.CloseIdleConnections()
	cl := backendv1connect.NewTrainerServiceClient(hc, "https://"+addr)
	health := grpchealth.NewClient(hc, "https://"+addr, connect.WithGRPC())
	up, fails := false, 0
	for {
		pctx, cancel := context.WithTimeout(ctx, p.opts.ProbeTimeout)
		caps, err := pools.Probe(pctx, health, cl, !up)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			fails = 0
			if !up {
				var b [8]byte
				_, _ = rand.Read(b[:])
				p.opts.Registry.Announce(pools.Member{Pool: id, Replica: i, Address: addr, Incarnation: "static-" + hex.EncodeToString(b[:]), Capabilities: caps})
				up = true
			}
		case up:
			if fails++; fails >= p.opts.ProbeFailures {
				p.opts.Registry.Remove(id, i, fmt.Sprintf("it did not answer %d probes in a row (%v)", fails, err))
				up = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.opts.ProbeInterval):
		}
	}
}
