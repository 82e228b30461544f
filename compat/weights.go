package compat

import (
	"fmt"
	"net/http"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Headers of copy_weights (SDK 0.38 RestClient.copy_weights): the token travels as a
// header, kept out of the SDK's request logs; the idempotency key is one uuid across every
// retry of one copy.
const (
	weightsAccessTokenHeader = "X-Tinker-Weights-Access-Token"
	idempotencyKeyHeader     = "X-Idempotency-Key"
)

// copyWeights serves copy_weights: it copies a checkpoint the caller may read (its own, a
// public one, or another workspace's with a weights-access token) into a new run of the
// caller's workspace, recording the destination project (loops.v1
// WeightsAccessService.CopyWeights). It answers at once with {"tinker_path"}, not a future.
// SDK 0.38 names the project (destination_project_id) and sends the token in a header; SDK
// 0.30 names a session and a training client slot (session_id, model_seq_id: the copy
// inherits the session's project) and sends the token in the body.
func (s *server) copyWeights(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SourcePath           string `json:"source_path"`
		SessionID            string `json:"session_id"`
		ModelSeqID           *int64 `json:"model_seq_id"`
		DestinationProjectID string `json:"destination_project_id"`
		TTLSeconds           *int64 `json:"ttl_seconds"`
		WeightsAccessToken   string `json:"weights_access_token"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.SourcePath == "" {
		return badRequest("source_path (the tinker://<run>/<kind>/<name> checkpoint to copy) is required")
	}
	project, idempotencyKey := req.DestinationProjectID, r.Header.Get(idempotencyKeyHeader)
	if req.SessionID != "" || req.ModelSeqID != nil {
		// SDK 0.30's ServiceClient.copy_weights: the copy takes a training client slot of the
		// session and inherits its project; the slot, new per copy, keys its retries.
		if req.SessionID == "" || req.ModelSeqID == nil {
			return badRequest("copy_weights into a session needs both session_id and model_seq_id (or neither, with destination_project_id)")
		}
		sess, err := s.svc.Sessions.GetSession(r.Context(), &loopsv1.GetSessionRequest{Id: req.SessionID})
		if err != nil {
			return err
		}
		if project == "" {
			project = sess.GetProjectId()
		}
		idempotencyKey = fmt.Sprintf("%s:train:%d", req.SessionID, *req.ModelSeqID)
	}
	token := r.Header.Get(weightsAccessTokenHeader)
	if req.WeightsAccessToken != "" {
		if token != "" && token != req.WeightsAccessToken {
			return badRequest("the %s header and weights_access_token in the body differ: send one", weightsAccessTokenHeader)
		}
		token = req.WeightsAccessToken
	}
	res, err := s.svc.Weights.CopyWeights(r.Context(), &loopsv1.CopyWeightsRequest{
		SourcePath: req.SourcePath, DestinationProjectId: project, TtlSeconds: req.TTLSeconds,
		WeightsAccessToken: token, IdempotencyKey: idempotencyKey,
	})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"tinker_path": res.GetTinkerPath()})
	return nil
}
