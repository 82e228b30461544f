package compat

import (
	"net/http"

	"github.com/loops-dev/loops/internal/errs"
)

// errCustomLossClientSide is the answer to create_custom_loss. Loops does not run traced
// losses on the server: a torch.fx graph names arbitrary torch functions, which only a
// torch runtime can run (none is in the gateway, and running Python on a shared server is a
// sandboxing problem Loops does not take on), while the SDK computes the same loss and its
// gradient on the client, exactly, with two forward_backward rounds. client/config answers
// custom_loss_server_side: false, so the SDK's create_custom_loss never calls this route;
// only a client that ignores the flag gets here. The answer is a 400 (the SDK retries 5xx
// for minutes), never a bare 404.
var errCustomLossClientSide = &apiError{status: http.StatusBadRequest, code: "unimplemented",
	reason: errs.ReasonCustomLossClientSide,
	detail: "server-side custom losses are not run by Loops (client/config answers custom_loss_server_side: false): " +
		"ServiceClient.create_custom_loss works unchanged and TrainingClient.forward_backward_custom computes the loss on your client; " +
		"do not force custom_loss_server_side on"}

// createCustomLoss reads and checks the request (a malformed one says so), then refuses it
// with errCustomLossClientSide.
func (s *server) createCustomLoss(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SessionID string `json:"session_id"`
		Name      string `json:"name"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	s.log.DebugContext(r.Context(), "compat: create_custom_loss refused: custom losses run on the client", "session_id", req.SessionID, "name", req.Name)
	return errCustomLossClientSide
}
