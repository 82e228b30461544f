package fairness

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/loops-dev/loops/internal/telemetry"

	"github.com/prometheus/client_golang/prometheus"
)

// Window is how far back the gauges look.
const Window = 5 * time.Minute

// keep bounds the samples kept per workspace within the window (the newest are kept).
const keep = 1024

// maxWorkspaces bounds the workspaces tracked; past it the one idle longest leaves.
const maxWorkspaces = 10000

// sample is one operation's inflation, when it ended.
type sample struct {
	at        time.Time
	inflation float64
	wait      time.Duration
}

// wsStats is a workspace's samples within the window, oldest first.
type wsStats struct {
	samples []sample
}

// Tracker records operations and serves the fairness metrics. Its methods are safe for
// concurrent use.
type Tracker struct {
	now    func() time.Time
	target float64

	wait      *prometheus.HistogramVec
	inflation *prometheus.HistogramVec

	mu sync.Mutex
	ws map[string]*wsStats
}

// New returns a tracker whose SLO is a p99 inflation of at most target (0: none), with
// its metrics registered on reg (nil: not registered) and now as the clock (nil: time.Now).
func New(reg prometheus.Registerer, target float64, now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	t := &Tracker{
		now: now, target: target, ws: map[string]*wsStats{},
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "loops_queue_wait_seconds", Help: "Time from an operation's submission until its work started, by workspace and kind.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"workspace", "kind"}),
		inflation: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "loops_latency_inflation", Help: "An operation's time from submission to its end over its own service time (1: it waited for nothing), by workspace and kind.",
			Buckets: []float64{1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100, 1000},
		}, []string{"workspace", "kind"}),
	}
	if reg != nil {
		reg.MustRegister(t.wait, t.inflation, (*collector)(t))
	}
	return t
}

// Observe records an operation of workspace ws and kind that waited wait before its work
// started and took latency from submission to its end, of which service was its own work
// (the backend's time on it). A service of zero counts as no inflation.
func (t *Tracker) Observe(ctx context.Context, ws, kind string, wait, latency, service time.Duration) {
	inflation := 1.0
	if service > 0 && latency > service {
		inflation = latency.Seconds() / service.Seconds()
	}
	// ctx's trace (the operation's), when sampled, is the observations' exemplar.
	telemetry.Observe(ctx, t.wait.WithLabelValues(ws, kind), wait.Seconds())
	telemetry.Observe(ctx, t.inflation.WithLabelValues(ws, kind), inflation)
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.ws[ws]
	if !ok {
		if len(t.ws) >= maxWorkspaces {
			t.evictLocked(now)
		}
		s = &wsStats{}
		t.ws[ws] = s
	}
	s.samples = append(s.samples, sample{at: now, inflation: inflation, wait: wait})
	if len(s.samples) > keep {
		s.samples = slices.Delete(s.samples, 0, len(s.samples)-keep)
	}
}

// evictLocked drops the samples past the window, and the workspaces left with none; when
// all are active, the one idle longest.
func (t *Tracker) evictLocked(now time.Time) {
	var oldest string
	var oldestAt time.Time
	for ws, s := range t.ws {
		i := 0
		for i < len(s.samples) && now.Sub(s.samples[i].at) > Window {
			i++
		}
		s.samples = slices.Delete(s.samples, 0, i)
		if len(s.samples) == 0 {
			delete(t.ws, ws)
			continue
		}
		if last := s.samples[len(s.samples)-1].at; oldest == "" || last.Before(oldestAt) {
			oldest, oldestAt = ws, last
		}
	}
	if len(t.ws) >= maxWorkspaces && oldest != "" {
		delete(t.ws, oldest)
	}
}

// Status is a workspace's fairness over the window.
type Status struct {
	// Operations is how many of its operations ended within the window.
	Operations int
	// WaitP50 is the median time its operations waited before their work started.
	WaitP50 time.Duration
	// InflationP99 is the 99th percentile of its operations' latency inflation.
	InflationP99 float64
	// Target is the operator's SLO (0: none); Breached says InflationP99 is over it.
	Target   float64
	Breached bool
}

// Status returns workspace ws's fairness over the window.
func (t *Tracker) Status(ws string) Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.evictLocked(t.now())
	return t.statusLocked(t.ws[ws])
}

func (t *Tracker) statusLocked(s *wsStats) Status {
	st := Status{Target: t.target}
	if s == nil || len(s.samples) == 0 {
		return st
	}
	waits := make([]time.Duration, len(s.samples))
	infl := make([]float64, len(s.samples))
	for i, x := range s.samples {
		waits[i], infl[i] = x.wait, x.inflation
	}
	slices.Sort(waits)
	slices.Sort(infl)
	st.Operations = len(s.samples)
	st.WaitP50 = waits[len(waits)/2]
	st.InflationP99 = infl[min(len(infl)-1, len(infl)*99/100)]
	st.Breached = t.target > 0 && st.InflationP99 > t.target
	return st
}

// Jain is Jain's index over the active workspaces' x = 1 / mean inflation within the
// window (1 with fewer than two).
func (t *Tracker) Jain() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.evictLocked(t.now())
	return t.jainLocked()
}

func (t *Tracker) jainLocked() float64 {
	var sum, sq float64
	n := 0
	for _, s := range t.ws {
		if len(s.samples) == 0 {
			continue
		}
		mean := 0.0
		for _, x := range s.samples {
			mean += x.inflation
		}
		x := float64(len(s.samples)) / mean
		sum += x
		sq += x * x
		n++
	}
	if n < 2 || sq == 0 {
		return 1
	}
	return sum * sum / (float64(n) * sq)
}

// collector serves the window's gauges at scrape time.
type collector Tracker

var (
	descP99      = prometheus.NewDesc("loops_fairness_p99_inflation", "A workspace's 99th percentile latency inflation over the last 5 minutes.", []string{"workspace"}, nil)
	descTarget   = prometheus.NewDesc("loops_fairness_slo_target", "The p99 latency inflation a workspace may see (--fairness-target; 0: none).", nil, nil)
	descBreached = prometheus.NewDesc("loops_fairness_slo_breached", "1 while a workspace's p99 latency inflation over the last 5 minutes is over the target.", []string{"workspace"}, nil)
	descJain     = prometheus.NewDesc("loops_fairness_jain_index", "Jain's index over the active workspaces' 1/mean latency inflation in the last 5 minutes (1: all slowed alike).", nil, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descP99
	ch <- descTarget
	ch <- descBreached
	ch <- descJain
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	t := (*Tracker)(c)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.evictLocked(t.now())
	ch <- prometheus.MustNewConstMetric(descTarget, prometheus.GaugeValue, t.target)
	ch <- prometheus.MustNewConstMetric(descJain, prometheus.GaugeValue, t.jainLocked())
	for ws, s := range t.ws {
		st := t.statusLocked(s)
		ch <- prometheus.MustNewConstMetric(descP99, prometheus.GaugeValue, st.InflationP99, ws)
		breached := 0.0
		if st.Breached {
			breached = 1
		}
		ch <- prometheus.MustNewConstMetric(descBreached, prometheus.GaugeValue, breached, ws)
	}
}
