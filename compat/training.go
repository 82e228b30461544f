package compat

import (
	"encoding/json"
	"net/http"
	"strings"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/auditnote"
	"github.com/loops-dev/loops/internal/receipt"
	"github.com/loops-dev/loops/internal/semantics"
)

// optimizerConfig is the SDK's optimizer_config ({"type":"adamw"} or another family).
type optimizerConfig struct {
	Type string `json:"type"`
}

// optimizerWhy says why a known non-Adam family is refused rather than approximated.
func optimizerWhy(typ string) string {
	if typ == "dimuon" {
		return ": Tinker's Dimuon keeps its matrix-sign iteration count and normalization epsilon internal, so Loops cannot reproduce its updates exactly and will not train it with Adam instead"
	}
	return ""
}

func checkOptimizer(o *optimizerConfig) error {
	if o != nil && o.Type != "" && o.Type != "adamw" {
		return badRequest("optimizer_config type %q is not supported; Loops trains with %q only (omit optimizer or pass AdamOptimizerConfig())%s", o.Type, "adamw", optimizerWhy(o.Type))
	}
	return nil
}

type loraConfigJSON struct {
	Rank         *int64  `json:"rank"`
	Seed         *uint64 `json:"seed"`
	TrainUnembed *bool   `json:"train_unembed"`
	TrainMLP     *bool   `json:"train_mlp"`
	TrainAttn    *bool   `json:"train_attn"`
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

func (l *loraConfigJSON) toProto() (*loopsv1.LoraConfig, error) {
	if l == nil {
		return nil, badRequest("lora_config is required: Loops trains LoRA adapters (use create_lora_training_client)")
	}
	if l.Rank == nil || *l.Rank < 0 || *l.Rank > 1<<20 {
		return nil, badRequest("lora_config.rank must be a positive integer, or 0 for full fine-tuning (every weight trained)")
	}
	out := &loopsv1.LoraConfig{
		Rank:         int32(*l.Rank),
		TrainUnembed: boolOr(l.TrainUnembed, true),
		TrainMlp:     boolOr(l.TrainMLP, true),
		TrainAttn:    boolOr(l.TrainAttn, true),
	}
	if l.Seed != nil {
		out.Seed = *l.Seed
	}
	if !out.TrainAttn && !out.TrainMlp && !out.TrainUnembed {
		return nil, badRequest("lora_config: at least one of train_attn, train_mlp, train_unembed must be true")
	}
	return out, nil
}

func (s *server) createModel(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SessionID       string                     `json:"session_id"`
		ModelSeqID      *int64                     `json:"model_seq_id"`
		BaseModel       string                     `json:"base_model"`
		UserMetadata    map[string]json.RawMessage `json:"user_metadata"`
		LoraConfig      *loraConfigJSON            `json:"lora_config"`
		OptimizerConfig *optimizerConfig           `json:"optimizer_config"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if err := checkOptimizer(req.OptimizerConfig); err != nil {
		return err
	}
	if req.BaseModel == "" {
		return badRequest("base_model is required")
	}
	lora, err := req.LoraConfig.toProto()
	if err != nil {
		return err
	}
	op, err := s.svc.Training.CreateTrainingRun(r.Context(), &loopsv1.CreateTrainingRunRequest{
		SessionId: req.SessionID, ClientSeqId: req.ModelSeqID, BaseModel: req.BaseModel, Lora: lora,
		UserMetadata: metadataStrings(req.UserMetadata), Client: receipt.ClientFromHeaders(r.Header),
	})
	if err != nil {
		return err
	}
	auditnote.SetTarget(r.Context(), runIDOf(op))
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: runIDOf(op)})
	return nil
}

// modelInfo finds a base model's ModelInfo; nil if the core does not list it.
func (s *server) modelInfo(r *http.Request, name string) *loopsv1.ModelInfo {
	res, err := s.svc.Models.ListModels(r.Context(), &loopsv1.ListModelsRequest{})
	if err != nil {
		s.log.WarnContext(r.Context(), "compat: list models failed", "err", err)
		return nil
	}
	for _, m := range res.GetModels() {
		if m.GetName() == name {
			return m
		}
	}
	return nil
}

type modelData struct {
	Arch        string `json:"arch,omitempty"`
	ModelName   string `json:"model_name"`
	TokenizerID string `json:"tokenizer_id,omitempty"`
}

type getInfoResponse struct {
	Type            string          `json:"type"`
	ModelID         string          `json:"model_id"`
	ModelData       modelData       `json:"model_data"`
	IsLora          bool            `json:"is_lora"`
	LoraRank        int32           `json:"lora_rank,omitempty"`
	ModelName       string          `json:"model_name"`
	OptimizerConfig optimizerConfig `json:"optimizer_config"`
}

func (s *server) getInfo(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		ModelID string `json:"model_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	id, err := s.resolveModel(r.Context(), req.ModelID)
	if err != nil {
		return err
	}
	run, err := s.svc.Training.GetTrainingRun(r.Context(), &loopsv1.GetTrainingRunRequest{Id: id})
	if err != nil {
		return err
	}
	md := modelData{ModelName: run.GetBaseModel(), TokenizerID: run.GetBaseModel()}
	if mi := s.modelInfo(r, run.GetBaseModel()); mi != nil {
		md.Arch = mi.GetArchitecture()
		if mi.GetTokenizerId() != "" {
			md.TokenizerID = mi.GetTokenizerId()
		}
	}
	s.edge.WriteJSON(w, http.StatusOK, getInfoResponse{
		Type: "get_info", ModelID: req.ModelID, ModelData: md, IsLora: run.GetLora().GetRank() > 0, LoraRank: run.GetLora().GetRank(),
		ModelName: run.GetBaseModel(), OptimizerConfig: optimizerConfig{Type: "adamw"},
	})
	return nil
}

func (s *server) unloadModel(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		ModelID string `json:"model_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	id, err := s.resolveModel(r.Context(), req.ModelID)
	if err != nil {
		return err
	}
	op, err := s.svc.Training.UnloadTrainingRun(r.Context(), &loopsv1.UnloadTrainingRunRequest{Id: id})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: req.ModelID})
	return nil
}

// forwardBackward takes the protobuf body of SDK ≥ 0.19 or the JSON body of older SDKs
// (chosen by Content-Type, or by a leading '{' when there is none).
func (s *server) forwardBackward(w http.ResponseWriter, r *http.Request) error {
	return s.doForwardBackward(w, r, false)
}

// forward is the JSON-era /forward route (forward_input, no backward pass).
func (s *server) forward(w http.ResponseWriter, r *http.Request) error {
	return s.doForwardBackward(w, r, true)
}

func (s *server) doForwardBackward(w http.ResponseWriter, r *http.Request, forwardOnly bool) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req *loopsv1.ForwardBackwardRequest
	ct := r.Header.Get("Content-Type")
	if isJSONContent(r) || (ct == "" && len(b) > 0 && b[0] == '{') {
		req, err = decodeForwardBackwardJSON(b, forwardOnly, s.limits(), s.opt.ImageFetcher.ForRequest(r.Context()))
	} else {
		req, err = decodeForwardBackwardProto(b, s.limits())
		if req != nil && forwardOnly {
			req.ForwardOnly = true
		}
	}
	if err != nil {
		return err
	}
	modelID := req.GetTrainingRunId()
	if req.TrainingRunId, err = s.resolveModel(r.Context(), modelID); err != nil {
		return err
	}
	op, err := s.svc.Training.ForwardBackward(r.Context(), req)
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: modelID})
	return nil
}

type adamJSON struct {
	Type         string   `json:"type"`
	LearningRate *float64 `json:"learning_rate"`
	Beta1        *float64 `json:"beta1"`
	Beta2        *float64 `json:"beta2"`
	Eps          *float64 `json:"eps"`
	WeightDecay  *float64 `json:"weight_decay"`
	GradClipNorm *float64 `json:"grad_clip_norm"`
}

func floatOr(f *float64, def float64) float64 {
	if f == nil {
		return def
	}
	return *f
}

func (s *server) optimStep(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		AdamParams      *adamJSON `json:"adam_params"`
		OptimParams     *adamJSON `json:"optim_params"`
		OptimizerParams *adamJSON `json:"optimizer_params"`
		ModelID         string    `json:"model_id"`
		SeqID           *int64    `json:"seq_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	p := req.AdamParams
	if p == nil {
		p = req.OptimParams
	}
	if p == nil {
		p = req.OptimizerParams
	}
	if p == nil {
		p = &adamJSON{}
	}
	if p.Type != "" && p.Type != "adam" && p.Type != "adamw" {
		return badRequest("optimizer_params type %q is not supported; Loops trains with %q only (pass AdamParams)%s", p.Type, "adamw", optimizerWhy(p.Type))
	}
	id, err := s.resolveModel(r.Context(), req.ModelID)
	if err != nil {
		return err
	}
	op, err := s.svc.Training.OptimStep(r.Context(), &loopsv1.OptimStepRequest{
		TrainingRunId: id, SeqId: derefInt(req.SeqID),
		Adam: &loopsv1.AdamParams{
			LearningRate: floatOr(p.LearningRate, semantics.DefaultLearningRate),
			Beta1:        floatOr(p.Beta1, semantics.DefaultBeta1),
			Beta2:        floatOr(p.Beta2, semantics.DefaultBeta2),
			Eps:          floatOr(p.Eps, semantics.DefaultEps),
			WeightDecay:  floatOr(p.WeightDecay, 0),
			GradClipNorm: floatOr(p.GradClipNorm, 0),
		},
	})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: req.ModelID})
	return nil
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// checkName validates a checkpoint name before it reaches the core, so that a mistake is a
// 400 on the POST instead of a failed future that poisons the SDK's TrainingClient.
func checkName(name string) error {
	if strings.Contains(name, "/") {
		return badRequest("checkpoint name %q must not contain '/'", name)
	}
	if strings.HasPrefix(name, "tinker://") {
		return badRequest("checkpoint name %q must be a plain name, not a tinker:// path", name)
	}
	return nil
}

func checkTTL(ttl *int64) error {
	if ttl != nil && *ttl <= 0 {
		return badRequest("ttl_seconds must be positive (or omitted for no expiry), got %d", *ttl)
	}
	return nil
}

func (s *server) saveWeights(w http.ResponseWriter, r *http.Request) error {
	return s.saveNamed(w, r, loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, "save_weights")
}

// saveWeightsExternal exports the adapter as a PEFT folder under external_weights/<name>
// (tinker 0.38's TrainingClient.save_weights_external; the CLI's checkpoint download).
func (s *server) saveWeightsExternal(w http.ResponseWriter, r *http.Request) error {
	return s.saveNamed(w, r, loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL, "save_weights_external")
}

// saveNamed serves the saves that take a checkpoint name (save_weights, save_weights_external).
func (s *server) saveNamed(w http.ResponseWriter, r *http.Request, kind loopsv1.CheckpointKind, route string) error {
	var req struct {
		ModelID           string   `json:"model_id"`
		Path              string   `json:"path"`
		SeqID             *int64   `json:"seq_id"`
		TTLSeconds        *int64   `json:"ttl_seconds"`
		Overwrite         bool     `json:"overwrite"`
		EncryptRecipients []string `json:"age_encryption_recipients"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if len(req.EncryptRecipients) > 0 {
		return badRequest("age_encryption_recipients is not supported by Loops: export without encryption")
	}
	if req.Path == "" {
		return badRequest("path (the checkpoint name) is required for %s", route)
	}
	if err := checkName(req.Path); err != nil {
		return err
	}
	if err := checkTTL(req.TTLSeconds); err != nil {
		return err
	}
	id, err := s.resolveModel(r.Context(), req.ModelID)
	if err != nil {
		return err
	}
	op, err := s.svc.Training.SaveWeights(r.Context(), &loopsv1.SaveWeightsRequest{
		TrainingRunId: id, SeqId: derefInt(req.SeqID), Kind: kind,
		Name: req.Path, TtlSeconds: req.TTLSeconds, Overwrite: req.Overwrite,
	})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: req.ModelID})
	return nil
}

func (s *server) saveWeightsForSampler(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		ModelID              string `json:"model_id"`
		Path                 string `json:"path"`
		SamplingSessionSeqID *int64 `json:"sampling_session_seq_id"`
		Kind                 string `json:"kind"`
		SeqID                *int64 `json:"seq_id"`
		TTLSeconds           *int64 `json:"ttl_seconds"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if err := checkName(req.Path); err != nil {
		return err
	}
	if err := checkTTL(req.TTLSeconds); err != nil {
		return err
	}
	switch req.Kind {
	case "", "snapshot":
	case "inflight":
		// The sampler follows the run's newest inflight save (SaveWeightsRequest.inflight).
		if req.Path != "" {
			return badRequest("kind \"inflight\" applies to unnamed saves (save_weights_and_get_sampling_client); a named sampler checkpoint is a fixed snapshot")
		}
	default:
		return badRequest("kind %q is not supported; use \"snapshot\" or \"inflight\"", req.Kind)
	}
	id, err := s.resolveModel(r.Context(), req.ModelID)
	if err != nil {
		return err
	}
	sreq := &loopsv1.SaveWeightsRequest{
		TrainingRunId: id, SeqId: derefInt(req.SeqID), Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER,
		Name: req.Path, TtlSeconds: req.TTLSeconds,
	}
	if req.Path == "" {
		sreq.SamplerSeqId = req.SamplingSessionSeqID
		sreq.Inflight = req.Kind == "inflight"
	}
	op, err := s.svc.Training.SaveWeights(r.Context(), sreq)
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: req.ModelID})
	return nil
}

// loadWeights serves both addressing modes: model-addressed (load into an existing run)
// and session-addressed (SDK 0.38 create_training_client_from_state: create the run from
// the checkpoint).
func (s *server) loadWeights(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		ModelID            string                     `json:"model_id"`
		SeqID              *int64                     `json:"seq_id"`
		SessionID          string                     `json:"session_id"`
		ModelSeqID         *int64                     `json:"model_seq_id"`
		BaseModel          string                     `json:"base_model"`
		UserMetadata       map[string]json.RawMessage `json:"user_metadata"`
		Path               string                     `json:"path"`
		Optimizer          bool                       `json:"optimizer"`
		OptimizerConfig    *optimizerConfig           `json:"optimizer_config"`
		WeightsAccessToken string                     `json:"weights_access_token"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.Path == "" {
		return badRequest("path (a tinker://<run>/weights/<name> checkpoint) is required")
	}
	if err := checkOptimizer(req.OptimizerConfig); err != nil {
		return err
	}
	if req.ModelID == "" {
		if req.SessionID == "" {
			return badRequest("load_weights needs model_id (load into a model) or session_id and model_seq_id (create a model from the checkpoint)")
		}
		op, err := s.svc.Training.CreateTrainingRun(r.Context(), &loopsv1.CreateTrainingRunRequest{
			SessionId: req.SessionID, ClientSeqId: req.ModelSeqID, BaseModel: req.BaseModel,
			UserMetadata: metadataStrings(req.UserMetadata), FromCheckpoint: req.Path, WithOptimizer: req.Optimizer,
			WeightsAccessToken: req.WeightsAccessToken, Client: receipt.ClientFromHeaders(r.Header),
		})
		if err != nil {
			return err
		}
		s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: runIDOf(op)})
		return nil
	}
	id, err := s.resolveModel(r.Context(), req.ModelID)
	if err != nil {
		return err
	}
	op, err := s.svc.Training.LoadWeights(r.Context(), &loopsv1.LoadWeightsRequest{
		TrainingRunId: id, SeqId: derefInt(req.SeqID), Path: req.Path, WithOptimizer: req.Optimizer,
		WeightsAccessToken: req.WeightsAccessToken,
	})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), ModelID: req.ModelID})
	return nil
}

type weightsInfoResponse struct {
	BaseModel       string          `json:"base_model"`
	IsLora          bool            `json:"is_lora"`
	LoraRank        int32           `json:"lora_rank"`
	TrainUnembed    bool            `json:"train_unembed"`
	TrainMLP        bool            `json:"train_mlp"`
	TrainAttn       bool            `json:"train_attn"`
	OptimizerConfig optimizerConfig `json:"optimizer_config"`
}

func (s *server) weightsInfo(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		TinkerPath string `json:"tinker_path"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.TinkerPath == "" {
		return badRequest("tinker_path is required")
	}
	ck, err := s.svc.Checkpoints.GetCheckpoint(r.Context(), &loopsv1.GetCheckpointRequest{Path: req.TinkerPath})
	if err != nil {
		return err
	}
	l := ck.GetLora()
	s.edge.WriteJSON(w, http.StatusOK, weightsInfoResponse{
		BaseModel: ck.GetBaseModel(), IsLora: l.GetRank() > 0, LoraRank: l.GetRank(), TrainUnembed: l.GetTrainUnembed(),
		TrainMLP: l.GetTrainMlp(), TrainAttn: l.GetTrainAttn(), OptimizerConfig: optimizerConfig{Type: "adamw"},
	})
	return nil
}
