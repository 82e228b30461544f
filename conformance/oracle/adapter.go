package oracle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LoraPair is one adapted module's A [r, in] and B [out, r].
type LoraPair struct {
	A, B *Tensor
}

// AdapterConfig is the part of a PEFT adapter_config.json the oracle reads.
type AdapterConfig struct {
	PeftType      string   `json:"peft_type"`
	R             int      `json:"r"`
	LoraAlpha     float64  `json:"lora_alpha"`
	TargetModules []string `json:"target_modules"`
	UseRSLora     bool     `json:"use_rslora"`
	BaseModel     string   `json:"base_model_name_or_path"`
	// EnsureWeightTying: on a model with tied embeddings, the lm_head LoRA adapts the shared
	// matrix, so the embedding lookup too (PEFT's ensure_weight_tying); otherwise the head only.
	EnsureWeightTying bool `json:"ensure_weight_tying"`
}

// Adapter is a LoRA adapter in float64. Modules are named by their Hugging Face path
// ("model.layers.0.self_attn.q_proj", "lm_head").
type Adapter struct {
	Cfg   AdapterConfig
	Pairs map[string]*LoraPair
}

// PEFTKey is the adapter_model.safetensors key of a module's lora_A or lora_B ("A"/"B").
func PEFTKey(module, ab string) string {
	return "base_model.model." + module + ".lora_" + ab + ".weight"
}

// LoadAdapter reads a PEFT LoRA folder (adapter_config.json, adapter_model.safetensors).
// Keys may carry PEFT's ".default" adapter name.
func LoadAdapter(dir string) (*Adapter, error) {
	b, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		return nil, err
	}
	ad := &Adapter{Pairs: map[string]*LoraPair{}}
	if err := json.Unmarshal(b, &ad.Cfg); err != nil {
		return nil, fmt.Errorf("adapter_config.json: %w", err)
	}
	if ad.Cfg.R < 1 {
		return nil, fmt.Errorf("adapter_config.json: r = %d", ad.Cfg.R)
	}
	ts, _, err := ReadSafetensors(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		return nil, err
	}
	for k, v := range ts {
		k = strings.Replace(k, ".default.weight", ".weight", 1)
		rest, ok := strings.CutPrefix(k, "base_model.model.")
		if !ok {
			return nil, fmt.Errorf("adapter key %q lacks the base_model.model. prefix", k)
		}
		var module, ab string
		switch {
		case strings.HasSuffix(rest, ".lora_A.weight"):
			module, ab = strings.TrimSuffix(rest, ".lora_A.weight"), "A"
		case strings.HasSuffix(rest, ".lora_B.weight"):
			module, ab = strings.TrimSuffix(rest, ".lora_B.weight"), "B"
		default:
			return nil, fmt.Errorf("adapter key %q is neither lora_A nor lora_B", k)
		}
		if len(v.Shape) != 2 {
			return nil, fmt.Errorf("adapter tensor %q has shape %v; want 2-D", k, v.Shape)
		}
		p := ad.Pairs[module]
		if p == nil {
			p = &LoraPair{}
			ad.Pairs[module] = p
		}
		if ab == "A" {
			p.A = v
		} else {
			p.B = v
		}
	}
	for mod, p := range ad.Pairs {
		if p.A == nil || p.B == nil {
			return nil, fmt.Errorf("module %s has only one of lora_A and lora_B", mod)
		}
		if p.A.Rows() != ad.Cfg.R || p.B.Cols() != ad.Cfg.R {
			return nil, fmt.Errorf("module %s: lora_A %v and lora_B %v do not have rank %d", mod, p.A.Shape, p.B.Shape, ad.Cfg.R)
		}
	}
	return ad, nil
}

// Modules lists the adapted modules, sorted.
func (a *Adapter) Modules() []string {
	out := make([]string, 0, len(a.Pairs))
	for k := range a.Pairs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Keys lists the PEFT keys of every parameter tensor, sorted.
func (a *Adapter) Keys() []string {
	var out []string
	for _, m := range a.Modules() {
		out = append(out, PEFTKey(m, "A"), PEFTKey(m, "B"))
	}
	sort.Strings(out)
	return out
}

// Param returns the tensor of a PEFT key (nil if the adapter has no such key).
func (a *Adapter) Param(key string) *Tensor {
	rest := strings.TrimPrefix(key, "base_model.model.")
	if m, ok := strings.CutSuffix(rest, ".lora_A.weight"); ok && a.Pairs[m] != nil {
		return a.Pairs[m].A
	}
	if m, ok := strings.CutSuffix(rest, ".lora_B.weight"); ok && a.Pairs[m] != nil {
		return a.Pairs[m].B
	}
	return nil
}

// Clone returns a deep copy.
func (a *Adapter) Clone() *Adapter {
	c := &Adapter{Cfg: a.Cfg, Pairs: map[string]*LoraPair{}}
	c.Cfg.TargetModules = append([]string(nil), a.Cfg.TargetModules...)
	for k, p := range a.Pairs {
		c.Pairs[k] = &LoraPair{A: p.A.Clone(), B: p.B.Clone()}
	}
	return c
}

// Vector returns every parameter as one flat map of PEFT key to values (copies).
func (a *Adapter) Vector() map[string][]float64 {
	out := map[string][]float64{}
	for _, k := range a.Keys() {
		out[k] = append([]float64(nil), a.Param(k).Data...)
	}
	return out
}

// Shifted returns a copy of the adapter with h·dir added to its parameters. dir is keyed
// by PEFT key; missing keys are not moved.
func (a *Adapter) Shifted(dir map[string][]float64, h float64) *Adapter {
	c := a.Clone()
	for k, d := range dir {
		p := c.Param(k)
		if p == nil {
			panic("oracle: adapter has no parameter " + k)
		}
		for i, v := range d {
			p.Data[i] += h * v
		}
	}
	return c
}

// pair returns the LoRA pair of a module, or nil (also for a nil adapter).
func (a *Adapter) pair(module string) *LoraPair {
	if a == nil {
		return nil
	}
	return a.Pairs[module]
}

// scale is lora_alpha / r (lora_alpha / √r with use_rslora).
func (a *Adapter) scale() float64 {
	if a == nil {
		return 0
	}
	if a.Cfg.UseRSLora {
		return a.Cfg.LoraAlpha / sqrt(float64(a.Cfg.R))
	}
	return a.Cfg.LoraAlpha / float64(a.Cfg.R)
}

// Scale is the LoRA scale, lora_alpha / r.
func (a *Adapter) Scale() float64 { return a.scale() }
