package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/loops-dev/loops/gateway/opsvc"
)

// startOps starts the server's health (gateway/opsvc): probed every
// opsvc.DefaultProbeEvery through storeHealth, what /healthz reports, and NOT_SERVING from
// the start of Close. Its probes stop before the store closes.
func (s *Server) startOps(ctx context.Context) {
	h := opsvc.NewHealth(ctx, opsvc.HealthOptions{
		Probe: s.storeProblem, Services: opsvc.LoopsServices(), Logger: s.log, Every: s.cfg.HealthProbeEvery,
	})
	s.mu.Lock()
	s.ops = h
	s.closers = append(s.closers, h.Close)
	s.mu.Unlock()
}

// drainOps makes the health NOT_SERVING (gRPC health, /readyz) and then keeps serving
// for Config.DrainDelay, or until ctx ends, so that load balancers and Kubernetes see it
// and stop sending before the listener closes.
func (s *Server) drainOps(ctx context.Context) {
	if s.ops == nil {
		return
	}
	s.ops.Drain()
	if d := s.cfg.DrainDelay; d > 0 {
		s.log.Info("draining: NOT_SERVING; serving on for the drain delay before the listener closes", slog.Duration("drain_delay", d))
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}
