package nn

import (
	"fmt"
	"slices"
	"strings"
)

// ServedModelTypes are the config.json model_type values this engine computes: the dense
// Qwen3, Qwen2, Llama and Gemma 3 (text) decoders, and Qwen3-MoE.
var ServedModelTypes = []string{"qwen3", "qwen2", "llama", gemma3Type, qwen3MoeType}

// Family is what the catalog says of a served family (ModelInfo's family, publisher and
// renderer); the torch worker's family files say the same of theirs (a test keeps the
// two in step).
type Family struct {
	Name, Publisher, Renderer string
}

// Families are the families of ServedModelTypes, by model_type.
var Families = map[string]Family{
	"qwen3":      {Name: "qwen3", Publisher: "Qwen", Renderer: "qwen3"},
	"qwen2":      {Name: "qwen2", Publisher: "Qwen", Renderer: "role_colon"},
	"llama":      {Name: "llama", Publisher: "Meta", Renderer: "llama3"},
	gemma3Type:   {Name: "gemma3", Publisher: "Google", Renderer: "role_colon"},
	qwen3MoeType: {Name: "qwen3_moe", Publisher: "Qwen", Renderer: "qwen3"},
}

// LoraTargets are the engine's LoRA targets of a model with config c (ModelInfo.lora_targets),
// in PEFT naming order: for a MoE model the attention, the experts' fused parameters
// (PEFT's target_parameters) and the unembedding, as the torch worker's qwen3_moe family.
func LoraTargets(c *Config) []string {
	if c.moe.on {
		out := append(slices.Clone(TargetNames[:TGate]), ExpertTargetNames[:]...)
		return append(out, "lm_head")
	}
	return append(slices.Clone(TargetNames[:]), "lm_head")
}

// TorchModelTypes maps the model_type values the torch worker serves and this engine does
// not to the worker's family name (backends/torch/loops_worker/families/; a test keeps the
// two in step).
var TorchModelTypes = map[string]string{
	"gpt_oss":          "gpt_oss",
	"qwen3_5_text":     "qwen3_5",
	"mistral":          "mistral",
	"deepseek_v3":      "deepseek_v3",
	"qwen3_5_moe_text": "qwen3_5_moe",
	"glm_moe_dsa":      "glm_moe_dsa",
	"minimax_m2":       "minimax_m2",
	"nemotron_h":       "nemotron_h",
	"gemma4_text":      "gemma4",
	"kimi_k2":          "kimi_k2",
	"deepseek_v4":      "deepseek_v4",
	"qwen3_next":       "qwen3_next",
	// vision-language checkpoints: the worker serves their language model on text, and
	// image chunks on qwen3_vl and qwen3_5
	"qwen3_vl":    "qwen3_vl",
	"qwen3_5":     "qwen3_5",
	"qwen3_5_moe": "qwen3_5_moe",
	"gemma3":      "gemma3",
	"gemma4":      "gemma4",
	"kimi_k25":    "kimi_k25",
}

// CheckFamily refuses a model_type this engine does not serve, naming the family and the
// backend that serves it. An empty model_type (hand-written configs) is left to the size
// checks.
func CheckFamily(modelType string) error {
	if modelType == "" || slices.Contains(ServedModelTypes, modelType) {
		return nil
	}
	served := strings.Join(ServedModelTypes, ", ")
	if fam, ok := TorchModelTypes[modelType]; ok {
		return fmt.Errorf("model family %s (model_type %q) is not served by the reference engine (it serves %s); "+
			"start loops serve with --backend torch, which serves it (docs/models.md)", fam, modelType, served)
	}
	return fmt.Errorf("model family %q is not served by the reference engine (it serves %s) nor by the torch worker; "+
		"docs/models.md lists the families and how to add one", modelType, served)
}
