package backends

import (
	"context"
	"fmt"
	"sort"
	"sync"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// Trainer trains LoRA adapters. Its methods are the loops.backend.v1 TrainerService, so the
// in-process engine and a remote worker's gRPC client are interchangeable. Bad input is
// reported as a *connect.Error with CodeInvalidArgument; an unknown adapter as CodeNotFound.
type Trainer = backendv1connect.TrainerServiceHandler

// Sampler generates text from a base model with an optional adapter folder applied. Its
// methods are the unary RPCs of the loops.backend.v1 SamplerService; a sampler that can
// report tokens while it decodes also implements TokenStreamer (a remote worker does it
// through the service's StreamSample).
type Sampler interface {
	GetCapabilities(context.Context, *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error)
	Sample(context.Context, *backendv1.SampleRequest) (*backendv1.SampleResponse, error)
}

// Backend is a started backend: both roles and a way to stop it.
type Backend interface {
	Trainer() Trainer
	Sampler() Sampler
	// Close stops the backend and frees its resources.
	Close() error
}

// Config is what every backend factory is given. Options holds backend-specific settings
// (flag values such as model lists), which each backend documents.
type Config struct {
	// DataDir is a folder the backend may write to (built-in models, caches).
	DataDir string
	// Models are the base models to serve (names or local folders); empty means the
	// backend's defaults.
	Models []string
	// MaxLoraRank caps adapter ranks; 0 means the backend's default.
	MaxLoraRank int
	// Options are backend-specific key/value settings.
	Options map[string]string
}

// Factory starts a backend.
type Factory func(ctx context.Context, cfg Config) (Backend, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Factory{}
)

// Register makes a backend available by name. It panics if the name is taken, since that is
// a programming error in the binary's set of built-ins.
func Register(name string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic(fmt.Sprintf("backends: %q registered twice", name))
	}
	registry[name] = f
}

// Names lists the registered backends, sorted.
func Names() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Open starts the backend registered under name.
func Open(ctx context.Context, name string, cfg Config) (Backend, error) {
	registryMu.RLock()
	f, ok := registry[name]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("backends: no backend named %q (have %v)", name, Names())
	}
	return f(ctx, cfg)
}

// SamplerScaler is the optional ability of a backend to place sampler replicas of a base
// model: the worker backend in pool mode scales the model's pool. The core asks it for the
// replicas the model's deployments want (the most any of them asks for).
type SamplerScaler interface {
	// ScaleSamplers sets the sampler replicas of baseModel to n, or to the backend's own
	// configured count when that is larger, and returns the count it set. ok is false
	// when the backend places no replicas (not in pool mode): n is then not applied.
	ScaleSamplers(ctx context.Context, baseModel string, n int) (set int, ok bool, err error)
}

// Preemptible is the optional ability of a backend to say that the replicas serving a base
// model may be lost at any time (a pool on spot capacity): the core then keeps every run on
// that model recoverable step by step (a snapshot after each optim_step and a replay log),
// so a lost replica costs no step.
type Preemptible interface {
	// Preemptible reports whether baseModel is served by replicas that may be lost.
	Preemptible(baseModel string) bool
}
