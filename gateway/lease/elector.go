package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loops-dev/loops/gateway/store"
)

// Config configures an Elector. Zero durations take the defaults.
type Config struct {
	// Store keeps the lease (required).
	Store Store
	// Name names the lease (default DefaultName): gateways that share it elect one leader.
	Name string
	// Holder identifies this process (required, unique: a fresh one per start).
	Holder string
	// Address is where this gateway serves, for standbys to forward to (required).
	Address string
	// TTL is how long the lease lasts after a renewal (default DefaultTTL). A standby takes
	// over at most TTL after the leader's last renewal, plus RetryEvery.
	TTL time.Duration
	// RenewEvery is how often the leader renews (default TTL/4): a renewal may fail
	// TTL/RenewEvery − 1 times in a row before the leader steps down.
	RenewEvery time.Duration
	// RetryEvery is how often a standby tries to take the lease (default DefaultRetryEvery).
	RetryEvery time.Duration
	// Margin is how long before the TTL runs out, on its own clock, a leader that could not
	// renew steps down (default TTL/5): it covers the time OnLost takes to stop work and
	// the clocks' drift over one TTL.
	Margin time.Duration
	// Logger receives the elector's logs (default slog.Default()).
	Logger *slog.Logger
	// OnElected is called, on a goroutine of its own, when this gateway takes the lease;
	// renewals go on meanwhile.
	OnElected func(Record)
	// OnLost is called once when this gateway, having led, no longer may: it must stop
	// ordered work at once. Run returns after it.
	OnLost func(error)
}

func (c *Config) defaults() error {
	if c.Store == nil || c.Holder == "" || c.Address == "" {
		return errors.New("lease: Store, Holder and Address are required")
	}
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewEvery <= 0 {
		c.RenewEvery = c.TTL / 4
	}
	if c.RetryEvery <= 0 {
		c.RetryEvery = DefaultRetryEvery
	}
	if c.Margin <= 0 {
		c.Margin = c.TTL / 5
	}
	if c.RenewEvery >= c.TTL-c.Margin {
		return fmt.Errorf("lease: RenewEvery (%s) must be shorter than TTL − Margin (%s)", c.RenewEvery, c.TTL-c.Margin)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Status is what an elector knows of the lease.
type Status struct {
	// Leader is whether this gateway holds the lease.
	Leader bool
	// Term is the lease's term as last seen.
	Term int64
	// Holder and Address are the leader's as last seen (empty when none is known or the
	// lease has lapsed).
	Holder, Address string
	// Renewed is when the lease was last renewed, as last seen (local clock; zero: never).
	Renewed time.Time
	// Takeovers counts the times this gateway took the lease from another holder.
	Takeovers int
	// Lost is set once this gateway has stepped down.
	Lost bool
}

// Elector takes and keeps the lease for one gateway (see the package doc).
type Elector struct {
	cfg Config
	// down carries a step-down (StepDown) to the leading loop.
	down chan stepDown

	mu sync.Mutex
	st Status
}

// stepDown is a request to give up a term.
type stepDown struct {
	term int64
	err  error
}

// New returns an elector; Run starts it.
func New(cfg Config) (*Elector, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Elector{cfg: cfg, down: make(chan stepDown, 1)}, nil
}

// StepDown makes this gateway give up term at once, if it leads it: OnLost is called and Run
// returns, as when a renewal finds the lease taken. The store calls it (through Fence's
// Lost) when it refuses a write because another gateway holds the lease now. It never
// blocks; a term this gateway does not lead is ignored.
func (e *Elector) StepDown(term int64, err error) {
	select {
	case e.down <- stepDown{term, err}:
	default: // one is pending already
	}
}

// Fence returns the fence that the leader's store must check on every write while this
// elector leads rec's term (taken by it): a write after another gateway took the lease over
// fails, and makes this gateway step down (StepDown). A transaction of the store may wait
// idle for this process at most TTL/2, so that a leader stopped in the middle of one (a
// frozen VM) does not hold up a takeover, which comes TTL after its last renewal.
func (e *Elector) Fence(rec Record) store.Fence {
	return store.Fence{
		Lease: e.cfg.Name, Holder: e.cfg.Holder, Term: rec.Term, IdleTimeout: e.cfg.TTL / 2,
		Lost: func(err error) { e.StepDown(rec.Term, err) },
	}
}

// Config returns the elector's configuration with its defaults.
func (e *Elector) Config() Config { return e.cfg }

// Status returns what the elector knows now.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st
}

// Run tries to take the lease until it does, then keeps it until ctx ends (it then releases
// it, so a standby takes over at once) or it is lost (OnLost has been called). It returns
// ctx's error or ErrLost.
func (e *Elector) Run(ctx context.Context) error {
	rec, sent, err := e.acquire(ctx)
	if err != nil {
		return err
	}
	if e.cfg.OnElected != nil {
		go e.cfg.OnElected(rec)
	}
	return e.lead(ctx, rec.Term, sent)
}

// acquire polls TryAcquire until it succeeds; sent is when the successful call was sent.
func (e *Elector) acquire(ctx context.Context) (Record, time.Time, error) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return Record{}, time.Time{}, ctx.Err()
		case <-t.C:
		}
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, e.cfg.TTL-e.cfg.Margin)
		rec, ok, err := e.cfg.Store.TryAcquire(actx, e.cfg.Name, e.cfg.Holder, e.cfg.Address, e.cfg.TTL)
		cancel()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return Record{}, time.Time{}, ctx.Err()
			}
			e.cfg.Logger.Warn("trying to take the leader lease failed", slog.Any("err", err))
		case ok:
			e.mu.Lock()
			e.st = Status{Leader: true, Term: rec.Term, Holder: rec.Holder, Address: rec.Address, Renewed: sent, Takeovers: e.st.Takeovers}
			if rec.Previous != "" && rec.Previous != e.cfg.Holder {
				e.st.Takeovers++
			}
			e.mu.Unlock()
			attrs := []any{slog.Int64("term", rec.Term)}
			if rec.Previous != "" {
				attrs = append(attrs, slog.String("previous", rec.Previous),
					slog.Duration("after_lapse", rec.AcquiredAt.Sub(rec.PreviousExpiresAt)))
			}
			e.cfg.Logger.Info("took the leader lease", attrs...)
			return rec, sent, nil
		default:
			e.mu.Lock()
			e.st.Term = rec.Term
			e.st.Holder, e.st.Address = "", ""
			if rec.Live() {
				e.st.Holder, e.st.Address = rec.Holder, rec.Address
				// The record's renewal, moved onto the local clock.
				e.st.Renewed = time.Now().Add(-rec.Now.Sub(rec.RenewedAt))
			}
			e.mu.Unlock()
		}
		t.Reset(e.cfg.RetryEvery)
	}
}

// lead renews the lease every RenewEvery and steps down (OnLost) when a renewal finds it
// taken, or when TTL − Margin has passed since the last successful renewal was sent.
func (e *Elector) lead(ctx context.Context, term int64, lastSent time.Time) error {
	wait := e.cfg.RenewEvery
	for {
		fence := lastSent.Add(e.cfg.TTL - e.cfg.Margin)
		next := time.Now().Add(wait)
		if next.After(fence) {
			next = fence
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			e.release(term)
			return ctx.Err()
		case d := <-e.down:
			t.Stop()
			if d.term == term {
				return e.lost(d.err)
			}
			continue
		case <-t.C:
		}
		if !time.Now().Before(fence) {
			return e.lost(fmt.Errorf("lease: not renewed within %s of the last successful renewal (TTL %s − margin %s)", e.cfg.TTL-e.cfg.Margin, e.cfg.TTL, e.cfg.Margin))
		}
		sent := time.Now()
		err := e.renew(ctx, term, fence)
		switch {
		case err == nil:
			lastSent, wait = sent, e.cfg.RenewEvery
			e.mu.Lock()
			e.st.Renewed = sent
			e.mu.Unlock()
		case errors.Is(err, ErrLost):
			return e.lost(err)
		case ctx.Err() != nil:
			e.release(term)
			return ctx.Err()
		default:
			e.cfg.Logger.Warn("renewing the leader lease failed; retrying", slog.Any("err", err),
				slog.Duration("steps_down_in", time.Until(fence)))
			wait = min(e.cfg.RenewEvery, e.cfg.RetryEvery)
		}
	}
}

// errFenced is what renew returns when the fence passed before the store answered.
var errFenced = errors.New("lease: the renewal did not answer before the lease had to be given up")

// renew runs one renewal. It gives up after RenewEvery (a hung call is abandoned and the
// next one tried) and at the fence, even if the store ignores its context, and at once on a
// StepDown of the term (ErrLost).
func (e *Elector) renew(ctx context.Context, term int64, fence time.Time) error {
	deadline := time.Now().Add(e.cfg.RenewEvery)
	if deadline.After(fence) {
		deadline = fence
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.cfg.Store.Renew(rctx, e.cfg.Name, e.cfg.Holder, term, e.cfg.TTL)
		done <- err
	}()
	for {
		select {
		case err := <-done:
			return err
		case d := <-e.down:
			if d.term != term {
				continue
			}
			return fmt.Errorf("%w: %w", ErrLost, d.err)
		case <-rctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if time.Now().Before(fence) {
				return fmt.Errorf("lease: the renewal did not answer within %s", e.cfg.RenewEvery)
			}
			return errFenced
		}
	}
}

// lost steps down.
func (e *Elector) lost(err error) error {
	e.mu.Lock()
	e.st.Leader, e.st.Lost = false, true
	e.mu.Unlock()
	e.cfg.Logger.Error("lost the leader lease: stepping down", slog.Any("err", err))
	if e.cfg.OnLost != nil {
		e.cfg.OnLost(err)
	}
	if errors.Is(err, ErrLost) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrLost, err)
}

// release gives the lease up (a clean stop), bounded by the margin.
func (e *Elector) release(term int64) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Margin)
	defer cancel()
	e.mu.Lock()
	e.st.Leader = false
	e.mu.Unlock()
	if err := e.cfg.Store.Release(ctx, e.cfg.Name, e.cfg.Holder, term); err != nil {
		e.cfg.Logger.Warn("releasing the leader lease failed; a standby takes over once it expires", slog.Any("err", err))
		return
	}
	e.cfg.Logger.Info("released the leader lease", slog.Int64("term", term))
}

// Collector returns the elector's Prometheus gauges: loops_lease_is_leader (1 or 0),
// loops_lease_age_seconds (since the lease was last renewed, as last seen; -1 when no
// lease is known), loops_lease_term and loops_lease_takeovers_total.
func (e *Elector) Collector() prometheus.Collector {
	return collector{e: e,
		isLeader:  prometheus.NewDesc("loops_lease_is_leader", "1 when this gateway holds the leader lease, else 0.", nil, nil),
		age:       prometheus.NewDesc("loops_lease_age_seconds", "Seconds since the leader lease was last renewed, as this gateway last saw it (-1: no live lease known).", nil, nil),
		term:      prometheus.NewDesc("loops_lease_term", "The leader lease's term as last seen (grows by one per change of leader).", nil, nil),
		takeovers: prometheus.NewDesc("loops_lease_takeovers_total", "Times this gateway took the leader lease from another gateway.", nil, nil),
	}
}

type collector struct {
	e                              *Elector
	isLeader, age, term, takeovers *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.isLeader
	ch <- c.age
	ch <- c.term
	ch <- c.takeovers
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Status()
	leader, age := 0.0, -1.0
	if st.Leader {
		leader = 1
	}
	if !st.Renewed.IsZero() && (st.Leader || st.Holder != "") {
		age = time.Since(st.Renewed).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.isLeader, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(c.term, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(c.takeovers, prometheus.CounterValue, float64(st.Takeovers))
}
