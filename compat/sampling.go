package compat

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/auditnote"
	"github.com/loops-dev/loops/internal/semantics"
)

func (s *server) createSamplingSession(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SessionID            string `json:"session_id"`
		SamplingSessionSeqID *int64 `json:"sampling_session_seq_id"`
		BaseModel            string `json:"base_model"`
		ModelPath            string `json:"model_path"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.BaseModel == "" && req.ModelPath == "" {
		return badRequest("create_sampling_session needs base_model or model_path")
	}
	sm, err := s.svc.Sampling.CreateSampler(r.Context(), &loopsv1.CreateSamplerRequest{
		SessionId: req.SessionID, ClientSeqId: req.SamplingSessionSeqID, BaseModel: req.BaseModel, ModelPath: req.ModelPath,
	})
	if err != nil {
		return err
	}
	auditnote.SetTarget(r.Context(), sm.GetId())
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"type": "create_sampling_session", "sampling_session_id": sm.GetId()})
	return nil
}

type getSamplerResponse struct {
	SamplerID string `json:"sampler_id"`
	BaseModel string `json:"base_model"`
	ModelPath string `json:"model_path,omitempty"`
}

func (s *server) getSampler(w http.ResponseWriter, r *http.Request) error {
	sm, err := s.svc.Sampling.GetSampler(r.Context(), &loopsv1.GetSamplerRequest{Id: r.PathValue("id")})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, getSamplerResponse{SamplerID: sm.GetId(), BaseModel: sm.GetBaseModel(), ModelPath: sm.GetModelPath()})
	return nil
}

// sampleRequestJSON is the SDK's SampleRequest.
type sampleRequestJSON struct {
	NumSamples           *int64          `json:"num_samples"`
	Prompt               jsonModelInput  `json:"prompt"`
	SamplingParams       samplingParams  `json:"sampling_params"`
	BaseModel            string          `json:"base_model"`
	ModelPath            string          `json:"model_path"`
	SamplingSessionID    string          `json:"sampling_session_id"`
	SeqID                *int64          `json:"seq_id"`
	PromptLogprobs       *bool           `json:"prompt_logprobs"`
	TopkPromptLogprobs   int64           `json:"topk_prompt_logprobs"`
	TopkSampleLogprobs   int64           `json:"topk_sample_logprobs"`
	TargetPromptLogprobs json.RawMessage `json:"target_prompt_logprobs"`
	PromptAltTokensK     int64           `json:"prompt_alt_tokens_k"`
	PromptLogprobsLastN  *int64          `json:"prompt_logprobs_last_n"`
	RecordStabilityInfo  *bool           `json:"record_stability_info"`
}

type samplingParams struct {
	MaxTokens   *int64          `json:"max_tokens"`
	Seed        json.Number     `json:"seed"`
	Stop        json.RawMessage `json:"stop"`
	Temperature *float64        `json:"temperature"`
	TopK        *int64          `json:"top_k"`
	TopP        *float64        `json:"top_p"`
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// parseSeed accepts any integer in [-2^63, 2^64-1]; negative seeds keep their two's
// complement bits.
func parseSeed(n json.Number) (*uint64, error) {
	if n == "" {
		return nil, nil
	}
	if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
		return &u, nil
	}
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		u := uint64(i)
		return &u, nil
	}
	return nil, badRequest("sampling_params.seed = %s must be an integer that fits in 64 bits", n)
}

func (p *samplingParams) toProto() (*loopsv1.SamplingParams, error) {
	out := &loopsv1.SamplingParams{Temperature: 1, TopK: -1, TopP: 1}
	if p.MaxTokens != nil {
		if *p.MaxTokens < 0 || *p.MaxTokens > math.MaxInt32 {
			return nil, badRequest("sampling_params.max_tokens = %d is out of range", *p.MaxTokens)
		}
		out.MaxTokens = int32(*p.MaxTokens)
	}
	seed, err := parseSeed(p.Seed)
	if err != nil {
		return nil, err
	}
	out.Seed = seed
	if p.Temperature != nil {
		if *p.Temperature < 0 || math.IsNaN(*p.Temperature) {
			return nil, badRequest("sampling_params.temperature must be >= 0")
		}
		out.Temperature = float32(*p.Temperature)
	}
	if p.TopK != nil {
		if *p.TopK > math.MaxInt32 || *p.TopK < math.MinInt32 {
			return nil, badRequest("sampling_params.top_k = %d is out of range", *p.TopK)
		}
		out.TopK = int32(*p.TopK)
	}
	if p.TopP != nil {
		if !(*p.TopP > 0 && *p.TopP <= 1) {
			return nil, badRequest("sampling_params.top_p must be in (0, 1]")
		}
		out.TopP = float32(*p.TopP)
	}
	if !isNull(p.Stop) {
		var one string
		var strs []string
		var toks []int64
		switch {
		case json.Unmarshal(p.Stop, &one) == nil:
			out.StopStrings = []string{one}
		case json.Unmarshal(p.Stop, &strs) == nil && len(strs) > 0:
			out.StopStrings = strs
		case json.Unmarshal(p.Stop, &toks) == nil && len(toks) > 0:
			for _, t := range toks {
				if t < 0 || t > math.MaxInt32 {
					return nil, badRequest("sampling_params.stop token id %d is out of range", t)
				}
				out.StopTokens = append(out.StopTokens, int32(t))
			}
		case json.Unmarshal(p.Stop, &strs) == nil: // []
			return nil, badRequest("sampling_params.stop = [] (disable every stop, EOS included) is not supported by Loops; omit stop to stop at EOS, or give stop strings or token ids")
		default:
			return nil, badRequest("sampling_params.stop must be a string, a list of strings or a list of token ids")
		}
	}
	return out, nil
}

func (s *server) asample(w http.ResponseWriter, r *http.Request) error {
	var req sampleRequestJSON
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	switch {
	case req.TopkSampleLogprobs < 0 || req.TopkSampleLogprobs > semantics.MaxTopLogprobs:
		return badRequest("topk_sample_logprobs = %d is out of range: Loops returns 0 to %d alternatives per sampled token", req.TopkSampleLogprobs, semantics.MaxTopLogprobs)
	case req.PromptAltTokensK < 0 || req.PromptAltTokensK > semantics.MaxTopKPromptLogprobs:
		return badRequest("prompt_alt_tokens_k = %d is out of range: Loops draws 0 to %d tokens per prompt position (the top-k width bound)", req.PromptAltTokensK, semantics.MaxTopKPromptLogprobs)
	case req.PromptLogprobsLastN != nil && (*req.PromptLogprobsLastN < 1 || *req.PromptLogprobsLastN > math.MaxInt32):
		return badRequest("prompt_logprobs_last_n = %d is out of range: give 1 to len(prompt) - 1, or leave it out to score the whole prompt", *req.PromptLogprobsLastN)
	case req.TopkPromptLogprobs < 0 || req.TopkPromptLogprobs > math.MaxInt32:
		return badRequest("topk_prompt_logprobs = %d is out of range", req.TopkPromptLogprobs)
	}
	n := int64(1)
	if req.NumSamples != nil {
		n = *req.NumSamples
	}
	if n < 1 || n > math.MaxInt32 { // the core applies the server's cap
		return badRequest("num_samples must be at least 1, got %d", n)
	}
	images := 0
	prompt, promptImages, err := chunksToInput(req.Prompt.Chunks, &images, s.opt.ImageFetcher.ForRequest(r.Context()))
	if err != nil {
		return badRequest("prompt: %v", err)
	}
	params, err := req.SamplingParams.toProto()
	if err != nil {
		return err
	}
	params.TopLogprobs = int32(req.TopkSampleLogprobs)
	targets, err := targetPromptTokens(req.TargetPromptLogprobs, len(prompt))
	if err != nil {
		return err
	}
	// Without a sampling session, the workspace's shared sampler of the base model or
	// checkpoint samples (no sampler record per request).
	if req.SamplingSessionID == "" && req.BaseModel == "" && req.ModelPath == "" {
		return badRequest("asample needs sampling_session_id (or base_model / model_path)")
	}
	sreq := &loopsv1.SampleRequest{
		SamplerId: req.SamplingSessionID, SeqId: req.SeqID, Prompt: prompt, NumSamples: int32(n), Params: params,
		PromptLogprobs: req.PromptLogprobs != nil && *req.PromptLogprobs, TopkPromptLogprobs: int32(req.TopkPromptLogprobs),
		TargetPromptTokens: targets, PromptAltTokensK: int32(req.PromptAltTokensK), PromptImages: promptImages,
	}
	if req.PromptLogprobsLastN != nil {
		sreq.PromptLogprobsLastN = int32(*req.PromptLogprobsLastN)
	}
	if req.SamplingSessionID == "" {
		sreq.BaseModel, sreq.ModelPath = req.BaseModel, req.ModelPath
	}
	op, err := s.svc.Sampling.Sample(r.Context(), sreq)
	if err != nil {
		return err
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s.%d", op.GetId(), i)
	}
	s.edge.WriteJSON(w, http.StatusOK, futureResponse{RequestID: op.GetId(), SampleSequenceIDs: ids})
	return nil
}

// joinSamplingSession serves join_sampling_session: an unpickled SamplingClient (or one
// made from a sampler handle) asks for its client id before its first sample, so that its
// seq_ids (client_counter × 10⁹ + n) never collide with another client's of the same
// sampler (loops.v1 SamplerClientService.JoinSampler).
func (s *server) joinSamplingSession(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SamplingSessionID string `json:"sampling_session_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.SamplingSessionID == "" {
		return badRequest("sampling_session_id (the sampling session to join) is required")
	}
	res, err := s.svc.Clients.JoinSampler(r.Context(), &loopsv1.JoinSamplerRequest{SamplerId: req.SamplingSessionID})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct {
		Type          string `json:"type"`
		ClientCounter int64  `json:"client_counter"`
	}{"join_sampling_session", res.GetClientCounter()})
	return nil
}
