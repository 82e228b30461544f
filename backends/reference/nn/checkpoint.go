package nn

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/loops-dev/loops/backends/reference/safetensors"
)

// File names of an adapter checkpoint folder.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
	OptimizerFile      = "optimizer.safetensors"
)

// PEFTConfig is the adapter_config.json of a PEFT LoRA adapter.
type PEFTConfig struct {
	PeftType          string   `json:"peft_type"`
	TaskType          string   `json:"task_type"`
	R                 int      `json:"r"`
	LoraAlpha         float64  `json:"lora_alpha"`
	LoraDropout       float64  `json:"lora_dropout"`
	TargetModules     []string `json:"target_modules"`
	Bias              string   `json:"bias"`
	BaseModel         string   `json:"base_model_name_or_path"`
	FanInFanOut       bool     `json:"fan_in_fan_out"`
	InferenceMode     bool     `json:"inference_mode"`
	UseRSLora         bool     `json:"use_rslora"`
	UseDora           bool     `json:"use_dora"`
	InitLoraWeights   bool     `json:"init_lora_weights"`
	ModulesToSave     []string `json:"modules_to_save"`
	LayersToTransform []int    `json:"layers_to_transform"`
}

// SaveAdapter writes dir/adapter_config.json and dir/adapter_model.safetensors (float32,
// PEFT key names), and dir/optimizer.safetensors (Adam moments as "<key>.exp_avg" and
// "<key>.exp_avg_sq", the step count in metadata) when withOptimizer is set. It returns
// the bytes written.
func SaveAdapter[T Float](dir string, a *Adapter[T], baseModel string, withOptimizer bool) (int64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	cfg := PEFTConfig{PeftType: "LORA", TaskType: "CAUSAL_LM", R: a.Cfg.Rank,
		LoraAlpha: float64(a.Scale) * float64(a.Cfg.Rank), TargetModules: a.TargetModules(),
		Bias: "none", BaseModel: baseModel, InferenceMode: true, InitLoraWeights: true}
	if a.Cfg.Rank > 0 && a.Scale == T(float64(LoraAlpha)/float64(a.Cfg.Rank)) {
		cfg.LoraAlpha = LoraAlpha
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, AdapterConfigFile), append(b, '\n'), 0o644); err != nil {
		return 0, err
	}
	total := int64(len(b) + 1)
	f32 := func(x []T) []float32 {
		o := make([]float32, len(x))
		for i, v := range x {
			o[i] = float32(v)
		}
		return o
	}
	var ws, os_ []safetensors.Tensor
	for _, p := range a.Params {
		shape := []int64{int64(p.Shape[0]), int64(p.Shape[1])}
		ws = append(ws, safetensors.Tensor{Name: p.Name, Shape: shape, Data: f32(p.W)})
		os_ = append(os_,
			safetensors.Tensor{Name: p.Name + ".exp_avg", Shape: shape, Data: f32(p.M)},
			safetensors.Tensor{Name: p.Name + ".exp_avg_sq", Shape: shape, Data: f32(p.V)})
	}
	meta := map[string]string{"format": "pt", "loops.seed": strconv.FormatUint(a.Cfg.Seed, 10)}
	n, err := safetensors.Write(filepath.Join(dir, AdapterWeightsFile), ws, meta)
	if err != nil {
		return 0, err
	}
	total += n
	if withOptimizer {
		n, err := safetensors.Write(filepath.Join(dir, OptimizerFile), os_, map[string]string{
			"format": "pt", "step": strconv.Itoa(a.Step), "optimizer": "adamw"})
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// ReadPEFTConfig reads dir/adapter_config.json.
func ReadPEFTConfig(dir string) (PEFTConfig, error) {
	var c PEFTConfig
	b, err := os.ReadFile(filepath.Join(dir, AdapterConfigFile))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", AdapterConfigFile, err)
	}
	if c.PeftType != "" && c.PeftType != "LORA" {
		return c, fmt.Errorf("%s: peft_type %q is not LORA", AdapterConfigFile, c.PeftType)
	}
	if c.R < 1 {
		return c, fmt.Errorf("%s: r must be at least 1", AdapterConfigFile)
	}
	if c.UseDora || c.UseRSLora {
		return c, fmt.Errorf("%s: DoRA and rsLoRA adapters are not supported", AdapterConfigFile)
	}
	return c, nil
}

// LoadAdapter reads a PEFT adapter folder for model m. Tensors may be stored in F32, F16
// or BF16, with or without PEFT's ".default" adapter name. With withOptimizer, Adam moments
// and the step count are read from optimizer.safetensors (which must exist).
func LoadAdapter[T Float](dir string, m *Model[T], withOptimizer bool) (*Adapter[T], error) {
	pc, err := ReadPEFTConfig(dir)
	if err != nil {
		return nil, err
	}
	f, err := safetensors.Open(filepath.Join(dir, AdapterWeightsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]string{} // canonical -> stored
	for k := range f.Tensors {
		names[strings.Replace(k, ".default.weight", ".weight", 1)] = k
	}
	var seed uint64
	if s, ok := f.Metadata["loops.seed"]; ok {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	cfg := LoraConfig{Rank: pc.R, Seed: seed, Attn: true, MLP: true, Unembed: true}
	a, err := NewAdapter(m, cfg)
	if err != nil {
		return nil, err
	}
	if pc.LoraAlpha > 0 {
		a.Scale = T(pc.LoraAlpha / float64(pc.R))
	}
	// keep only the pairs present in the file
	keep := func(p *Pair[T]) *Pair[T] {
		if p == nil {
			return nil
		}
		_, okA := names[p.A.Name]
		_, okB := names[p.B.Name]
		if okA != okB {
			return nil
		}
		if !okA {
			return nil
		}
		return p
	}
	var params []*Param[T]
	a.Cfg.Attn, a.Cfg.MLP, a.Cfg.Unembed = false, false, false
	for i := range a.Layers {
		for t := range a.Layers[i] {
			p := keep(a.Layers[i][t])
			a.Layers[i][t] = p
			if p != nil {
				params = append(params, p.A, p.B)
				if Target(t) <= TO {
					a.Cfg.Attn = true
				} else {
					a.Cfg.MLP = true
				}
			}
		}
	}
	a.Head = keep(a.Head)
	if a.Head != nil {
		params = append(params, a.Head.A, a.Head.B)
		a.Cfg.Unembed = true
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("%s holds no LoRA tensors this model knows (expected keys like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)", AdapterWeightsFile)
	}
	a.Params = params
	used := 0
	for _, p := range params {
		d, shape, err := f.ReadFloat64(names[p.Name])
		if err != nil {
			return nil, err
		}
		if len(shape) != 2 || int(shape[0]) != p.Shape[0] || int(shape[1]) != p.Shape[1] {
			return nil, fmt.Errorf("%s has shape %v, want %v (does the adapter belong to this base model?)", p.Name, shape, p.Shape)
		}
		for i, v := range d {
			p.W[i] = T(v)
		}
		used++
	}
	if used*1 != len(f.Tensors) {
		return nil, fmt.Errorf("%s holds %d tensors but only %d match this model's LoRA targets", AdapterWeightsFile, len(f.Tensors), used)
	}
	if withOptimizer {
		of, err := safetensors.Open(filepath.Join(dir, OptimizerFile))
		if err != nil {
			return nil, fmt.Errorf("optimizer state requested but %s could not be read: %w", OptimizerFile, err)
		}
		defer of.Close()
		step, err := strconv.Atoi(of.Metadata["step"])
		if err != nil {
			return nil, fmt.Errorf("%s: missing step in metadata", OptimizerFile)
		}
		a.Step = step
		for _, p := range params {
			for _, mv := range []struct {
				suffix string
				dst    []T
			}{{".exp_avg", p.M}, {".exp_avg_sq", p.V}} {
				d, _, err := of.ReadFloat64(p.Name + mv.suffix)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", OptimizerFile, err)
				}
				if len(d) != len(mv.dst) {
					return nil, fmt.Errorf("%s: %s%s has the wrong size", OptimizerFile, p.Name, mv.suffix)
				}
				for i, v := range d {
					mv.dst[i] = T(v)
				}
			}
		}
	}
	return a, nil
}
