package compat

import (
	"context"

	"github.com/loops-dev/loops/internal/auditnote"
)

// resolveModel checks a Tinker model_id. It is passed to the core as it is: the core knows
// runs by their id and by the alias "<session_id>:train:<model_seq_id>" that tinker 0.38
// assumes, without reading any answer, for a run it creates from a checkpoint.
func (s *server) resolveModel(ctx context.Context, modelID string) (string, error) {
	auditnote.SetTarget(ctx, modelID)
	if modelID == "" {
		return "", badRequest("model_id is required")
	}
	return modelID, nil
}
