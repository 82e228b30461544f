// Package opsvc serves what operators' tools ask a gateway for, apart from its API: the
// standard gRPC health service (grpc.health.v1, Check and Watch) and the Kubernetes
// probes /livez and /readyz with the same meaning, gRPC server reflection (v1 and v1alpha)
// limited to the public loops.v1 schema, and Go's profiles under /debug/pprof for
// operators only. The gRPC services are connect-go's (connectrpc.com/grpchealth,
// connectrpc.com/grpcreflect), so they answer gRPC, gRPC-Web and Connect clients alike.
package opsvc

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/loops-dev/loops/internal/errs"
)

// Defaults of HealthOptions.
const (
	// DefaultProbeEvery is how often the store is probed.
	DefaultProbeEvery = 5 * time.Second
	// DefaultMaxWatchers bounds the Watch streams open at once, every client together.
	DefaultMaxWatchers = 256
	// maxMessageBytes bounds a health or reflection request (they are a few dozen bytes).
	maxMessageBytes = 64 << 10
)

// HealthOptions configure a Health.
type HealthOptions struct {
	// Probe checks the gateway's dependencies (its store and checkpoint store): "" when
	// they answer, else what failed, in words. It should return within a few seconds.
	Probe func(context.Context) string
	// Every is how often Probe runs (default DefaultProbeEvery). Check and Watch answer
	// from the last probe, so a health check costs the store nothing.
	Every time.Duration
	// Services are the fully-qualified names of the services whose health may be asked
	// for by name; "" (the server as a whole) always may.
	Services []string
	// MaxWatchers bounds the Watch streams open at once (default DefaultMaxWatchers); one
	// more is refused with ResourceExhausted.
	MaxWatchers int
	// Logger receives the changes of health (default slog.Default()).
	Logger *slog.Logger
}

// Health is the gateway's health: SERVING, or NOT_SERVING while it drains on shutdown or
// while its last probe failed. It implements grpchealth.Checker and grpchealth.Watcher,
// and answers /livez and /readyz. Every service has the server's health: they share the
// store and the shutdown.
type Health struct {
	opts HealthOptions

	mu       sync.Mutex
	draining bool
	failure  string // the last probe's failure, "" when it passed
	watchers map[*watchEntry]struct{}

	ctx    context.Context // ended by Close: the probes stop
	cancel context.CancelFunc
	done   chan struct{}
}

type watchEntry struct{ onChange func() }

// NewHealth probes once (so that the first answer is already the truth) and then every
// opts.Every in the background until Close.
func NewHealth(ctx context.Context, opts HealthOptions) *Health {
	if opts.Every <= 0 {
		opts.Every = DefaultProbeEvery
	}
	if opts.MaxWatchers <= 0 {
		opts.MaxWatchers = DefaultMaxWatchers
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Probe == nil {
		opts.Probe = func(context.Context) string { return "" }
	}
	h := &Health{opts: opts, watchers: map[*watchEntry]struct{}{}, done: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.WithoutCancel(ctx))
	h.failure = opts.Probe(ctx)
	go h.run()
	return h
}

func (h *Health) run() {
	defer close(h.done)
	t := time.NewTicker(h.opts.Every)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		failure := h.opts.Probe(h.ctx)
		if h.ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		changed := failure != h.failure
		h.failure = failure
		if changed {
			h.notifyLocked()
		}
		draining := h.draining
		h.mu.Unlock()
		switch {
		case !changed || draining:
		case failure != "":
			h.opts.Logger.Warn("health: NOT_SERVING", slog.String("why", failure))
		default:
			h.opts.Logger.Info("health: SERVING again: the store answers")
		}
	}
}

// Close stops the probes; it does not change the health.
func (h *Health) Close() error {
	h.cancel()
	<-h.done
	return nil
}

// Drain makes the server NOT_SERVING for good: it is shutting down. Watch streams get
// NOT_SERVING and then end, so that they do not hold the shutdown up.
func (h *Health) Drain() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.draining {
		h.draining = true
		h.notifyLocked()
	}
}

// notifyLocked tells every watcher that the health may have changed (onChange returns at
// once: grpchealth.Watcher).
func (h *Health) notifyLocked() {
	for w := range h.watchers {
		w.onChange()
	}
}

// problems returns why the server is not ready: nil when it is.
func (h *Health) problems() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var p []string
	if h.draining {
		p = append(p, "shutdown: the server is draining (shutting down); it takes no new work")
	}
	if h.failure != "" {
		p = append(p, "store: "+h.failure)
	}
	return p
}

func (h *Health) known(service string) error {
	if service == "" || slices.Contains(h.opts.Services, service) {
		return nil
	}
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(
		"unknown service %q: ask for \"\" (the server as a whole) or one of the services that server reflection lists", service))
}

// Check implements grpchealth.Checker.
func (h *Health) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if err := h.known(req.Service); err != nil {
		return nil, err
	}
	status := grpchealth.StatusServing
	h.mu.Lock()
	draining := h.draining
	if draining || h.failure != "" {
		status = grpchealth.StatusNotServing
	}
	h.mu.Unlock()
	if draining {
		// A Watch stream's check: the handler sends this NOT_SERVING (unless it was the last
		// status sent) and then sees its context done, which ends the stream.
		if end, ok := ctx.Value(endWatchKey{}).(context.CancelFunc); ok {
			end()
		}
	}
	return &grpchealth.CheckResponse{Status: status}, nil
}

// Watch implements grpchealth.Watcher.
func (h *Health) Watch(_ context.Context, req *grpchealth.CheckRequest, onChange func()) (func(), error) {
	if err := h.known(req.Service); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.watchers) >= h.opts.MaxWatchers {
		return nil, errs.New(connect.CodeResourceExhausted, errs.ReasonRateLimited, fmt.Errorf(
			"the server already has %d health Watch streams open, its limit: use Check, or close a Watch", h.opts.MaxWatchers))
	}
	w := &watchEntry{onChange: onChange}
	h.watchers[w] = struct{}{}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.watchers, w)
	}, nil
}

// endWatchKey carries, in a Watch stream's context, the function that ends the stream.
type endWatchKey struct{}

// endWatches gives every Watch stream a context that Check cancels once the server drains.
type endWatches struct{}

func (endWatches) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (endWatches) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (endWatches) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		return next(context.WithValue(ctx, endWatchKey{}, cancel), conn)
	}
}

// Handler returns grpc.health.v1.Health's path prefix and handler.
func (h *Health) Handler() (string, http.Handler) {
	return grpchealth.NewHandler(h, connect.WithReadMaxBytes(maxMessageBytes), connect.WithInterceptors(endWatches{}))
}

// Livez answers GET /livez: 200 "ok" while the process answers at all (Kubernetes'
// liveness: restart only a process that is stuck, never one whose store is down or that
// is draining).
func (h *Health) Livez(w http.ResponseWriter, _ *http.Request) {
	writeProbe(w, nil, "livez")
}

// Readyz answers GET /readyz: 200 "ok" when the server takes work, 503 listing what is
// wrong while it drains or its store does not answer (Kubernetes' readiness: send no
// traffic here). With ?verbose every check is listed, passed ones too.
func (h *Health) Readyz(w http.ResponseWriter, r *http.Request) {
	p := h.problems()
	if _, verbose := r.URL.Query()["verbose"]; verbose && len(p) == 0 {
		writeProbe(w, []string{"[+]shutdown ok", "[+]store ok"}, "readyz")
		return
	}
	lines := make([]string, len(p))
	for i, s := range p {
		lines[i] = "[-]" + s
	}
	writeProbe(w, lines, "readyz")
}

// writeProbe writes a probe's answer in Kubernetes' form: the checks, one a line ("[+]…"
// passed, "[-]…" failed), then "<probe> check passed" or "failed"; a plain "ok" when all
// passed and none is listed.
func writeProbe(w http.ResponseWriter, lines []string, probe string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	failed := slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "[-]") })
	if failed {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	if len(lines) == 0 {
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	verdict := probe + " check passed\n"
	if failed {
		verdict = probe + " check failed\n"
	}
	_, _ = w.Write([]byte(strings.Join(lines, "\n") + "\n" + verdict))
}
