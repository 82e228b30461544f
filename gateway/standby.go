package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/lease"
	"github.com/loops-dev/loops/gateway/opsvc"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/errs"
)

// Two gateways on one database (docs/two-gateways.md). With Config.Lease set, a gateway
// leads only while it holds the leader lease (package lease): then it runs the core (the
// schedulers, the backend calls, the persister) and answers everything itself. Until then
// it is a standby: it answers /healthz and /metrics, and forwards every other request to
// the leader, whose address the lease names; ordered work exists only on the leader, and so
// do the results of operations in flight (in its memory), so the standby answers nothing
// from the database itself. While no leader can be reached (the leader died and its lease
// has not lapsed yet) a request waits up to noLeaderWait for one, then gets a 503 with the
// reason NO_LEADER, which the tinker SDK retries. When the standby takes the lease it starts
// its core as after a restart (operations left unfinished are failed, with a message that
// says the gateway failed over) and answers from then on.
//
// The store is fenced with the lease (store.Fencer): a standby's refuses every write, and a
// leader's checks, in the transaction of each write, that its term still holds the lease. A
// write refused because another gateway took over (store.ErrFenced: this leader was paused
// past its lease, say) makes it step down at once, as a lost renewal does: requests stop
// reaching its core and OnLost stops the process.

// LeaseConfig makes a gateway one of several on a shared database.
type LeaseConfig struct {
	// Store keeps the lease (for example a pglease.Store on the same database).
	Store lease.Store
	// Holder identifies this process (default: a fresh random id).
	Holder string
	// Address is where other gateways reach this one (http://host:port; required).
	Address string
	// TTL is the lease's time to live (default lease.DefaultTTL); RetryEvery how often a
	// standby tries to take it (default lease.DefaultRetryEvery).
	TTL, RetryEvery time.Duration
	// OnLost is called when this gateway, having led, may no longer (its lease could not
	// be renewed in time, or was taken, or the store refused a write because another
	// gateway holds it): it must stop all work at once. Default: log and
	// exit the process with status 3, as a crash would (a supervisor restarts it as a
	// standby).
	OnLost func(error)
}

// noLeaderWait is how long a request at a standby waits for a reachable leader before it
// is answered 503 NO_LEADER. It also paces clients that retry a 503 at once (the tinker
// SDK's retrieve_future loop does).
const noLeaderWait = time.Second

// forwardedHeader marks a request a standby forwarded; a gateway that is not leader answers
// such a request 503 rather than forwarding it again.
const forwardedHeader = "X-Loops-Forwarded-By"

// exitLeaseLost is the process's exit status when it loses the lease (LeaseConfig.OnLost).
const exitLeaseLost = 3

// failover is a gateway's part in a group of gateways on one database.
type failover struct {
	cfg     LeaseConfig
	elector *lease.Elector
	cancel  context.CancelFunc
	done    chan struct{}
	proxy   *httputil.ReverseProxy
	// leader is the core's handler once this gateway leads (nil before).
	leader atomic.Pointer[http.Handler]
	// mu guards closing: Close and a takeover do not overlap.
	mu      sync.Mutex
	closing bool
	// routeMu guards lost: once the lease is lost, requests never reach the core again.
	routeMu sync.Mutex
	lost    bool
}

// route sends every request to the core's handler h from now on, unless the lease was lost
// (false).
func (fo *failover) route(h *http.Handler) bool {
	fo.routeMu.Lock()
	defer fo.routeMu.Unlock()
	if !fo.lost {
		fo.leader.Store(h)
	}
	return !fo.lost
}

// unroute stops sending requests to the core, for good: the lease is lost.
func (fo *failover) unroute() {
	fo.routeMu.Lock()
	defer fo.routeMu.Unlock()
	fo.lost = true
	fo.leader.Store(nil)
}

type targetKey struct{}

// leaderCore returns the server's core, nil while it is a standby.
func (s *Server) leaderCore() *core.Core {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.core
}

// lead starts the core and returns the handler of every route.
func (s *Server) lead(ctx context.Context, reg *prometheus.Registry, st store.Store, be backends.Backend, copts core.Options) (http.Handler, error) {
	c, err := core.New(ctx, st, be, copts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.core = c
	s.closers = append(s.closers, c.Close)
	s.mu.Unlock()
	return s.handler(ctx, reg)
}

// standby starts the elector and returns the handler that forwards to the leader until
// this gateway leads.
func (s *Server) standby(ctx context.Context, reg *prometheus.Registry, st store.Store, be backends.Backend, copts core.Options) (http.Handler, error) {
	lc := *s.cfg.Lease
	if lc.Holder == "" {
		lc.Holder = errs.NewID()
	}
	if lc.OnLost == nil {
		lc.OnLost = func(err error) {
			s.log.Error("lost the leader lease: exiting at once so that no work continues", slog.Any("err", err))
			os.Exit(exitLeaseLost)
		}
	}
	fo := &failover{cfg: lc, done: make(chan struct{})}
	// Losing the lease (the elector's fence, a renewal that finds it taken, or a write the
	// store refused: store.ErrFenced) ends the leading at once: requests no longer reach the
	// core, then OnLost stops the process.
	onLost := func(err error) {
		fo.unroute()
		lc.OnLost(err)
	}
	// Outcomes go to the shared database before clients see them: a journal on this
	// host's disk would not be replayed by the gateway that takes over.
	copts.PublishAfterCommit = true
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fo.cancel = cancel
	el, err := lease.New(lease.Config{
		Store: lc.Store, Holder: lc.Holder, Address: lc.Address, TTL: lc.TTL, RetryEvery: lc.RetryEvery,
		Logger: s.log,
		OnElected: func(rec lease.Record) {
			fo.mu.Lock()
			defer fo.mu.Unlock()
			if fo.closing {
				return
			}
			start := time.Now()
			o := copts
			o.TookOver = rec.Previous != ""
			// Every write of this term checks, in its own transaction, that the term still
			// holds the lease (docs/two-gateways.md, "Fenced writes").
			if err := st.SetFence(fo.elector.Fence(rec)); err != nil {
				onLost(fmt.Errorf("fencing the store with the lease's term: %w", err))
				return
			}
			// A standby's cached key lookups may predate revocations the old leader made
			// (the standby forwarded those requests): the leader starts from the database.
			s.cfg.Keys.Directory().Flush()
			h, err := s.lead(lctx, reg, st, be, o)
			if err != nil {
				onLost(fmt.Errorf("starting the core after taking the lease: %w", err))
				return
			}
			if !fo.route(&h) {
				return // the lease was lost while the core started
			}
			attrs := []any{slog.Int64("term", rec.Term), slog.Duration("core_start", time.Since(start))}
			if rec.Previous != "" {
				attrs = append(attrs, slog.String("previous", rec.Previous),
					slog.Duration("lapse_to_lease", rec.AcquiredAt.Sub(rec.PreviousExpiresAt)),
					slog.Duration("lapse_to_ready", rec.AcquiredAt.Sub(rec.PreviousExpiresAt)+time.Since(start)))
			}
			s.log.Info("leading: this gateway runs the schedulers now", attrs...)
		},
		OnLost: onLost,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	// Until it leads, the store refuses every write: no term is 0.
	if err := st.SetFence(store.Fence{Lease: el.Config().Name, Holder: lc.Holder}); err != nil {
		cancel()
		return nil, fmt.Errorf("gateway: the leader lease needs a store that fences its writes (PostgreSQL): %w", err)
	}
	fo.elector = el
	fo.proxy = newProxy(s.log, lc.Holder)
	s.fo = fo
	reg.MustRegister(el.Collector())
	go func() {
		defer close(fo.done)
		_ = el.Run(lctx)
	}()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	opsvc.Register(mux, s.ops)
	mux.HandleFunc("/", fo.forward)
	keys := s.cfg.Keys
	if keys == nil {
		keys = &auth.Keys{}
	}
	standby := withBodyReadDeadline(s.cfg.Limits.BodyReadTimeout, recoverPanics(s.log,
		keys.Middleware(auth.Policy{Public: publicPaths, MaxRequestsPerKey: s.cfg.Limits.MaxRequestsPerKey,
			Throttle: s.throttle, Proxies: s.cfg.TrustedProxies}, mux)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := fo.leader.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		standby.ServeHTTP(w, r)
	}), nil
}

// newProxy returns the reverse proxy that forwards to the leader whose URL the request's
// context holds (targetKey), marking the request as forwarded by holder.
func newProxy(log *slog.Logger, holder string) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(targetKey{}).(*url.URL))
			pr.Out.Host = pr.In.Host // the leader checks the Host the client used
			pr.SetXForwarded()
			pr.Out.Header.Set(forwardedHeader, holder)
			// The leader's spans continue this gateway's (nothing with tracing off).
			otel.GetTextMapPropagator().Inject(pr.In.Context(), propagation.HeaderCarrier(pr.Out.Header))
		},
		FlushInterval: -1, // streamed answers (server-sent events) pass at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.WarnContext(r.Context(), "forwarding to the leader failed", slog.String("path", r.URL.Path), slog.Any("err", err))
			noLeader(w, "the leader gateway did not answer (it may have just died; a standby takes over once its lease lapses)")
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// forward sends a request to the leader, waiting up to noLeaderWait for one.
func (fo *failover) forward(w http.ResponseWriter, r *http.Request) {
	if by := r.Header.Get(forwardedHeader); by != "" {
		noLeader(w, "this gateway is not the leader either (the lease changed hands while the request was forwarded)")
		return
	}
	deadline := time.NewTimer(noLeaderWait)
	defer deadline.Stop()
	tick := time.NewTicker(noLeaderWait / 20)
	defer tick.Stop()
	for {
		if h := fo.leader.Load(); h != nil { // this gateway took over meanwhile
			(*h).ServeHTTP(w, r)
			return
		}
		st := fo.elector.Status()
		if st.Address != "" && st.Holder != fo.cfg.Holder {
			target, err := url.Parse(st.Address)
			if err == nil && target.Host != "" {
				fo.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
				return
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-deadline.C:
			noLeader(w, "no leader gateway is known yet (the previous one's lease has not lapsed, or a standby is taking over)")
			return
		case <-tick.C:
		}
	}
}

// noLeader answers 503 NO_LEADER: retryable, and marked so for the SDK.
func noLeader(w http.ResponseWriter, why string) {
	body, _ := json.Marshal(struct {
		Detail string `json:"detail"`
		Code   string `json:"code"`
		Reason string `json:"reason"`
	}{Detail: why + ": retry in a second", Code: "unavailable", Reason: errs.ReasonNoLeader})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.Header().Set("x-should-retry", "true")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(body)
}

// role is "leader" or "standby" for /healthz ("leader" without a lease: the only gateway).
func (s *Server) role() string {
	if s.fo == nil || s.fo.leader.Load() != nil {
		return "leader"
	}
	return "standby"
}

// leaseStatus is what /healthz says of the lease (nil without one).
func (s *Server) leaseStatus() *leaseHealth {
	if s.fo == nil {
		return nil
	}
	st := s.fo.elector.Status()
	return &leaseHealth{Holder: s.fo.cfg.Holder, Leader: st.Address, Term: st.Term, Takeovers: st.Takeovers}
}

// leaseHealth is the lease part of /healthz.
type leaseHealth struct {
	// Holder is this gateway's id in the lease.
	Holder string `json:"holder"`
	// Leader is the leader's address as last seen (empty: none known).
	Leader string `json:"leader,omitempty"`
	// Term is the lease's term as last seen.
	Term int64 `json:"term"`
	// Takeovers counts the times this gateway took the lease from another.
	Takeovers int `json:"takeovers"`
}

// stopLease stops taking or renewing the lease and, when this gateway leads, releases it so
// that a standby takes over at once. Close calls it after the core has stopped.
func (s *Server) stopLease() {
	if s.fo == nil {
		return
	}
	s.fo.cancel()
	<-s.fo.done
}

// closingLease keeps a standby from taking over while the server closes.
func (s *Server) closingLease() {
	if s.fo == nil {
		return
	}
	s.fo.mu.Lock()
	s.fo.closing = true
	s.fo.mu.Unlock()
}

var errNoLeaseAddress = errors.New("gateway: Lease.Address is required: the address other gateways reach this one at")
