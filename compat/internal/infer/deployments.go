package infer

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// createSampler creates the core sampler of a model string (ParseModel). A string that is
// neither a checkpoint path nor a served base model names a deployment:
// "[<owner>:]<name>[/<checkpoint name>]" (docs/deployments.md); the core resolves it and
// checks that the caller's workspace owns it or was granted it. A session ("" for none) is
// the one its usage is metered to (SessionHeader).
func (e *Engine) createSampler(ctx context.Context, session, base, path string) (*loopsv1.Sampler, error) {
	if path != "" || e.served(ctx, base) {
		return e.svc.Sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{SessionId: session, BaseModel: base, ModelPath: path})
	}
	info, err := e.svc.Sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{SessionId: session, Deployment: base})
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodeNotFound:
			return nil, &Error{Status: http.StatusNotFound, Param: "model", Code: "model_not_found",
				Message: fmt.Sprintf("model %q is neither a served base model (GET /models) nor a deployment you may use (loops deploy list): %s", Truncate(base), ce.Message())}
		case connect.CodeInvalidArgument:
			return nil, BadField("model", "%s", ce.Message())
		}
	}
	return info, err
}

// served says whether name is a base model the core serves.
func (e *Engine) served(ctx context.Context, name string) bool {
	res, err := e.svc.Models.ListModels(ctx, &loopsv1.ListModelsRequest{})
	if err != nil {
		return true // let CreateSampler report it
	}
	for _, m := range res.GetModels() {
		if m.GetName() == name {
			return true
		}
	}
	return false
}
