package console

import (
	"context"
	"errors"
	"sync"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/internal/errs"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// chartCacheSize bounds the drawn chart sets kept (one per run page and toggles, about
// 60 KiB each).
const chartCacheSize = 128

// chartKey names one drawing: the run (in its workspace), the toggles, and a fingerprint of
// the records drawn (how many, the newest seq_id, and the oldest record's extent, which
// compaction changes), so a refresh with no new step redraws nothing.
type chartKey struct {
	ws, run          string
	opts             chartOptions
	n                int
	lastSeq          int64
	firstCount       int64
	firstLastSeq     int64
	lastBackendNanos int64
}

func keyOf(ws, run string, steps []*loopsv1.StepMetrics, o chartOptions) chartKey {
	k := chartKey{ws: ws, run: run, opts: o, n: len(steps)}
	if len(steps) > 0 {
		first, last := steps[0], steps[len(steps)-1]
		k.lastSeq, k.firstCount, k.firstLastSeq = last.GetLastSeqId(), first.GetCount(), first.GetLastSeqId()
		k.lastBackendNanos = int64(last.GetBackendSeconds() * 1e9)
	}
	return k
}

// drawer draws charts at most `slots` at a time across the server (drawing is CPU work
// the training hot path shares) and keeps the last chartCacheSize drawings, so an open page
// of an idle run costs a metrics read per refresh, not a drawing.
type drawer struct {
	slots chan struct{}

	mu    sync.Mutex
	cache map[chartKey][]chartView
	order []chartKey // insertion order, oldest first
}

func newDrawer(slots int) *drawer {
	return &drawer{slots: make(chan struct{}, max(slots, 1)), cache: map[chartKey][]chartView{}}
}

// errDrawBusy is the answer when no drawing slot frees up before the request's deadline.
var errDrawBusy = errs.New(connect.CodeResourceExhausted, errs.ReasonRateLimited,
	errors.New("the console is drawing as many charts as it may at once: try again in a few seconds"))

// draw returns the charts of steps, from the cache or drawn in a slot.
func (d *drawer) draw(ctx context.Context, k chartKey, steps []*loopsv1.StepMetrics) ([]chartView, error) {
	d.mu.Lock()
	cs, ok := d.cache[k]
	d.mu.Unlock()
	if ok {
		return cs, nil
	}
	select {
	case d.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, errDrawBusy
	}
	cs = charts(steps, k.opts)
	<-d.slots
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.cache[k]; !ok {
		d.cache[k] = cs
		d.order = append(d.order, k)
		for len(d.order) > chartCacheSize {
			delete(d.cache, d.order[0])
			d.order = d.order[1:]
		}
	}
	return cs, nil
}
