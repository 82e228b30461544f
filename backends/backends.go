package backends

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

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

// ErrNoPools is returned (wrapped) by a PoolManager whose backend runs no worker pools (the
// worker backend without a provider option).
var ErrNoPools = errors.New("this backend runs no worker pools")

// PoolManager is the optional ability of a backend to show and change the worker pools it
// runs (the worker backend in pool mode: backends/worker, docs/pools.md). Every method of
// a backend that runs none returns an error wrapping ErrNoPools. An unknown pool id is a
// *connect.Error with CodeNotFound; a count out of range CodeInvalidArgument; a provider
// that cannot do what is asked (no free GPUs, no more static addresses) CodeFailedPrecondition
// with its reason.
type PoolManager interface {
	// ListPools returns the pools the backend manages, by id. A deleted pool is not listed.
	ListPools(ctx context.Context) ([]PoolInfo, error)
	// ScalePool sets a pool's desired replicas (0 .. pools.MaxReplicas, and within the
	// backend's slots): new replicas start, the highest-numbered ones stop, and the
	// adapters those held are lost (their runs reload their last checkpoint).
	ScalePool(ctx context.Context, id string, replicas int) error
	// DeletePool stops every replica of a pool and forgets it; the adapters they held are
	// lost. The pool stays deleted until the backend restarts.
	DeletePool(ctx context.Context, id string) error
	// Allocations returns the replicas of a pool (every pool when id is ""), by pool and
	// replica index: the desired ones, registered or not, and any other registered one.
	Allocations(ctx context.Context, id string) ([]Allocation, error)
}

// PoolInfo describes one pool.
type PoolInfo struct {
	// ID names the pool.
	ID string
	// Role is what its replicas do ("trainer" or "sampler").
	Role string
	// BaseModel is the model its replicas serve.
	BaseModel string
	// Provider places its replicas ("local", "static", "ray").
	Provider string
	// DesiredReplicas is what the pool is scaled to; RegisteredReplicas how many are
	// registered now.
	DesiredReplicas    int
	RegisteredReplicas int
	// GPUsPerReplica is how many GPUs each replica holds (0: CPU only).
	GPUsPerReplica int
	// GPUKind names their kind ("H100"; "" unnamed).
	GPUKind string
	// Preemptible says its replicas may be taken away at any time (spot capacity).
	Preemptible bool
	// ReplicaSeconds is the time its replicas have been registered, every replica slot and
	// incarnation together; GPUSeconds is that times GPUsPerReplica (0 for a CPU pool).
	ReplicaSeconds float64
	GPUSeconds     float64
	// Dedicated pools (DedicatedPools): the workspace and run holding it (empty while it
	// waits warm for the next run), and whether it is warm, or scaled to zero for idleness.
	Workspace, Run string
	Warm, Idle     bool
	// ZeroReason says why a dedicated pool is at zero when it was scaled down for a
	// reason of the gateway's (PoolZeroer: its workspace reached a budget); "" otherwise.
	ZeroReason string
}

// AllocationState says where a replica slot of a pool stands.
type AllocationState string

// The states of an Allocation.
const (
	// AllocationStarting: a desired replica that has not registered yet.
	AllocationStarting AllocationState = "starting"
	// AllocationRegistered: registered, not (yet) serving: the gateway has not reached it.
	AllocationRegistered AllocationState = "registered"
	// AllocationAttached: registered and serving the gateway's calls.
	AllocationAttached AllocationState = "attached"
	// AllocationLost: a desired replica whose last incarnation was lost (Reason says why)
	// and that has not registered again.
	AllocationLost AllocationState = "lost"
)

// Allocation is one replica slot of a pool and what it holds.
type Allocation struct {
	// Pool, Role and BaseModel are its pool's.
	Pool      string
	Role      string
	BaseModel string
	// Replica is its index in the pool.
	Replica int
	// GPUs is how many GPUs it holds; GPUIDs names them where the provider knows them (the
	// local provider's CUDA_VISIBLE_DEVICES assignment).
	GPUs   int
	GPUIDs []string
	// State says where it stands; Reason why it was lost (AllocationLost).
	State  AllocationState
	Reason string
	// Address and Incarnation are the registered replica's (empty when none is).
	Address     string
	Incarnation string
	// Since is when it entered its state: registered (registered, attached) or lost; zero
	// when unknown (starting).
	Since time.Time
	// Adapters are the ids of the adapters it holds, sorted (the gateway's adapter ids are
	// its training run ids).
	Adapters []string
	// ReplicaSeconds is the time replicas were registered in the slot, every incarnation
	// together; GPUSeconds is that times the pool's GPUs per replica.
	ReplicaSeconds float64
	GPUSeconds     float64
}

// PoolRequest asks for a dedicated pool: replicas of BaseModel bound to one training run
// (Owner) of a workspace, not shared with other runs.
type PoolRequest struct {
	BaseModel string
	// Replicas serve the run: its trainer, and samplers for its checkpoints (at least 1).
	Replicas int
	// SamplerReplicas, when above 0, are replicas in the sampler role beside them, which
	// then sample the run's checkpoints.
	SamplerReplicas int
	// Workspace and Owner (the run id) name who holds the pool, for the operator's views.
	Workspace, Owner string
}

// PoolGrant is a dedicated pool bound to a run.
type PoolGrant struct {
	// Pool names it; pass it as the pool of the run's CreateAdapter and Sample requests.
	Pool string
	// Warm: a pool another run had released within its keep-warm period was bound, instead
	// of starting one cold.
	Warm bool
	// GPUsPerReplica is what each replica holds (0: CPU); GPUKind their kind ("" unnamed),
	// which the price sheet's gpu_hour prices the pool's GPU time by.
	GPUsPerReplica int
	GPUKind        string
}

// DedicatedPools is the optional ability of a backend to give runs pools of their own
// (dedicated mode). A released pool is kept warm for a while and bound to the next request of
// the same shape; a bound pool idle for long enough is scaled to zero replicas and scaled up
// again on its next call (the run's adapter is then rebuilt by the core's step recovery).
type DedicatedPools interface {
	// AcquirePool binds a warm pool of the request's shape, or starts one and waits until a
	// replica serves. ResourceExhausted when the backend has no room for it.
	AcquirePool(ctx context.Context, req PoolRequest) (PoolGrant, error)
	// ReleasePool unbinds a pool: it is kept warm, then deleted.
	ReleasePool(ctx context.Context, pool string)
	// ReplicaSeconds is how many replica-seconds the pool has run while bound (scaled-to-zero
	// time excluded), for metering: multiply by GPUsPerReplica for GPU-seconds.
	ReplicaSeconds(pool string) float64
}

// PoolZeroer is the optional ability of a DedicatedPools backend to scale a bound pool to
// zero replicas now, as it does after idle_to_zero: the gateway does it to the idle pools of
// a workspace at its budget's cap, so they stop billing. The run keeps its pool; its next
// call scales it up again (and step recovery rebuilds its adapter).
type PoolZeroer interface {
	// ScaleIdleToZero scales pool to zero when it is bound, not at zero already, starting
	// nothing, and has had no call for idle; reason is shown with it (PoolInfo.ZeroReason)
	// until it scales up again. It reports whether it scaled the pool down.
	ScaleIdleToZero(ctx context.Context, pool string, idle time.Duration, reason string) (bool, error)
}

// WorkerHealth is implemented by backends whose work runs in worker processes: how many of
// their workers serve and how many are down (exited, not answering, or answering
// NOT_SERVING, and not yet back). The gateway exports them as loops_backend_workers. A
// backend without it (the embedded engine) has no workers.
type WorkerHealth interface {
	WorkerHealth() (up, down int)
}
