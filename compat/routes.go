package compat

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/loops-dev/loops/compat/internal/catalog"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/auditnote"
)

// routes registers every Tinker route. Routes Loops does not serve answer 501 with a JSON
// detail; unknown paths answer 404.
func (s *server) routes(mux *http.ServeMux) {
	// Service, config and sessions.
	s.edge.Handle(mux, "POST /api/v1/client/config", s.clientConfig)
	s.edge.Handle(mux, "POST /api/v1/client/dynamic_config", s.dynamicConfig)
	s.edge.Handle(mux, "POST /api/v1/create_session", s.createSession)
	s.edge.Handle(mux, "POST /api/v1/session_heartbeat", s.sessionHeartbeat)
	s.edge.Handle(mux, "POST /api/v1/sessions/{id}/finish", s.finishSession)
	s.edge.Handle(mux, "POST /api/v1/telemetry", s.telemetry)
	s.edge.Handle(mux, "GET /api/v1/get_server_capabilities", s.serverCapabilities)
	s.edge.Handle(mux, "GET /api/v1/healthz", s.healthz)
	if s.opt.Keys != nil {
		s.edge.Handle(mux, "POST /api/v1/auth/token", s.authToken)
		s.edge.Handle(mux, "GET /api/v1/auth/apikey/me", s.selfKey)
		s.edge.Handle(mux, "DELETE /api/v1/auth/apikey/me", s.revokeSelfKey)
	}

	// Training.
	s.edge.Handle(mux, "POST /api/v1/create_model", s.createModel)
	s.edge.Handle(mux, "POST /api/v1/get_info", s.getInfo)
	s.edge.Handle(mux, "POST /api/v1/unload_model", s.unloadModel)
	s.edge.Handle(mux, "POST /api/v1/forward_backward", s.forwardBackward)
	s.edge.Handle(mux, "POST /api/v1/forward", s.forward)
	s.edge.Handle(mux, "POST /api/v1/optim_step", s.optimStep)
	s.edge.Handle(mux, "POST /api/v1/save_weights", s.saveWeights)
	s.edge.Handle(mux, "POST /api/v1/save_weights_external", s.saveWeightsExternal)
	s.edge.Handle(mux, "POST /api/v1/save_weights_for_sampler", s.saveWeightsForSampler)
	s.edge.Handle(mux, "POST /api/v1/load_weights", s.loadWeights)
	s.edge.Handle(mux, "POST /api/v1/create_custom_loss", s.createCustomLoss)
	s.edge.Handle(mux, "POST /api/v1/weights_info", s.weightsInfo)

	// Sampling.
	s.edge.Handle(mux, "POST /api/v1/create_sampling_session", s.createSamplingSession)
	s.edge.Handle(mux, "POST /api/v1/asample", s.asample)
	s.edge.Handle(mux, "GET /api/v1/samplers/{id}", s.getSampler)
	s.edge.Handle(mux, "POST /api/v1/join_sampling_session", s.joinSamplingSession)

	// Futures.
	s.edge.Handle(mux, "POST /api/v1/retrieve_future", s.retrieveFuture)
	s.edge.Handle(mux, "POST /api/v1/retrieve_futures", s.retrieveFutures)
	s.edge.Handle(mux, "POST /api/v1/cancel_future", s.cancelFuture)

	// REST: runs, checkpoints, sessions.
	s.edge.Handle(mux, "GET /api/v1/training_runs", s.listTrainingRuns)
	s.edge.Handle(mux, "GET /api/v1/training_runs/{run}", s.getTrainingRun)
	s.edge.Handle(mux, "GET /api/v1/training_runs/{run}/checkpoints", s.listRunCheckpoints)
	s.edge.Handle(mux, "GET /api/v1/checkpoints", s.listUserCheckpoints)
	s.edge.Handle(mux, "DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}", s.deleteCheckpoint)
	s.edge.Handle(mux, "POST /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish", s.publishCheckpoint(true))
	s.edge.Handle(mux, "DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish", s.publishCheckpoint(false))
	s.edge.Handle(mux, "PUT /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/ttl", s.setCheckpointTTL)
	s.edge.Handle(mux, "GET /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/archive", s.checkpointArchive)
	s.edge.Handle(mux, "GET /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/external_weights_urls", s.externalWeightsURLs)
	s.edge.Handle(mux, "GET /api/v1/sessions", s.listSessions)
	s.edge.Handle(mux, "GET /api/v1/sessions/{id}", s.getSession)
	s.edge.Handle(mux, "POST /api/v1/sessions/search", s.searchSessions)
	s.edge.Handle(mux, "PUT /api/v1/sessions/{id}/project", s.setSessionProject)
	s.edge.Handle(mux, "POST /api/v1/copy_weights", s.copyWeights)
	s.edge.Handle(mux, "GET /api/v1/sessions/{id}/trace_export", s.traceExport)

	// Billing: metered usage.
	s.edge.Handle(mux, "GET /api/v1/billing/usage/events", s.billingUsageEvents)
	s.edge.Handle(mux, "GET /api/v1/billing/usage/checkpoints/current", s.checkpointStorage)

	// The workspace's audit log.
	s.edge.Handle(mux, "GET /api/v1/audit", s.audit)

	// Tinker routes Loops does not serve (all flag-gated or admin-only in SDK 0.38.0).
	notServed := []string{}
	if s.opt.Keys == nil {
		notServed = append(notServed, "POST /api/v1/auth/token", "GET /api/v1/auth/apikey/me", "DELETE /api/v1/auth/apikey/me")
	}
	for _, p := range notServed {
		route := p[strings.Index(p, " ")+1:]
		s.edge.Handle(mux, p, func(http.ResponseWriter, *http.Request) error {
			return notImplemented("%s is not supported by Loops", route)
		})
	}
	s.edge.Handle(mux, "/api/v1/", func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{status: http.StatusNotFound, code: "not_found",
			detail: r.Method + " " + r.URL.Path + " is not a Tinker API route served by Loops"}
	})
}

// futureResponse is the SDK's UntypedAPIFuture.
type futureResponse struct {
	RequestID         string   `json:"request_id"`
	ModelID           string   `json:"model_id,omitempty"`
	SampleSequenceIDs []string `json:"sample_sequence_ids,omitempty"`
}

// metadataStrings converts a user_metadata object (values of any JSON type) to strings;
// non-string values keep their JSON text.
func metadataStrings(m map[string]json.RawMessage) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, raw := range m {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(raw)
		}
	}
	return out
}

// ---------------------------------------------------------------------------------------
// Service, config and sessions.

// clientConfigResponse is the answer to client/config (SDK ClientConfigResponse).
type clientConfigResponse struct {
	PjwtAuthEnabled            bool `json:"pjwt_auth_enabled"`
	UsePyqwestTransport        bool `json:"use_pyqwest_transport"`
	CreateModelViaLoadWeights  bool `json:"create_model_via_load_weights"`
	ParallelFwdbwdChunks       bool `json:"parallel_fwdbwd_chunks"`
	ProtoCompressFwdbwd        bool `json:"proto_compress_fwdbwd"`
	SampleUseRetrieveFutures   bool `json:"sample_use_retrieve_futures"`
	CustomLossServerSide       bool `json:"custom_loss_server_side"`
	SampleJoinSamplingSession  bool `json:"sample_join_sampling_session"`
	SampleEnableStuckDetection bool `json:"sample_enable_stuck_detection"`
	// ProtoWriteFwdbwd and FwdViaFwdbwd make SDKs 0.22.3–0.24.x send protobuf
	// forward_backward bodies (and forward through forward_backward) like 0.38.0 does.
	ProtoWriteFwdbwd bool `json:"proto_write_fwdbwd"`
	FwdViaFwdbwd     bool `json:"fwd_via_fwdbwd"`
}

// clientConfig answers the SDK's feature flags. Every flag that would make the SDK call a
// route Loops does not serve is off; zstd fwd/bwd bodies are on (Loops decodes them with
// bounded memory and real payloads compress >10×); pyqwest is off because plain httpx is
// the transport we test against; sample_join_sampling_session is on, so a second client of
// a sampler gets a client id no other client of it has (join_sampling_session) instead of a
// random one; custom_loss_server_side stays off (custom losses run on the client).
func (s *server) clientConfig(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SDKVersion string `json:"sdk_version"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	s.log.DebugContext(r.Context(), "compat: client config", "sdk_version", req.SDKVersion)
	s.edge.WriteJSON(w, http.StatusOK, clientConfigResponse{
		ParallelFwdbwdChunks:       true,
		ProtoCompressFwdbwd:        !s.opt.DisableZstdForwardBackward,
		SampleEnableStuckDetection: true,
		PjwtAuthEnabled:            s.opt.Keys != nil && !s.opt.DisableJWTAuth,
		SampleJoinSamplingSession:  true,
		ProtoWriteFwdbwd:           true,
		FwdViaFwdbwd:               true,
	})
	return nil
}

func (s *server) dynamicConfig(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.readBody(w, r); err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]any{"refresh_interval_sec": 300, "sample_cancel_enabled": true})
	return nil
}

func (s *server) createSession(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Tags         []string                   `json:"tags"`
		UserMetadata map[string]json.RawMessage `json:"user_metadata"`
		SDKVersion   string                     `json:"sdk_version"`
		ProjectID    string                     `json:"project_id"`
		DisplayName  string                     `json:"display_name"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	sess, err := s.svc.Sessions.CreateSession(r.Context(), &loopsv1.CreateSessionRequest{
		Tags: req.Tags, UserMetadata: metadataStrings(req.UserMetadata), SdkVersion: req.SDKVersion, ProjectId: req.ProjectID,
		DisplayName: req.DisplayName,
	})
	if err != nil {
		return err
	}
	auditnote.SetTarget(r.Context(), sess.GetId())
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"type": "create_session", "session_id": sess.GetId()})
	return nil
}

// sessionGone checks whether a session the core could not heartbeat has expired or
// finished; the SDK stops its heartbeat loop quietly on 410.
func (s *server) sessionGone(r *http.Request, id string) bool {
	sess, err := s.svc.Sessions.GetSession(r.Context(), &loopsv1.GetSessionRequest{Id: id})
	return err == nil && sess.GetExpired()
}

func (s *server) sessionHeartbeat(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SessionID string `json:"session_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.SessionID == "" {
		return badRequest("session_id is required")
	}
	if _, err := s.svc.Sessions.HeartbeatSession(r.Context(), &loopsv1.HeartbeatSessionRequest{Id: req.SessionID}); err != nil {
		status, code, _ := classify(err)
		if status == http.StatusNotFound || status == http.StatusBadRequest {
			if s.sessionGone(r, req.SessionID) {
				return &apiError{status: http.StatusGone, code: code,
					detail: "session " + req.SessionID + " has expired or finished; create a new ServiceClient to start a new session"}
			}
			if status == http.StatusNotFound {
				return &apiError{status: http.StatusNotFound, code: code,
					detail: "session " + req.SessionID + " does not exist (or belongs to another API key); create a new ServiceClient"}
			}
		}
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"type": "session_heartbeat"})
	return nil
}

// finishSession ends the session when the client closes (ServiceClient.close() or the end
// of a `with` block): its runs' adapters are unloaded and its samplers dropped.
func (s *server) finishSession(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Reason struct {
			Type string `json:"type"`
		} `json:"reason"`
		Detail *string `json:"detail"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	in := &loopsv1.FinishSessionRequest{Id: r.PathValue("id"), Reason: req.Reason.Type}
	if req.Detail != nil {
		in.Detail = *req.Detail
	}
	if _, err := s.svc.Sessions.FinishSession(r.Context(), in); err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

func (s *server) telemetry(w http.ResponseWriter, r *http.Request) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req struct {
		SessionID string            `json:"session_id"`
		Events    []json.RawMessage `json:"events"`
	}
	if json.Unmarshal(b, &req) == nil {
		s.log.DebugContext(r.Context(), "compat: telemetry", "session_id", req.SessionID, "events", len(req.Events))
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"status": "accepted"})
	return nil
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) error {
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// supportedModel is one entry of get_server_capabilities. The SDK reads model_name (and
// keeps the rest); the rest is Loops' catalog (ModelInfo: family, modalities, limits,
// trainable / sampleable, availability, backend), present when the backend says it.
type supportedModel struct {
	ModelName        string `json:"model_name"`
	MaxContextLength int32  `json:"max_context_length,omitempty"`
	*catalog.Entry
}

func (s *server) serverCapabilities(w http.ResponseWriter, r *http.Request) error {
	res, err := s.svc.Models.ListModels(r.Context(), &loopsv1.ListModelsRequest{})
	if err != nil {
		return err
	}
	out := struct {
		SupportedModels []supportedModel `json:"supported_models"`
	}{SupportedModels: []supportedModel{}}
	for _, m := range res.GetModels() {
		out.SupportedModels = append(out.SupportedModels, supportedModel{
			ModelName: m.GetName(), MaxContextLength: m.GetMaxSequenceLength(), Entry: catalog.Of(m)})
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}
