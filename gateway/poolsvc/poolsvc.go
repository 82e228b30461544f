package poolsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// NoPoolsMessage is the message of the FailedPrecondition a gateway without pools answers.
const NoPoolsMessage = "this gateway's backend runs no worker pools (start loops serve --backend torch --backend-opt provider=local|static|ray)"

// maxIDLen is the longest pool id (pools.ValidateID).
const maxIDLen = 128

// Service implements loopsv1connect.PoolServiceHandler over a backend.
type Service struct {
	pm backends.PoolManager // nil: the backend cannot manage pools
}

var _ loopsv1connect.PoolServiceHandler = (*Service)(nil)

// New returns the service of a backend: its pools when it implements backends.PoolManager,
// FailedPrecondition for every call otherwise.
func New(be backends.Backend) *Service {
	pm, _ := be.(backends.PoolManager)
	return &Service{pm: pm}
}

// manager checks the caller is an operator and returns the pool manager.
func (s *Service) manager(ctx context.Context) (backends.PoolManager, error) {
	if err := auth.RequireOperator(ctx); err != nil {
		return nil, err
	}
	if s.pm == nil {
		return nil, errNoPools()
	}
	return s.pm, nil
}

func errNoPools() error {
	return errs.New(connect.CodeFailedPrecondition, errs.ReasonNoPools, errors.New(NoPoolsMessage))
}

// backendErr passes a backend's connect error on, turns ErrNoPools into the
// FailedPrecondition above, and leaves anything else to the edge (Internal, masked).
func backendErr(err error) error {
	var ce *connect.Error
	switch {
	case errors.Is(err, backends.ErrNoPools):
		return errNoPools()
	case errors.As(err, &ce):
		return ce
	}
	return err
}

// ValidatePoolID says what is wrong with a pool id given on the wire, without echoing more
// than maxIDLen bytes of it.
func ValidatePoolID(field, id string) error {
	if id == "" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is required: a pool id (loops pools list shows them)", field))
	}
	if len(id) > maxIDLen {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is %d bytes long; pool ids are at most %d", field, len(id), maxIDLen))
	}
	if err := pools.ValidateID(id); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %w", field, err))
	}
	return nil
}

// ValidateScale says what is wrong with a ScalePoolRequest, if anything.
func ValidateScale(req *loopsv1.ScalePoolRequest) error {
	if err := ValidatePoolID("id", req.GetId()); err != nil {
		return err
	}
	if req.Replicas == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("replicas is required (0 to stop every replica)"))
	}
	if n := req.GetReplicas(); n < 0 || n > pools.MaxReplicas {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replicas %d must be between 0 and %d", n, pools.MaxReplicas))
	}
	return nil
}

// ListPools implements loopsv1connect.PoolServiceHandler.
func (s *Service) ListPools(ctx context.Context, _ *loopsv1.ListPoolsRequest) (*loopsv1.ListPoolsResponse, error) {
	pm, err := s.manager(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := pm.ListPools(ctx)
	if err != nil {
		return nil, backendErr(err)
	}
	out := &loopsv1.ListPoolsResponse{Pools: make([]*loopsv1.Pool, 0, len(ps))}
	for _, p := range ps {
		out.Pools = append(out.Pools, poolProto(p))
	}
	return out, nil
}

// GetPool implements loopsv1connect.PoolServiceHandler.
func (s *Service) GetPool(ctx context.Context, req *loopsv1.GetPoolRequest) (*loopsv1.Pool, error) {
	pm, err := s.manager(ctx)
	if err != nil {
		return nil, err
	}
	if err := ValidatePoolID("id", req.GetId()); err != nil {
		return nil, err
	}
	return s.get(ctx, pm, req.GetId())
}

func (s *Service) get(ctx context.Context, pm backends.PoolManager, id string) (*loopsv1.Pool, error) {
	ps, err := pm.ListPools(ctx)
	if err != nil {
		return nil, backendErr(err)
	}
	if i := slices.IndexFunc(ps, func(p backends.PoolInfo) bool { return p.ID == id }); i >= 0 {
		return poolProto(ps[i]), nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("pool %q does not exist (or was deleted): loops pools list shows the pools", id))
}

// ScalePool implements loopsv1connect.PoolServiceHandler.
func (s *Service) ScalePool(ctx context.Context, req *loopsv1.ScalePoolRequest) (*loopsv1.Pool, error) {
	pm, err := s.manager(ctx)
	if err != nil {
		return nil, err
	}
	if err := ValidateScale(req); err != nil {
		return nil, err
	}
	if err := pm.ScalePool(ctx, req.GetId(), int(req.GetReplicas())); err != nil {
		return nil, backendErr(err)
	}
	return s.get(ctx, pm, req.GetId())
}

// DeletePool implements loopsv1connect.PoolServiceHandler.
func (s *Service) DeletePool(ctx context.Context, req *loopsv1.DeletePoolRequest) (*loopsv1.DeletePoolResponse, error) {
	pm, err := s.manager(ctx)
	if err != nil {
		return nil, err
	}
	if err := ValidatePoolID("id", req.GetId()); err != nil {
		return nil, err
	}
	if err := pm.DeletePool(ctx, req.GetId()); err != nil {
		return nil, backendErr(err)
	}
	return &loopsv1.DeletePoolResponse{}, nil
}

// ListAllocations implements loopsv1connect.PoolServiceHandler.
func (s *Service) ListAllocations(ctx context.Context, req *loopsv1.ListAllocationsRequest) (*loopsv1.ListAllocationsResponse, error) {
	pm, err := s.manager(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetPoolId() != "" {
		if err := ValidatePoolID("pool_id", req.GetPoolId()); err != nil {
			return nil, err
		}
	}
	as, err := pm.Allocations(ctx, req.GetPoolId())
	if err != nil {
		return nil, backendErr(err)
	}
	out := &loopsv1.ListAllocationsResponse{Allocations: make([]*loopsv1.Allocation, 0, len(as))}
	for _, a := range as {
		out.Allocations = append(out.Allocations, allocationProto(a))
	}
	return out, nil
}

func roleProto(r string) loopsv1.PoolRole {
	switch pools.Role(r) {
	case pools.RoleTrainer:
		return loopsv1.PoolRole_POOL_ROLE_TRAINER
	case pools.RoleSampler:
		return loopsv1.PoolRole_POOL_ROLE_SAMPLER
	}
	return loopsv1.PoolRole_POOL_ROLE_UNSPECIFIED
}

func stateProto(s backends.AllocationState) loopsv1.AllocationState {
	switch s {
	case backends.AllocationStarting:
		return loopsv1.AllocationState_ALLOCATION_STATE_STARTING
	case backends.AllocationRegistered:
		return loopsv1.AllocationState_ALLOCATION_STATE_REGISTERED
	case backends.AllocationAttached:
		return loopsv1.AllocationState_ALLOCATION_STATE_ATTACHED
	case backends.AllocationLost:
		return loopsv1.AllocationState_ALLOCATION_STATE_LOST
	}
	return loopsv1.AllocationState_ALLOCATION_STATE_UNSPECIFIED
}

// i32 clamps a count to int32 (backend counts are far below it: replicas ≤ 1024).
func i32(n int) int32 { return int32(min(max(n, 0), 1<<31-1)) }

func poolProto(p backends.PoolInfo) *loopsv1.Pool {
	return &loopsv1.Pool{Id: p.ID, Role: roleProto(p.Role), BaseModel: p.BaseModel, Provider: p.Provider,
		DesiredReplicas: i32(p.DesiredReplicas), RegisteredReplicas: i32(p.RegisteredReplicas), GpusPerReplica: i32(p.GPUsPerReplica),
		GpuKind: p.GPUKind, Preemptible: p.Preemptible, GpuSeconds: p.GPUSeconds, ReplicaSeconds: p.ReplicaSeconds,
		Workspace: p.Workspace, TrainingRunId: p.Run, Warm: p.Warm, Idle: p.Idle, ZeroReason: p.ZeroReason}
}

func allocationProto(a backends.Allocation) *loopsv1.Allocation {
	out := &loopsv1.Allocation{PoolId: a.Pool, Role: roleProto(a.Role), BaseModel: a.BaseModel, Replica: i32(a.Replica),
		Gpus: i32(a.GPUs), GpuIds: a.GPUIDs, State: stateProto(a.State), StateReason: a.Reason, Address: a.Address,
		Incarnation: a.Incarnation, AdapterCount: i32(len(a.Adapters)), TrainingRunIds: a.Adapters,
		GpuSeconds: a.GPUSeconds, ReplicaSeconds: a.ReplicaSeconds}
	if !a.Since.IsZero() {
		out.Since = timestamppb.New(a.Since)
	}
	return out
}
