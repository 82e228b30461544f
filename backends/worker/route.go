package worker

import (
	"slices"
	"strings"

	"github.com/loops-dev/loops/backends/pools"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

// Sampling requests go to the replicas that already hold their adapter, least loaded
// first: a worker's sampler keeps the adapters it loaded last (its cache), so sending an
// adapter's samples where it is loaded saves loading it again. Load is the samples in
// flight from this backend. A holder is passed over for the least loaded replica when it
// has more than samplerSpill samples more in flight, which then loads the adapter too: a
// popular adapter spreads over the replicas instead of queueing on one.
const (
	// samplerHeldMax is how many adapters the backend remembers per replica (the torch
	// worker's sampler cache holds 16).
	samplerHeldMax = 16
	samplerSpill   = 2
)

// samplerLoad is what the backend knows of one replica's sampling (guarded by worker.mu).
type samplerLoad struct {
	inflight int
	held     []string // adapter keys, most recently used last, at most samplerHeldMax
}

// adapterKey names the adapter of a sample request: its folder, or its files' contents
// when it comes as URLs; "" for the base model.
func adapterKey(req *backendv1.SampleRequest) string {
	if d := req.GetAdapterDir(); d != "" {
		return "dir:" + d
	}
	if len(req.GetAdapterFiles()) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("sha256:")
	for _, f := range req.GetAdapterFiles() {
		b.WriteString(f.GetName())
		b.WriteByte('=')
		b.WriteString(f.GetSha256())
		b.WriteByte(';')
	}
	return b.String()
}

// pickSampler chooses the replica of pool ("": the shared pools) for a sample of base
// with adapter key (see above),
// counts the sample in its load and returns the function that uncounts it. With no alive
// replica serving base it falls back to pick, whose worker fails the call with the reason.
func (b *Backend) pickSampler(pool, base, key string) (*worker, func(), error) {
	w := b.routeSample(pool, base, key)
	if w == nil {
		w, err := b.pick(pool, base)
		return w, func() {}, err
	}
	return w, func() {
		w.mu.Lock()
		w.load.inflight--
		w.mu.Unlock()
	}, nil
}

func (b *Backend) routeSample(pool, base, key string) *worker {
	b.mu.Lock()
	defer b.mu.Unlock()
	// sampler replicas when one serves, else the trainers
	samplers := false
	for _, w := range b.workers {
		w.mu.Lock()
		ok := w.alive && w.caps != nil && b.roles[w.pool] == pools.RoleSampler && serves(w.caps, base) && b.inPoolLocked(w.pool, pool)
		w.mu.Unlock()
		if ok {
			samplers = true
			break
		}
	}
	var holder, least *worker
	var holderLoad, leastLoad int
	n := len(b.workers)
	for k := range n {
		w := b.workers[(b.rr+k)%n]
		w.mu.Lock()
		ok := w.alive && w.caps != nil && serves(w.caps, base) && b.inPoolLocked(w.pool, pool) && (!samplers || b.roles[w.pool] == pools.RoleSampler)
		load, holds := w.load.inflight, key != "" && slices.Contains(w.load.held, key)
		w.mu.Unlock()
		if !ok {
			continue
		}
		if least == nil || load < leastLoad {
			least, leastLoad = w, load
		}
		if holds && (holder == nil || load < holderLoad) {
			holder, holderLoad = w, load
		}
	}
	b.rr++
	if least == nil {
		return nil
	}
	w := least
	if holder != nil && holderLoad <= leastLoad+samplerSpill {
		w = holder
	}
	w.mu.Lock()
	w.load.inflight++
	if key != "" {
		w.load.held = slices.DeleteFunc(w.load.held, func(h string) bool { return h == key })
		w.load.held = append(w.load.held, key)
		if len(w.load.held) > samplerHeldMax {
			w.load.held = slices.Delete(w.load.held, 0, len(w.load.held)-samplerHeldMax)
		}
	}
	w.mu.Unlock()
	return w
}
