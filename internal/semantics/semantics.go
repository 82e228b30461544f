// Package semantics is the one home of the numbers in Loops' written semantics
// (docs/semantics.md) that more than one part needs: the defaults that a request's unset
// fields take and the limits that requests are validated against. The core
// (gateway/core), the Tinker routes (compat) and the backends import them instead of
// writing the numbers again, so that loops.v1 and the Tinker routes accept and refuse the
// same requests and every backend fills the same defaults. The Python worker
// (backends/torch) cannot import Go; this package's tests check its copies.
package semantics

import (
	"fmt"
	"maps"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Tinker's AdamParams defaults.
const (
	// DefaultLearningRate is Tinker's learning_rate when a Tinker request omits it. loops.v1
	// cannot tell an unset learning_rate from 0, so there 0 stays 0.
	DefaultLearningRate = 1e-4
	DefaultBeta1        = 0.9
	DefaultBeta2        = 0.95
	DefaultEps          = 1e-12
)

// AdamWithDefaults returns p with beta1, beta2 and eps set to DefaultBeta1, DefaultBeta2 and
// DefaultEps when all three are 0 (proto3's "unset"; Adam with beta2 = 0 and eps = 0 is no
// use to anyone). It returns p itself when nothing changes, else a copy; nil stays nil.
func AdamWithDefaults(p *loopsv1.AdamParams) *loopsv1.AdamParams {
	if p == nil || p.GetBeta1() != 0 || p.GetBeta2() != 0 || p.GetEps() != 0 {
		return p
	}
	q := proto.CloneOf(p)
	q.Beta1, q.Beta2, q.Eps = DefaultBeta1, DefaultBeta2, DefaultEps
	return q
}

// Loss function config defaults (loss_fn_config).
const (
	// DefaultClipLowThreshold and DefaultClipHighThreshold bound the ratio in ppo and cispo.
	DefaultClipLowThreshold  = 0.8
	DefaultClipHighThreshold = 1.2
	// DefaultDROBeta is dro's beta (Tinker documents no default; 0.05 is its example value).
	DefaultDROBeta = 0.05
	// DefaultGSPOClipLowThreshold and DefaultGSPOClipHighThreshold bound gspo's sequence
	// ratio: 1 − 3e-4 and 1 + 4e-4, the clipping ranges of the GSPO paper (Zheng et al.,
	// 2025, §5.1). Tinker documents the keys but its default is not published; a sequence
	// ratio is a geometric mean, so it needs a band far tighter than ppo's token ratio.
	DefaultGSPOClipLowThreshold  = 1 - 3e-4
	DefaultGSPOClipHighThreshold = 1 + 4e-4
)

// Bounds of the loss_fn_config numbers (loss_fn_config values must also be finite): a
// low clip threshold in [0, 1], a high one in [1, MaxClipHighThreshold], and dro's beta in
// [0, MaxDROBeta].
const (
	MaxClipHighThreshold = 100
	MaxDROBeta           = 1000
)

// LossConfigRange returns the closed range a loss_fn_config key's value must lie in.
func LossConfigRange(key string) (lo, hi float64) {
	switch key {
	case "clip_low_threshold":
		return 0, 1
	case "clip_high_threshold":
		return 1, MaxClipHighThreshold
	case "beta":
		return 0, MaxDROBeta
	}
	return 0, 0
}

// UnsupportedLosses are loss names a Tinker client may send that Loops refuses, each with
// the reason the refusal gives.
var UnsupportedLosses = map[string]string{
	"stable_reinforce": "stable_reinforce is not supported by Loops: Tinker publishes its inputs (sampling with " +
		"record_stability_info and datum provenance) but not its objective, so it cannot be reproduced exactly; " +
		"train with gspo, ppo, cispo or importance_sampling instead (tinker-cookbook: loss_fn=gspo)",
	"dppo": "dppo is not supported by Loops: Baseten lists it among its losses but publishes no formula for it, " +
		"so it cannot be reproduced exactly; train with ppo, gspo or cispo instead",
}

// lossConfigs are the loss_fn_config keys each Tinker loss accepts, with their defaults.
var lossConfigs = map[string]map[string]float64{
	"cross_entropy":       nil,
	"importance_sampling": nil,
	"ppo":                 {"clip_low_threshold": DefaultClipLowThreshold, "clip_high_threshold": DefaultClipHighThreshold},
	"cispo":               {"clip_low_threshold": DefaultClipLowThreshold, "clip_high_threshold": DefaultClipHighThreshold},
	"dro":                 {"beta": DefaultDROBeta},
	"gspo":                {"clip_low_threshold": DefaultGSPOClipLowThreshold, "clip_high_threshold": DefaultGSPOClipHighThreshold},
}

// LossConfig returns the loss_fn_config keys that lossFn accepts, each with its default (a
// new map; empty for a loss that takes no config), and false for an unknown loss.
func LossConfig(lossFn string) (map[string]float64, bool) {
	c, ok := lossConfigs[lossFn]
	if !ok {
		return nil, false
	}
	return maps.Clone(c), true
}

// Sampling defaults and limits.
const (
	// DefaultMaxTokens is max_tokens when a request gives none (or 0); the model's sequence
	// length less the prompt caps it further.
	DefaultMaxTokens = 1024
	// MaxNumSamples caps num_samples of one sampling request (the core's default cap,
	// core.Options.MaxSamplesPerRequest; the backends accept as many).
	MaxNumSamples = 256
	// MaxTopKPromptLogprobs caps topk_prompt_logprobs.
	MaxTopKPromptLogprobs = 100
	// MaxTopLogprobs caps SamplingParams.top_logprobs, the alternatives returned per sampled
	// token (OpenAI's limit).
	MaxTopLogprobs = 20
	// MaxSamplersInMemory is how many samplers of one workspace are held in memory before
	// the least recently used is dropped (core.Limits.MaxSamplersInMemory's default; the
	// OpenAI surface bounds its sampler cache the same).
	MaxSamplersInMemory = 1024
)

// Limits of SamplingParams' logit adjustments (OpenAI's ranges).
const (
	// MaxLogitBias is the largest |bias| of one logit_bias entry.
	MaxLogitBias = 100
	// MaxLogitBiasEntries caps logit_bias's entries.
	MaxLogitBiasEntries = 300
	// MaxPenalty is the largest |presence_penalty| and |frequency_penalty|.
	MaxPenalty = 2
)

// CheckAdjustments checks p's logit_bias (ids in [0, vocab) when vocab > 0, biases within
// ±MaxLogitBias, at most MaxLogitBiasEntries), presence and frequency penalties (within
// ±MaxPenalty) and min_p ([0, 1]); the error says which and how to fix it. Every backend and
// the core call it, so they refuse the same requests.
func CheckAdjustments(p *loopsv1.SamplingParams, vocab int) error {
	if n := len(p.GetLogitBias()); n > MaxLogitBiasEntries {
		return fmt.Errorf("logit_bias has %d entries; at most %d are allowed", n, MaxLogitBiasEntries)
	}
	for id, b := range p.GetLogitBias() {
		switch {
		case id < 0 || (vocab > 0 && int(id) >= vocab):
			return fmt.Errorf("logit_bias token %d is outside the vocabulary [0, %d)", id, vocab)
		case !(b >= -MaxLogitBias && b <= MaxLogitBias):
			return fmt.Errorf("logit_bias of token %d is %v; biases must be in [-%d, %d]", id, b, MaxLogitBias, MaxLogitBias)
		}
	}
	if v := p.GetPresencePenalty(); !(v >= -MaxPenalty && v <= MaxPenalty) {
		return fmt.Errorf("presence_penalty must be in [-%d, %d], got %v", MaxPenalty, MaxPenalty, v)
	}
	if v := p.GetFrequencyPenalty(); !(v >= -MaxPenalty && v <= MaxPenalty) {
		return fmt.Errorf("frequency_penalty must be in [-%d, %d], got %v", MaxPenalty, MaxPenalty, v)
	}
	if v := p.GetMinP(); !(v >= 0 && v <= 1) {
		return fmt.Errorf("min_p must be in [0, 1], got %v", v)
	}
	rf := p.GetResponseFormat()
	switch rf.GetType() {
	case loopsv1.ResponseFormat_TYPE_UNSPECIFIED, loopsv1.ResponseFormat_TYPE_TEXT, loopsv1.ResponseFormat_TYPE_JSON_OBJECT:
		if rf.GetJsonSchema() != "" {
			return fmt.Errorf("response_format.json_schema is only for type TYPE_JSON_SCHEMA")
		}
	case loopsv1.ResponseFormat_TYPE_JSON_SCHEMA:
		if rf.GetJsonSchema() == "" {
			return fmt.Errorf("response_format TYPE_JSON_SCHEMA needs json_schema")
		}
	default:
		return fmt.Errorf("response_format.type %d is not a known type", rf.GetType())
	}
	if Constrained(p) && (len(p.GetStopStrings()) > 0 || len(p.GetStopTokens()) > 0) {
		return fmt.Errorf("stop sequences cannot be combined with a JSON response_format (a stop would cut the JSON short): leave stop out")
	}
	return nil
}

// Constrained reports whether p asks for a JSON response_format.
func Constrained(p *loopsv1.SamplingParams) bool {
	t := p.GetResponseFormat().GetType()
	return t == loopsv1.ResponseFormat_TYPE_JSON_OBJECT || t == loopsv1.ResponseFormat_TYPE_JSON_SCHEMA
}
