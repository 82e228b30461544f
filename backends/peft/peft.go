// Package peft is the on-disk format of a PEFT LoRA adapter folder, shared by every backend
// and by the worker client: the file names, the size cap on adapter_config.json, and that
// file's fields. It reads and writes no tensors and checks nothing a model is needed for;
// each backend validates a folder against its own model.
package peft

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/loops-dev/loops/internal/bounded"
)

// File names of an adapter checkpoint folder.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
	OptimizerFile      = "optimizer.safetensors"
)

// UnembedMetaKey is the adapter_model.safetensors metadata key Loops writes on an adapter
// with an unembedding (lm_head) LoRA, saying which rule it follows: UnembedShared (the LoRA
// adapts the unembedding matrix wherever the model uses it: on a model with tied embeddings
// the input embedding too, as Tinker's unembed_tokens and tinker-cookbook's merge do; on an
// untied model that is the head alone) or UnembedHeadOnly (a model with tied embeddings
// whose adapter was trained before that rule, adapting the head alone). Absent: an adapter
// written before the key existed, or by another tool; its adapter_config.json's
// ensure_weight_tying then decides.
const (
	UnembedMetaKey  = "loops.unembed"
	UnembedShared   = "shared"
	UnembedHeadOnly = "head-only"
)

// MaxConfigBytes caps adapter_config.json; PEFT writes about a kilobyte.
const MaxConfigBytes = 256 << 10

// Config is the adapter_config.json of a PEFT LoRA adapter.
type Config struct {
	PeftType      string   `json:"peft_type"`
	TaskType      string   `json:"task_type"`
	R             int      `json:"r"`
	LoraAlpha     float64  `json:"lora_alpha"`
	LoraDropout   float64  `json:"lora_dropout"`
	TargetModules []string `json:"target_modules"`
	// TargetParameters are the parameters (not modules) adapted: a MoE model's fused
	// expert parameters (e.g. gate_up_proj, down_proj), rank r per expert.
	TargetParameters  []string `json:"target_parameters,omitempty"`
	Bias              string   `json:"bias"`
	BaseModel         string   `json:"base_model_name_or_path"`
	FanInFanOut       bool     `json:"fan_in_fan_out"`
	InferenceMode     bool     `json:"inference_mode"`
	UseRSLora         bool     `json:"use_rslora"`
	UseDora           bool     `json:"use_dora"`
	InitLoraWeights   bool     `json:"init_lora_weights"`
	ModulesToSave     []string `json:"modules_to_save"`
	LayersToTransform []int    `json:"layers_to_transform"`
	// EnsureWeightTying (PEFT's field) says the unembedding LoRA of a model with tied
	// embeddings adapts the shared matrix: the input embedding lookup as well as the head.
	// Loops writes it on adapters that follow that rule; an adapter on a tied model without
	// it was trained with the older head-only rule and keeps it. It means nothing for an
	// untied model.
	EnsureWeightTying bool `json:"ensure_weight_tying,omitempty"`
	// RankPattern and AlphaPattern give some modules another rank or alpha; read so that a
	// backend can refuse them, never written.
	RankPattern  map[string]any `json:"rank_pattern,omitempty"`
	AlphaPattern map[string]any `json:"alpha_pattern,omitempty"`
}

// ReadConfig reads dir/adapter_config.json, at most MaxConfigBytes of it. It only decodes:
// the values are the caller's to check. With a field of the wrong type it returns the error
// and the fields that did decode.
func ReadConfig(dir string) (Config, error) {
	var c Config
	b, err := bounded.ReadFile(filepath.Join(dir, AdapterConfigFile), MaxConfigBytes)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", AdapterConfigFile, err)
	}
	return c, nil
}
