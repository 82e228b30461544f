package pools

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// Probe is a health check of a worker through its clients (both dialled over the worker
// protocol's mutual TLS): its grpc.health.v1 Check of the server as a whole, an error when
// it answers NOT_SERVING (python -m loops_worker and loops worker do while they shut down,
// and the Python worker once a device error broke its engine); then, when caps, its
// capabilities. A worker that does not serve the health service is checked by
// GetCapabilities alone.
func Probe(ctx context.Context, health *grpchealth.Client, trainer backendv1connect.TrainerServiceClient, caps bool) (*backendv1.GetCapabilitiesResponse, error) {
	res, err := health.Check(ctx, &grpchealth.CheckRequest{})
	switch {
	case connect.CodeOf(err) == connect.CodeUnimplemented:
		caps = true
	case err != nil:
		return nil, err
	case res.Status != grpchealth.StatusServing:
		return nil, fmt.Errorf("it answers %s: it is shutting down, or its engine broke (its log says why)", strings.ToUpper(res.Status.String()))
	}
	if !caps {
		return nil, nil
	}
	return trainer.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
}
