package core

import (
	"context"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// WorkspaceService implements loops.v1 WorkspaceService.
type WorkspaceService struct{ c *Core }

// GetWorkspace returns the caller's workspace, its policy's limits and its current use.
func (s WorkspaceService) GetWorkspace(ctx context.Context, _ *loopsv1.GetWorkspaceRequest) (*loopsv1.Workspace, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	c := s.c
	budgets, err := c.budgetStatus(ctx, ws)
	if err != nil {
		return nil, err
	}
	keyBudgets, err := c.keyBudgetsOf(ctx, ws)
	if err != nil {
		return nil, err
	}
	l, u, f := c.policy.Limits(ws), c.policy.Use(ws), c.fair.Status(ws)
	return &loopsv1.Workspace{
		Budgets:    budgets,
		KeyBudgets: keyBudgets,
		Name:       ws,
		Limits: &loopsv1.WorkspaceLimits{
			Models:              c.policy.Models(ws, c.modelList()),
			MaxSequenceLength:   int32(l.MaxSequenceLength),
			MaxLoraRank:         int32(l.MaxLoraRank),
			MaxConcurrentRuns:   int32(l.MaxConcurrentRuns),
			MaxQueuedOperations: int32(l.MaxQueuedOperations),
			SamplingConcurrency: int32(l.SamplingConcurrency),
			AllowedModalities:   l.Modalities(),
			AllowFullFinetune:   l.AllowFullFinetune,
		},
		Use: &loopsv1.WorkspaceUse{
			LiveRuns:         int32(u.LiveRuns),
			QueuedOperations: int32(u.QueuedOperations),
			RunningSamples:   int32(u.RunningSamples),
			WaitingSamples:   int32(u.WaitingSamples + c.samplers.queue.waiting(ws)),
			Fairness: &loopsv1.WorkspaceFairness{
				Operations: int32(f.Operations), WaitP50: durationpb.New(f.WaitP50),
				InflationP99: f.InflationP99, Target: f.Target, Breached: f.Breached,
			},
		},
	}, nil
}

// ModelList returns the served base models with their limits, sorted by name (the catalog
// an access grant is checked against).
func (c *Core) ModelList() []*loopsv1.ModelInfo { return c.modelList() }

// Policy returns the workspace policy's enforcer (access grants change it).
func (c *Core) Policy() *policy.Enforcer { return c.policy }

// modelList returns the served models, sorted by name.
func (c *Core) modelList() []*loopsv1.ModelInfo {
	out := make([]*loopsv1.ModelInfo, 0, len(c.models))
	for _, name := range slices.Sorted(maps.Keys(c.models)) {
		out = append(out, c.models[name])
	}
	return out
}

// catalogEntry is the backend's entry of a served model with what the gateway knows of it
// filled in: every backend trains and samples each model it serves, serverless on the
// shared pools, and dedicated too when the backend gives runs pools of their own.
func catalogEntry(m *loopsv1.ModelInfo, dedicated bool) *loopsv1.ModelInfo {
	m = proto.CloneOf(m)
	m.Trainable, m.Sampleable = true, true
	m.Availability = []string{policy.AvailabilityServerless}
	if dedicated {
		m.Availability = append(m.Availability, policy.AvailabilityDedicated)
	}
	return m
}
