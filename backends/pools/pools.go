package pools

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Role is what a pool's replicas do.
type Role string

// The roles of a pool.
const (
	RoleTrainer Role = "trainer"
	RoleSampler Role = "sampler"
)

// Limits on a Spec (also the wire bounds of registrations).
const (
	MaxReplicas       = 1024
	MaxGPUsPerReplica = 64
)

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateID says what is wrong with a pool id, if anything: 1-128 characters of
// [A-Za-z0-9._-], starting with a letter or digit.
func ValidateID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("pool id %q must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

// Spec describes a pool.
type Spec struct {
	// ID names the pool: 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit.
	ID string `json:"id"`
	// Role is trainer or sampler.
	Role Role `json:"role"`
	// BaseModel is the model every replica serves (a worker --model argument: NAME or NAME=PATH).
	BaseModel string `json:"base_model"`
	// Replicas is the desired number of replicas (0 .. MaxReplicas).
	Replicas int `json:"replicas"`
	// GPUsPerReplica is how many GPUs each replica holds (0: CPU).
	GPUsPerReplica int `json:"gpus_per_replica"`
	// GPUKind names the kind of GPU its replicas hold ("H100"; "" unnamed): the price
	// sheet's gpu_hour prices a dedicated pool's GPU time by it.
	GPUKind string `json:"gpu_kind,omitempty"`
	// Args are extra worker command-line arguments.
	Args []string `json:"args,omitempty"`
	// Preemptible marks replicas that may be taken away at any time (spot capacity): the
	// gateway keeps its runs recoverable step by step (backends.Preemptible), and a provider
	// may place them on cheaper, preemptible capacity.
	Preemptible bool `json:"preemptible,omitempty"`
}

// Validate says what is wrong with a spec, if anything.
func (s Spec) Validate() error {
	switch {
	case !idRE.MatchString(s.ID):
		return fmt.Errorf("pool id %q must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", s.ID)
	case s.Role != RoleTrainer && s.Role != RoleSampler:
		return fmt.Errorf("pool %s: role %q must be %q or %q", s.ID, s.Role, RoleTrainer, RoleSampler)
	case s.BaseModel == "":
		return fmt.Errorf("pool %s: base_model is required", s.ID)
	case s.Replicas < 0 || s.Replicas > MaxReplicas:
		return fmt.Errorf("pool %s: replicas %d must be between 0 and %d", s.ID, s.Replicas, MaxReplicas)
	case s.GPUsPerReplica < 0 || s.GPUsPerReplica > MaxGPUsPerReplica:
		return fmt.Errorf("pool %s: gpus_per_replica %d must be between 0 and %d", s.ID, s.GPUsPerReplica, MaxGPUsPerReplica)
	case !ValidGPUKind(s.GPUKind):
		return fmt.Errorf("pool %s: gpu_kind %q must be 1-64 characters of letters, digits, '.', '_' or '-' (or empty)", s.ID, s.GPUKind)
	}
	return nil
}

// gpuKindRE is what a GPU kind may be.
var gpuKindRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidGPUKind reports whether kind may name a pool's GPU kind: empty, or 1-64 characters of
// [A-Za-z0-9._-] starting with a letter or digit.
func ValidGPUKind(kind string) bool { return kind == "" || gpuKindRE.MatchString(kind) }

// ErrNoPool is returned (wrapped) for a pool the provider does not know.
var ErrNoPool = errors.New("no such pool")

// Provider places pools of workers. Implementations are safe for concurrent use.
type Provider interface {
	// EnsurePool creates the pool, or brings an existing one to the spec (idempotent: the
	// same spec twice starts nothing new). Replicas come up asynchronously; Watch tells.
	EnsurePool(ctx context.Context, spec Spec) error
	// ScalePool sets the desired number of replicas: new ones start, the highest-numbered
	// ones stop.
	ScalePool(ctx context.Context, id string, replicas int) error
	// DeletePool stops every replica and forgets the pool. Deleting an unknown pool is not an
	// error.
	DeletePool(ctx context.Context, id string) error
	// Watch reports the pool's replicas as they change, starting with their current state,
	// until ctx ends or the pool is deleted (then a Deleted event, and the channel closes).
	Watch(ctx context.Context, id string) (<-chan Event, error)
	// Close stops what the provider runs itself (local processes); a remote engine's pools
	// stay up.
	Close() error
}

// SpecReader is the optional ability of a Provider to say the spec of a pool it manages:
// the spec it was ensured with, Replicas as last scaled (Args may hold secrets of the
// deployment: show them to operators only). ok is false for a pool it does not manage
// (never ensured, or deleted). The local, static and ray providers have it.
type SpecReader interface {
	Spec(id string) (spec Spec, ok bool)
}

// EventKind says what happened to a replica.
type EventKind string

// The kinds of Event.
const (
	// Up: the replica registered (a new incarnation: any state of an earlier one is gone).
	Up EventKind = "up"
	// Lost: the replica stopped heartbeating, exited or was stopped.
	Lost EventKind = "lost"
	// Deleted: the pool is gone (the last event of a Watch).
	Deleted EventKind = "deleted"
)

// Event is one change of a pool's replicas.
type Event struct {
	Kind        EventKind
	Pool        string
	Replica     int
	Incarnation string
	Address     string
	Reason      string
	Time        time.Time
}

func (e Event) String() string {
	return fmt.Sprintf("pool %s replica %d %s (incarnation %s, %s) %s", e.Pool, e.Replica, e.Kind, e.Incarnation, e.Address, e.Reason)
}
