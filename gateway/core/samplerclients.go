package core

import (
	"context"
	"hash/maphash"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// MaxSamplerClients bounds the client ids of one sampler: the tinker SDK numbers a client's
// seq_ids from client_counter × 10⁹, which must stay within an int64.
const MaxSamplerClients = 999_999_999

// joinLocks serializes the joins of one sampler (striped by sampler id): the read of its
// record's count and the write of the next are one step. Only joins of samplers on the same
// stripe wait on it; sampling never takes it.
var joinLocks = &deploymentLocks{seed: maphash.MakeSeed()}

// SamplerClientService implements loops.v1 SamplerClientService.
type SamplerClientService struct{ c *Core }

// JoinSampler allocates the next client id of one of the workspace's samplers, counted on
// its record (so ids stay unique across restarts and across the sampler leaving memory).
func (s SamplerClientService) JoinSampler(ctx context.Context, req *loopsv1.JoinSamplerRequest) (*loopsv1.JoinSamplerResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	id := req.GetSamplerId()
	if id == "" {
		return nil, invalidArgument("sampler_id is required: the sampling session to join (create_sampling_session's sampling_session_id)")
	}
	// The sampler must be one the workspace may sample with now (a deployment's checks
	// included); its record holds the count.
	if _, err := s.c.samplers.get(ctx, ws, id); err != nil {
		return nil, err
	}
	defer joinLocks.lock(id)()
	info, err := s.c.store.GetSampler(ctx, ws, id)
	if err != nil {
		return nil, storeErr(err, "sampler "+quote(clip(id)))
	}
	n := info.GetClients() + 1
	if n > MaxSamplerClients {
		return nil, resourceExhausted("sampler %s has had %d clients join, the most it may: create a new sampling client", id, MaxSamplerClients)
	}
	info.Clients = n
	if err := s.c.store.PutSampler(ctx, ws, info); err != nil {
		return nil, internal("recording the sampler's clients", err)
	}
	return &loopsv1.JoinSamplerResponse{ClientCounter: n}, nil
}
