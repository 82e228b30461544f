package placement

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/backends"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// placeTimeout bounds one call that places a base model's sampler replicas.
const placeTimeout = 2 * time.Minute

// Placer keeps the sampler replicas the deployments of each base model want (the most any
// of them asks for) and has the backend place them (backends.SamplerScaler) on its own
// goroutine (Run): a deployment's create or delete only records the wish (Set, Remove), and
// the newest wish of a model is the one placed. It knows every deployment (Load at
// start-up, then Set and Remove); a backend that places nothing reports so once. Its
// methods are safe for concurrent use; its lock is a leaf (no call and no other lock under
// it).
type Placer struct {
	scaler backends.SamplerScaler // nil: the backend places no replicas
	log    *slog.Logger

	mu      sync.Mutex
	want    map[string]map[string]int32 // base model → owner "\x00" name → replicas
	dirty   map[string]bool             // to place
	placing map[string]bool             // being placed
	placed  map[string]placement
	wake    chan struct{}
}

// placement is what placing a base model's replicas last did: the replicas the pool was set
// to, or (0) why none are placed.
type placement struct {
	replicas int32
	text     string
}

// New returns a placer that has scaler place the replicas; with a nil scaler (a backend
// that places no replicas) deployments are told so.
func New(scaler backends.SamplerScaler, log *slog.Logger) *Placer {
	return &Placer{scaler: scaler, log: log, want: map[string]map[string]int32{}, dirty: map[string]bool{},
		placing: map[string]bool{}, placed: map[string]placement{}, wake: make(chan struct{}, 1)}
}

// ListFunc lists every deployment of every workspace, by (owner, name), a page of at most
// limit after (afterWS, afterName) ("" for the first): the store's ListAllDeployments.
type ListFunc func(ctx context.Context, afterWS, afterName string, limit int) ([]*loopsv1.Deployment, error)

// Load records every stored deployment (listed in keyset pages) and marks their models for
// placing.
func (p *Placer) Load(ctx context.Context, list ListFunc) error {
	const page = 500
	ws, name := "", ""
	for {
		ds, err := list(ctx, ws, name, page)
		if err != nil {
			return fmt.Errorf("placement: listing deployments for their replicas: %w", err)
		}
		for _, d := range ds {
			p.Set(d.GetBaseModel(), d.GetOwner(), d.GetName(), d.GetReplicas())
		}
		if len(ds) < page {
			return nil
		}
		ws, name = ds[len(ds)-1].GetOwner(), ds[len(ds)-1].GetName()
	}
}

// Remove forgets deployment owner/name, whichever its base model.
func (p *Placer) Remove(owner, name string) {
	p.mu.Lock()
	var base string
	for b, m := range p.want {
		if _, ok := m[owner+"\x00"+name]; ok {
			base = b
		}
	}
	p.mu.Unlock()
	if base != "" {
		p.Set(base, owner, name, 0)
	}
}

// Set records that deployment owner/name of base wants replicas (0: it is gone) and wakes
// Run. It never waits for the backend.
func (p *Placer) Set(base, owner, name string, replicas int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.want[base]
	if m == nil {
		m = map[string]int32{}
		p.want[base] = m
	}
	key := owner + "\x00" + name
	if replicas > 0 {
		m[key] = replicas
	} else {
		delete(m, key)
		if len(m) == 0 {
			delete(p.want, base)
		}
	}
	p.dirty[base] = true
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run places the wished replicas until ctx ends: each model's newest wish, one call at a
// time (each bounded by placeTimeout).
func (p *Placer) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		todo := map[string]int32{}
		for base := range p.dirty {
			n := int32(0)
			for _, r := range p.want[base] {
				n = max(n, r)
			}
			todo[base] = n
			p.placing[base] = true
		}
		clear(p.dirty)
		p.mu.Unlock()
		for base, n := range todo {
			res := p.place(ctx, base, n)
			p.mu.Lock()
			p.placed[base] = res
			delete(p.placing, base)
			p.mu.Unlock()
		}
	}
}

func (p *Placer) place(ctx context.Context, base string, n int32) placement {
	if p.scaler == nil {
		return placement{text: "this backend runs one sampler for every deployment and places no replicas"}
	}
	if n == 0 {
		n = 1 // no deployment left: back to the backend's own count
	}
	ctx, cancel := context.WithTimeout(ctx, placeTimeout)
	defer cancel()
	set, ok, err := p.scaler.ScaleSamplers(ctx, base, int(n))
	switch {
	case !ok:
		return placement{text: "the backend's workers are fixed at start-up (no worker pools): no replicas are placed"}
	case err != nil:
		p.log.Error("placing a deployment's sampler replicas", slog.String("base_model", base), slog.Int("replicas", int(n)), slog.Any("err", err))
		return placement{text: fmt.Sprintf("placing %d replicas failed: %s", n, errs.Message(err))}
	}
	return placement{replicas: int32(set)}
}

// View returns a copy of d with its model's placement: "placing…" while a wish is being
// placed, else the replicas placed for d (never more than it asked for: the pool may be
// larger for another workspace's deployment of the model, which d must not learn) or why
// none are.
func (p *Placer) View(d *loopsv1.Deployment) *loopsv1.Deployment {
	p.mu.Lock()
	res, ok := p.placed[d.GetBaseModel()]
	pending := p.dirty[d.GetBaseModel()] || p.placing[d.GetBaseModel()]
	p.mu.Unlock()
	v := proto.CloneOf(d)
	switch {
	case pending || !ok:
		v.Placement = "placing…"
	case res.replicas > 0:
		// the deployment's share: the pool may be larger for another workspace's
		// deployment of the model, which this one must not learn
		v.PlacedReplicas = min(res.replicas, max(d.GetReplicas(), 1))
		v.Placement = fmt.Sprintf("%d sampler replicas placed (the pool serving %s is shared by its deployments)", v.PlacedReplicas, d.GetBaseModel())
	default:
		v.Placement = res.text
	}
	return v
}
