package openai

import (
	"context"
	"slices"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// deploymentModel returns the deployment that model (one of its model strings, as GET
// /models lists them) addresses for the caller, or nil when none does.
func (s *server) deploymentModel(ctx context.Context, model string) *loopsv1.Deployment {
	if s.svc.Deployments == nil {
		return nil
	}
	res, err := s.svc.Deployments.ListDeployments(ctx, &loopsv1.ListDeploymentsRequest{})
	if err != nil {
		return nil
	}
	for _, d := range res.GetDeployments() {
		if slices.Contains(d.GetModels(), model) {
			return d
		}
	}
	return nil
}
