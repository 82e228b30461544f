package audit

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loops-dev/loops/gateway/store"
)

// Defaults of Options.
const (
	DefaultRetention       = 90 * 24 * time.Hour
	DefaultMaxPerWorkspace = 1_000_000
	DefaultBuffer          = 8192
	DefaultBatch           = 512
	DefaultFlushEvery      = 200 * time.Millisecond
	DefaultSweepEvery      = time.Hour
	// DefaultAdmitWait is how long a mutating call waits for room in a full buffer before
	// it is refused.
	DefaultAdmitWait = time.Second
	// DefaultCloseWait bounds the final flush when the recorder closes.
	DefaultCloseWait = 10 * time.Second
)

// Options tune a Recorder. Zero values take the defaults.
type Options struct {
	// Retention is how long events are kept (--audit-retention; default 90 days).
	Retention time.Duration
	// MaxPerWorkspace caps the events one workspace keeps: the sweep removes its oldest
	// beyond it (default 1,000,000).
	MaxPerWorkspace int
	// Buffer is how many events may wait to be written, the one in flight included
	// (default 8192).
	Buffer int
	// Batch is the most events one write appends (default 512).
	Batch int
	// FlushEvery is how long an event may wait for a batch to fill (default 200 ms).
	FlushEvery time.Duration
	// SweepEvery is how often retention and the cap are applied (default 1 h).
	SweepEvery time.Duration
	// AdmitWait is how long Admit waits for room (default 1 s).
	AdmitWait time.Duration
	// Logger receives the recorder's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the recorder's metrics (none when nil).
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxPerWorkspace, DefaultMaxPerWorkspace)
	def(&o.Buffer, DefaultBuffer)
	def(&o.Batch, DefaultBatch)
	defd(&o.Retention, DefaultRetention)
	defd(&o.FlushEvery, DefaultFlushEvery)
	defd(&o.SweepEvery, DefaultSweepEvery)
	defd(&o.AdmitWait, DefaultAdmitWait)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// ErrFull is Admit's answer when the buffer stays full for AdmitWait: the store is not
// keeping up (or is down), and a mutating call that could not be recorded is not run.
var ErrFull = errors.New("the audit log's write buffer is full: the server cannot record more changes until its database catches up; retry shortly")

// ErrClosed is Admit's answer once the recorder is closing.
var ErrClosed = errors.New("the audit log is closing: the server is shutting down")

// Recorder writes audit events to the store off the request path: a recorded call takes a
// slot of a bounded buffer before it runs (Admit), puts its event in it when answered
// (Slot.Record), and one goroutine appends the buffer to the store in batches.
//
// When the buffer is full the call waits up to AdmitWait for room and is then refused
// (429, not run): a change is never made without its record, and records are never
// dropped to make room. A write the store fails is retried, holding its slots, so a store
// that is down turns into refused mutations, not lost records; reads are never held up.
// The one loss left is a process that dies (or a Close whose grace ends) with events in
// the buffer: those are counted in loops_audit_events_lost_total and logged.
type Recorder struct {
	st   store.AuditStore
	opt  Options
	log  *slog.Logger
	mx   metrics
	slot chan struct{}              // a token per event admitted and not yet written
	in   chan store.OwnedAuditEvent // events recorded, to be written

	// recorded and written count the events put in the buffer and appended to the store;
	// kick asks the writer to write at once (Flush).
	recorded, written atomic.Int64
	kick              chan struct{}

	// closeWait bounds the final flush (DefaultCloseWait).
	closeWait time.Duration

	mu      sync.Mutex
	closing bool
	pending sync.WaitGroup // admitted slots not yet recorded or released
	stop    chan struct{}
	done    chan struct{}
}

type metrics struct {
	written, refused, lost, failures prometheus.Counter
	swept                            prometheus.Counter
}

// NewRecorder returns a recorder writing to st; Start runs it.
func NewRecorder(st store.AuditStore, o Options) *Recorder {
	o = o.withDefaults()
	r := &Recorder{st: st, opt: o, log: o.Logger,
		slot: make(chan struct{}, o.Buffer), in: make(chan store.OwnedAuditEvent, o.Buffer),
		stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1), closeWait: DefaultCloseWait}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	r.mx = metrics{
		written:  c("loops_audit_events_written_total", "Audit events appended to the store."),
		refused:  c("loops_audit_refused_total", "Mutating calls refused (429) because the audit buffer stayed full."),
		lost:     c("loops_audit_events_lost_total", "Audit events still buffered when the recorder closed and its grace ended."),
		failures: c("loops_audit_write_failures_total", "Failed appends of an audit batch (each is retried)."),
		swept:    c("loops_audit_events_swept_total", "Audit events removed by the retention sweep and the per-workspace cap."),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(r.mx.written, r.mx.refused, r.mx.lost, r.mx.failures, r.mx.swept,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "loops_audit_buffer_events",
				Help: "Audit events admitted and not yet written."}, func() float64 { return float64(len(r.slot)) }))
	}
	return r
}

// Retention is how long events are kept.
func (r *Recorder) Retention() time.Duration { return r.opt.Retention }

// Start runs the writer and the sweeper until Close.
func (r *Recorder) Start() {
	go r.write()
	go r.sweepLoop()
}

// Slot is room for one event in the buffer: Record it or Release it, once.
type Slot struct {
	r    *Recorder
	once sync.Once
}

// Admit takes a slot for a call about to run, waiting up to AdmitWait (or ctx) for room:
// ErrFull when there is none, ErrClosed once closing.
func (r *Recorder) Admit(ctx context.Context) (*Slot, error) {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	r.pending.Add(1)
	r.mu.Unlock()
	select {
	case r.slot <- struct{}{}:
		return &Slot{r: r}, nil
	default:
	}
	t := time.NewTimer(r.opt.AdmitWait)
	defer t.Stop()
	select {
	case r.slot <- struct{}{}:
		return &Slot{r: r}, nil
	case <-t.C:
	case <-ctx.Done():
	}
	r.pending.Done()
	r.mx.refused.Inc()
	return nil, ErrFull
}

// Record puts the event in the slot (never blocks: the slot holds its room).
func (s *Slot) Record(workspace string, e store.AuditEvent) {
	s.once.Do(func() {
		s.r.recorded.Add(1)
		s.r.in <- store.OwnedAuditEvent{Workspace: workspace, Event: e}
		s.r.pending.Done()
	})
}

// Release gives the slot back unused.
func (s *Slot) Release() {
	s.once.Do(func() {
		<-s.r.slot
		s.r.pending.Done()
	})
}

// write appends the buffer to the store in batches until Close, then flushes what is left.
func (r *Recorder) write() {
	defer close(r.done)
	batch := make([]store.OwnedAuditEvent, 0, r.opt.Batch)
	tick := time.NewTicker(r.opt.FlushEvery)
	defer tick.Stop()
	for {
		select {
		case e := <-r.in:
			batch = append(batch, e)
			if len(batch) < r.opt.Batch {
				continue
			}
		case <-tick.C:
		case <-r.kick:
			for more := len(batch) < r.opt.Batch; more; {
				select {
				case e := <-r.in:
					batch = append(batch, e)
					more = len(batch) < r.opt.Batch
				default:
					more = false
				}
			}
		case <-r.stop:
			r.drain(batch)
			return
		}
		if len(batch) > 0 && r.flush(batch, r.stop) {
			batch = batch[:0]
		}
	}
}

// flush appends batch, retrying with backoff until it is written (true) or stop closes
// (false: the batch is still to be written).
func (r *Recorder) flush(batch []store.OwnedAuditEvent, stop <-chan struct{}) bool {
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := r.st.AppendAuditEvents(ctx, batch)
		cancel()
		if err == nil {
			r.written.Add(int64(len(batch)))
			r.mx.written.Add(float64(len(batch)))
			for range batch {
				<-r.slot
			}
			return true
		}
		r.mx.failures.Inc()
		r.log.Warn("audit: appending events failed; retrying (mutating calls are refused while the buffer is full)",
			slog.Int("events", len(batch)), slog.Any("err", err))
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 5*time.Second)
		case <-stop:
			return false
		}
	}
}

// drain writes batch and everything recorded until the pending slots are settled, within
// DefaultCloseWait; what it cannot write is counted as lost.
func (r *Recorder) drain(batch []store.OwnedAuditEvent) {
	settled := make(chan struct{})
	go func() { r.pending.Wait(); close(settled) }()
	timeout := make(chan struct{})
	deadline := time.AfterFunc(r.closeWait, func() { close(timeout) })
	defer deadline.Stop()
	for {
		select {
		case e := <-r.in:
			batch = append(batch, e)
			if len(batch) < r.opt.Batch {
				continue
			}
		case <-settled:
			for more := true; more; {
				select {
				case e := <-r.in:
					batch = append(batch, e)
				default:
					more = false
				}
			}
			if len(batch) > 0 && !r.flush(batch, timeout) {
				r.lose(len(batch))
			}
			return
		case <-timeout:
			n := len(batch) + len(r.in)
			r.lose(n)
			return
		}
		if !r.flush(batch, timeout) {
			r.lose(len(batch) + len(r.in))
			return
		}
		batch = batch[:0]
	}
}

func (r *Recorder) lose(n int) {
	if n == 0 {
		return
	}
	r.mx.lost.Add(float64(n))
	r.log.Error("audit: events could not be written before shutdown and are lost", slog.Int("events", n))
}

// Close refuses new calls, waits for the calls admitted to record, writes everything
// buffered (within DefaultCloseWait) and stops the sweeper. It is for the server's closers,
// after the listener has stopped; a second Close does nothing.
func (r *Recorder) Close() error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil
	}
	r.closing = true
	r.mu.Unlock()
	close(r.stop)
	<-r.done
	return nil
}

// Flush asks the writer to write now and waits until every event recorded before the call
// is in the store, or ctx ends: a reader of the log sees its own calls.
func (r *Recorder) Flush(ctx context.Context) error {
	target := r.recorded.Load()
	for r.written.Load() < target {
		select {
		case r.kick <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.done:
			return nil
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// sweepLoop applies retention and the cap at start and every SweepEvery.
func (r *Recorder) sweepLoop() {
	t := time.NewTicker(r.opt.SweepEvery)
	defer t.Stop()
	for {
		r.Sweep(context.Background())
		select {
		case <-t.C:
		case <-r.stop:
			return
		}
	}
}

// Sweep removes the events older than the retention and each workspace's beyond the cap.
func (r *Recorder) Sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	n, err := r.st.DeleteAuditEventsBefore(ctx, r.opt.Now().Add(-r.opt.Retention))
	if err != nil {
		r.log.Warn("audit: retention sweep failed", slog.Any("err", err))
	}
	m, err := r.st.TrimAuditEvents(ctx, r.opt.MaxPerWorkspace)
	if err != nil {
		r.log.Warn("audit: per-workspace cap sweep failed", slog.Any("err", err))
	}
	if n+m > 0 {
		r.mx.swept.Add(float64(n + m))
		r.log.Info("audit: swept old events", slog.Int("expired", n), slog.Int("over_cap", m))
	}
}
