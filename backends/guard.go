package backends

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// Guard returns b with every Trainer and Sampler call protected: a panic inside a call is
// logged with its stack under an incident id and returned as a CodeInternal error, so one
// bad request fails its own operation instead of the process (and every other workspace's
// work with it). The caller's goroutine must be the one that panics; implementations that
// fan work out to goroutines re-raise their panics on the calling goroutine.
func Guard(b Backend, log *slog.Logger) Backend {
	if log == nil {
		log = slog.Default()
	}
	return &guarded{Backend: b, t: guardedTrainer{b.Trainer(), log}, s: guardedSampler{b.Sampler(), log}}
}

type guarded struct {
	Backend
	t guardedTrainer
	s guardedSampler
}

func (g *guarded) Trainer() Trainer { return g.t }
func (g *guarded) Sampler() Sampler { return g.s }

// call runs f and turns a panic into a CodeInternal error.
func call[Req, Resp any](ctx context.Context, log *slog.Logger, method string, f func(context.Context, *Req) (*Resp, error), req *Req) (resp *Resp, err error) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		id := errs.NewID()
		log.Error("backend call panicked", slog.String("method", method), slog.String("incident", id),
			slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
		resp = nil
		// Already logged under id and fit for clients: the edges pass it on unmasked.
		err = errs.Incident(id, fmt.Sprintf(
			"the backend failed unexpectedly in %s (incident %s); its effect on the adapter is unknown: load the run's last checkpoint to continue", method, id))
	}()
	return f(ctx, req)
}

type guardedTrainer struct {
	t   Trainer
	log *slog.Logger
}

func (g guardedTrainer) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return call(ctx, g.log, "Trainer.GetCapabilities", g.t.GetCapabilities, req)
}

func (g guardedTrainer) CreateAdapter(ctx context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	return call(ctx, g.log, "Trainer.CreateAdapter", g.t.CreateAdapter, req)
}

func (g guardedTrainer) DeleteAdapter(ctx context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	return call(ctx, g.log, "Trainer.DeleteAdapter", g.t.DeleteAdapter, req)
}

func (g guardedTrainer) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	return call(ctx, g.log, "Trainer.ForwardBackward", g.t.ForwardBackward, req)
}

func (g guardedTrainer) OptimStep(ctx context.Context, req *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	return call(ctx, g.log, "Trainer.OptimStep", g.t.OptimStep, req)
}

func (g guardedTrainer) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	return call(ctx, g.log, "Trainer.SaveAdapter", g.t.SaveAdapter, req)
}

func (g guardedTrainer) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	return call(ctx, g.log, "Trainer.LoadAdapter", g.t.LoadAdapter, req)
}

type guardedSampler struct {
	s   Sampler
	log *slog.Logger
}

func (g guardedSampler) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return call(ctx, g.log, "Sampler.GetCapabilities", g.s.GetCapabilities, req)
}

func (g guardedSampler) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	return call(ctx, g.log, "Sampler.Sample", g.s.Sample, req)
}
