package nn

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
)

// SaveAdapter writes dir/adapter_config.json and dir/adapter_model.safetensors (float32,
// PEFT key names), and dir/optimizer.safetensors (Adam moments as "<key>.exp_avg" and
// "<key>.exp_avg_sq", the step count in metadata) when withOptimizer is set. It returns
// the bytes written.
func SaveAdapter[T Float](dir string, a *Adapter[T], baseModel string, withOptimizer bool) (int64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	cfg := peft.Config{PeftType: "LORA", TaskType: "CAUSAL_LM", R: a.Cfg.Rank,
		LoraAlpha: float64(a.Scale) * float64(a.Cfg.Rank), TargetModules: a.TargetModules(),
		TargetParameters: a.TargetParameters(), Bias: "none", BaseModel: baseModel, InferenceMode: true,
		InitLoraWeights: true, EnsureWeightTying: a.embedsTied()}
	if a.Cfg.Rank > 0 && a.Scale == T(float64(LoraAlpha)/float64(a.Cfg.Rank)) {
		cfg.LoraAlpha = LoraAlpha
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), append(b, '\n'), 0o644); err != nil {
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
		ws = append(ws, safetensors.Tensor{Name: p.Name, Shape: shape, Data: f32(p.stored(p.W))})
		if withOptimizer {
			os_ = append(os_,
				safetensors.Tensor{Name: p.Name + ".exp_avg", Shape: shape, Data: f32(p.stored(p.M))},
				safetensors.Tensor{Name: p.Name + ".exp_avg_sq", Shape: shape, Data: f32(p.stored(p.V))})
		}
	}
	meta := map[string]string{"format": "pt", "loops.seed": strconv.FormatUint(a.Cfg.Seed, 10)}
	if a.Head != nil {
		meta[peft.UnembedMetaKey] = peft.UnembedShared
		if a.HeadOnlyTied {
			meta[peft.UnembedMetaKey] = peft.UnembedHeadOnly
		}
	}
	n, err := safetensors.Write(filepath.Join(dir, peft.AdapterWeightsFile), ws, meta)
	if err != nil {
		return 0, err
	}
	total += n
	if withOptimizer {
		n, err := safetensors.Write(filepath.Join(dir, peft.OptimizerFile), os_, map[string]string{
			"format": "pt", "step": strconv.Itoa(a.Step), "optimizer": "adamw"})
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// moduleTarget maps a PEFT target module name to its block target; lm_head maps to
// NumLayerTargets.
func moduleTarget(name string) (Target, bool) {
	if name == "lm_head" {
		return NumLayerTargets, true
	}
	for t, n := range TargetNames {
		if n == name {
			return Target(t), true
		}
	}
	return 0, false
}

// ReadPEFTConfig reads dir/adapter_config.json (at most peft.MaxConfigBytes) and checks what
// it can without a model: a LoRA adapter with r >= 1, a finite lora_alpha >= 0 (0: the
// default), known target_modules, and none of the PEFT options this engine cannot apply.
func ReadPEFTConfig(dir string) (peft.Config, error) {
	c, err := peft.ReadConfig(dir)
	if err != nil {
		return c, err
	}
	switch {
	case c.PeftType != "" && c.PeftType != "LORA":
		return c, fmt.Errorf("%s: peft_type %q is not LORA", peft.AdapterConfigFile, c.PeftType)
	case c.R < 1:
		return c, fmt.Errorf("%s: r must be at least 1, got %d", peft.AdapterConfigFile, c.R)
	case !(c.LoraAlpha >= 0) || math.IsInf(c.LoraAlpha, 0):
		return c, fmt.Errorf("%s: lora_alpha must be a finite number >= 0, got %g", peft.AdapterConfigFile, c.LoraAlpha)
	case c.UseDora || c.UseRSLora:
		return c, fmt.Errorf("%s: DoRA and rsLoRA adapters are not supported", peft.AdapterConfigFile)
	case len(c.ModulesToSave) > 0:
		return c, fmt.Errorf("%s: modules_to_save is not supported, got %q", peft.AdapterConfigFile, c.ModulesToSave)
	case len(c.RankPattern) > 0 || len(c.AlphaPattern) > 0:
		return c, fmt.Errorf("%s: rank_pattern and alpha_pattern are not supported (every module must have rank r)", peft.AdapterConfigFile)
	case len(c.TargetModules) == 0 && len(c.TargetParameters) == 0:
		return c, fmt.Errorf("%s: target_modules is empty", peft.AdapterConfigFile)
	}
	for _, tp := range c.TargetParameters {
		if !slices.Contains(ExpertTargetNames[:], tp) {
			return c, fmt.Errorf("%s: unknown target parameter %q (known: the MoE experts' %s)", peft.AdapterConfigFile, tp, strings.Join(ExpertTargetNames[:], ", "))
		}
	}
	for _, tm := range c.TargetModules {
		if _, ok := moduleTarget(tm); !ok {
			return c, fmt.Errorf("%s: unknown target module %q (known: %s, lm_head)", peft.AdapterConfigFile, tm, strings.Join(TargetNames[:], ", "))
		}
	}
	return c, nil
}

// loraSlot is where a LoRA tensor of the model goes: target t of layer (t < NumLayerTargets)
// or the head (t == NumLayerTargets), factor A or B.
type loraSlot struct {
	layer   int
	t       Target
	b       bool
	in, out int
	// experts > 0: expert target j of a MoE layer of that many experts (t is then
	// NumLayerTargets+1+j), its tensors E·r wide
	experts, j int
	key        string // the PEFT module key
}

// module is the PEFT module key of the slot.
func (s loraSlot) module() string { return s.key }

// shape is the tensor shape the slot takes at rank r.
func (s loraSlot) shape(r int) [2]int {
	r *= max(s.experts, 1)
	if s.b {
		return [2]int{s.out, r}
	}
	return [2]int{r, s.in}
}

// expertTarget is the slot target of expert target j (after the head's).
func expertTarget(j int) Target { return NumLayerTargets + 1 + Target(j) }

// loraSlots maps every LoRA tensor name model m accepts to its slot; params are the
// adapter's target_parameters (which name its expert tensors). A MoE model's dense MLP
// layers take no LoRA (as the torch worker's qwen3_moe family).
func loraSlots[T Float](m *Model[T], params []string) map[string]loraSlot {
	out := make(map[string]loraSlot, 2*(len(m.Layers)*int(NumLayerTargets)+1))
	add := func(key string, s loraSlot) {
		s.key = key
		out[key+".lora_A.weight"] = s
		s.b = true
		out[key+".lora_B.weight"] = s
	}
	for i, L := range m.Layers {
		for t := Target(0); t < NumLayerTargets; t++ {
			if t > TO && m.Cfg.moe.on {
				continue
			}
			add(layerKey(i, t), loraSlot{layer: i, t: t, in: L.Lin[t].In, out: L.Lin[t].Out})
		}
		if L.MoE == nil {
			continue
		}
		for j, li := range [numExpTargets]*Linear[T]{&L.MoE.GateUp[0], &L.MoE.Down[0]} {
			if slices.Contains(params, ExpertTargetNames[j]) {
				add(expertKey(i, j, params), loraSlot{layer: i, t: expertTarget(j), in: li.In, out: li.Out, experts: len(L.MoE.GateUp), j: j})
			}
		}
	}
	add(headKey, loraSlot{t: NumLayerTargets, in: m.Head.In, out: m.Head.Out})
	return out
}

// tensorLimits bounds the header of a checkpoint file of at most n tensors.
func tensorLimits(n int) safetensors.Limits {
	return safetensors.Limits{MaxHeaderBytes: 64<<10 + 1<<10*int64(n), MaxTensors: n, DTypes: safetensors.FloatDTypes}
}

// openTensors opens dir/name within lim, naming only the file in errors.
func openTensors(dir, name string, lim safetensors.Limits) (*safetensors.File, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	var sf *safetensors.File
	if err == nil {
		sf, err = safetensors.Parse(f, st.Size(), lim)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return sf, nil
}

// readFinite reads tensor name of f into dst (whose length the header was checked
// against), refusing NaN, infinities and, with nonNeg, negative values.
func readFinite[T Float](f *safetensors.File, file, name string, dst []T, nonNeg bool) error {
	d, _, err := f.ReadFloat64(name)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if len(d) != len(dst) {
		return fmt.Errorf("%s: %s has %d values, want %d", file, name, len(d), len(dst))
	}
	for i, v := range d {
		if math.IsNaN(v) || math.IsInf(v, 0) || (nonNeg && v < 0) {
			return fmt.Errorf("%s: %s holds %g at index %d (values must be finite%s)", file, name, v, i,
				map[bool]string{true: " and >= 0", false: ""}[nonNeg])
		}
		dst[i] = T(v)
	}
	return nil
}

// LoadAdapter reads a PEFT adapter folder for model m. Tensors may be stored in F32, F16
// or BF16 (or F64), with or without PEFT's ".default" adapter name. With withOptimizer,
// Adam moments and the step count are read from optimizer.safetensors (which must exist).
//
// Everything the folder declares is checked before anything is allocated for it:
// adapter_config.json (size, r from 1 to maxRank, lora_alpha, target_modules), the
// safetensors headers (size, tensor count, dtypes, offsets tiling the file), every tensor
// name against m's LoRA targets listed in target_modules, every shape against r and m's
// layer dimensions, and the optimizer state against the weights; values must be finite.
// The allocation is then bounded by m and maxRank.
func LoadAdapter[T Float](dir string, m *Model[T], withOptimizer bool, maxRank int) (*Adapter[T], error) {
	pc, err := ReadPEFTConfig(dir)
	if err != nil {
		return nil, err
	}
	if pc.R > maxRank {
		return nil, fmt.Errorf("%s: r = %d is above this engine's rank limit %d", peft.AdapterConfigFile, pc.R, maxRank)
	}
	targets := map[Target]bool{}
	for _, tm := range pc.TargetModules {
		t, _ := moduleTarget(tm)
		targets[t] = true
	}
	for _, l := range pc.LayersToTransform {
		if l < 0 || l >= len(m.Layers) {
			return nil, fmt.Errorf("%s: layers_to_transform holds %d, but the model has %d layers", peft.AdapterConfigFile, l, len(m.Layers))
		}
	}
	if m.Cfg.moe.on {
		for _, tm := range pc.TargetModules {
			if t, _ := moduleTarget(tm); t > TO && t < NumLayerTargets {
				return nil, fmt.Errorf("%s: target module %s: on a MoE model the MLP LoRA is the experts' (target_parameters %s); "+
					"its dense MLP layers are not adapted", peft.AdapterConfigFile, tm, strings.Join(ExpertTargetNames[:], ", "))
			}
		}
		for _, tp := range pc.TargetParameters {
			targets[expertTarget(slices.Index(ExpertTargetNames[:], tp))] = true
		}
	} else if len(pc.TargetParameters) > 0 {
		return nil, fmt.Errorf("%s: target_parameters %q name MoE expert parameters, but the model has no MoE layers", peft.AdapterConfigFile, pc.TargetParameters)
	}
	r := pc.R
	slots := loraSlots(m, pc.TargetParameters)
	f, err := openTensors(dir, peft.AdapterWeightsFile, tensorLimits(len(slots)))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	stored := map[string]string{} // canonical name -> stored name
	for k, info := range f.Tensors {
		name := strings.Replace(k, ".default.weight", ".weight", 1)
		if prev, dup := stored[name]; dup {
			return nil, fmt.Errorf("%s holds both %s and %s", peft.AdapterWeightsFile, prev, k)
		}
		s, ok := slots[name]
		if !ok {
			return nil, fmt.Errorf("%s: tensor %s is not a LoRA tensor of this model (expected keys like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)", peft.AdapterWeightsFile, k)
		}
		if !targets[s.t] {
			return nil, fmt.Errorf("%s: tensor %s belongs to a module that target_modules %q does not list", peft.AdapterWeightsFile, k, pc.TargetModules)
		}
		want := s.shape(r)
		if len(info.Shape) != 2 || info.Shape[0] != int64(want[0]) || info.Shape[1] != int64(want[1]) {
			return nil, fmt.Errorf("%s: %s has shape %v, want %v for r = %d (does the adapter belong to this base model?)", peft.AdapterWeightsFile, k, info.Shape, want, r)
		}
		stored[name] = k
	}
	if len(stored) == 0 {
		return nil, fmt.Errorf("%s holds no LoRA tensors this model knows (expected keys like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)", peft.AdapterWeightsFile)
	}
	// Every module needs both factors; every listed target module needs a module.
	covered := map[Target]bool{}
	for name, s := range slots {
		if s.b {
			continue
		}
		_, hasA := stored[name]
		_, hasB := stored[s.module()+".lora_B.weight"]
		if hasA != hasB {
			return nil, fmt.Errorf("%s holds only one of lora_A and lora_B for %s", peft.AdapterWeightsFile, s.module())
		}
		if hasA {
			covered[s.t] = true
		}
	}
	for _, tm := range pc.TargetModules {
		if t, _ := moduleTarget(tm); !covered[t] {
			return nil, fmt.Errorf("%s lists target module %s but %s holds no tensors for it", peft.AdapterConfigFile, tm, peft.AdapterWeightsFile)
		}
	}
	for _, tp := range pc.TargetParameters {
		if !covered[expertTarget(slices.Index(ExpertTargetNames[:], tp))] {
			return nil, fmt.Errorf("%s lists target parameter %s but %s holds no tensors for it", peft.AdapterConfigFile, tp, peft.AdapterWeightsFile)
		}
	}
	var of *safetensors.File
	step := 0
	if withOptimizer {
		of, err = openTensors(dir, peft.OptimizerFile, tensorLimits(2*len(stored)))
		if err != nil {
			return nil, fmt.Errorf("optimizer state requested but %s could not be read: %w", peft.OptimizerFile, err)
		}
		defer of.Close()
		step, err = strconv.Atoi(of.Metadata["step"])
		if err != nil || step < 0 {
			return nil, fmt.Errorf("%s: the metadata needs a step count >= 0, got %q", peft.OptimizerFile, of.Metadata["step"])
		}
		for k, info := range of.Tensors {
			base, ok := strings.CutSuffix(k, ".exp_avg")
			if !ok {
				base, ok = strings.CutSuffix(k, ".exp_avg_sq")
			}
			if _, has := stored[base]; !ok || !has {
				return nil, fmt.Errorf("%s: tensor %s is not the exp_avg or exp_avg_sq of a tensor in %s", peft.OptimizerFile, k, peft.AdapterWeightsFile)
			}
			want := slots[base].shape(r)
			if len(info.Shape) != 2 || info.Shape[0] != int64(want[0]) || info.Shape[1] != int64(want[1]) {
				return nil, fmt.Errorf("%s: %s has shape %v, want %v", peft.OptimizerFile, k, info.Shape, want)
			}
		}
		if len(of.Tensors) != 2*len(stored) {
			return nil, fmt.Errorf("%s holds %d tensors, want exp_avg and exp_avg_sq for each of the %d in %s", peft.OptimizerFile, len(of.Tensors), len(stored), peft.AdapterWeightsFile)
		}
	}

	// Validated: allocate only the pairs present, in NewAdapter's order.
	var seed uint64
	if s, ok := f.Metadata["loops.seed"]; ok {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	a := &Adapter[T]{Cfg: LoraConfig{Rank: r, Seed: seed}, Scale: T(float64(LoraAlpha) / float64(r)), Step: step}
	if pc.LoraAlpha > 0 {
		a.Scale = T(pc.LoraAlpha / float64(r))
	}
	a.Layers = make([][NumLayerTargets]*Pair[T], len(m.Layers))
	pair := func(key string, in, out, r int) *Pair[T] {
		if _, ok := stored[key+".lora_A.weight"]; !ok {
			return nil
		}
		p := zeroPair[T](key, in, out, r)
		a.Params = append(a.Params, p.A, p.B)
		return p
	}
	for i, L := range m.Layers {
		for t := Target(0); t < NumLayerTargets; t++ {
			if p := pair(layerKey(i, t), L.Lin[t].In, L.Lin[t].Out, r); p != nil {
				a.Layers[i][t] = p
				a.Cfg.Attn = a.Cfg.Attn || t <= TO
				a.Cfg.MLP = a.Cfg.MLP || t > TO
			}
		}
		if L.MoE == nil {
			continue
		}
		E := len(L.MoE.GateUp)
		for j, li := range [numExpTargets]*Linear[T]{&L.MoE.GateUp[0], &L.MoE.Down[0]} {
			if !slices.Contains(pc.TargetParameters, ExpertTargetNames[j]) {
				continue
			}
			if p := pair(expertKey(i, j, pc.TargetParameters), li.In, li.Out, E*r); p != nil {
				p.B.experts = E
				if a.Experts == nil {
					a.Experts = make([][numExpTargets]*ExpertLoRA[T], len(m.Layers))
				}
				a.Experts[i][j] = newExpertLoRA(p.A, p.B, E, r, li.In, li.Out)
				a.Cfg.MLP = true
			}
		}
	}
	if a.Head = pair(headKey, m.Head.In, m.Head.Out, r); a.Head != nil {
		a.Cfg.Unembed = true
		// without PEFT's marker the adapter was trained by the head-only rule: keep it
		a.TiedEmbed = m.Cfg.Tied && pc.EnsureWeightTying
		a.HeadOnlyTied = m.Cfg.Tied && !pc.EnsureWeightTying
	}
	for _, p := range a.Params {
		if err := readFinite(f, peft.AdapterWeightsFile, stored[p.Name], p.W, false); err != nil {
			return nil, err
		}
		p.held(p.W)
		if of != nil {
			if err := readFinite(of, peft.OptimizerFile, p.Name+".exp_avg", p.M, false); err != nil {
				return nil, err
			}
			if err := readFinite(of, peft.OptimizerFile, p.Name+".exp_avg_sq", p.V, true); err != nil {
				return nil, err
			}
			p.held(p.M)
			p.held(p.V)
		}
	}
	return a, nil
}

// GradientsFile holds an adapter's accumulated (not yet applied) gradient: "<tensor>.grad"
// for each tensor of adapter_model.safetensors, float32, zero where nothing accumulated.
// With optimizer.safetensors it makes a folder the complete training state of an adapter,
// so the adapter can leave its slot between forward_backward and optim_step.
const GradientsFile = "gradients.safetensors"

// gradSuffix is the suffix of a gradient tensor's name in GradientsFile.
const gradSuffix = ".grad"

// SaveGradients writes dir/gradients.safetensors with a's accumulated gradients (float32,
// exactly as held) and returns the bytes written. dir must exist.
func SaveGradients[T Float](dir string, a *Adapter[T]) (int64, error) {
	ts := make([]safetensors.Tensor, 0, len(a.Params))
	for _, p := range a.Params {
		g := make([]float32, len(p.G))
		for i, v := range p.stored(p.G) {
			g[i] = float32(v)
		}
		ts = append(ts, safetensors.Tensor{Name: p.Name + gradSuffix, Shape: []int64{int64(p.Shape[0]), int64(p.Shape[1])}, Data: g})
	}
	return safetensors.Write(filepath.Join(dir, GradientsFile), ts, map[string]string{"format": "pt"})
}

// LoadGradients replaces a's accumulated gradients with dir/gradients.safetensors. The
// header is checked before any value is read: at most one tensor per parameter of a, each
// named "<parameter>.grad" with the parameter's shape and a float dtype, and every
// parameter covered; values must be finite. On error a's gradients are unchanged.
func LoadGradients[T Float](dir string, a *Adapter[T]) error {
	f, err := openTensors(dir, GradientsFile, tensorLimits(len(a.Params)))
	if err != nil {
		return fmt.Errorf("gradients requested but %s could not be read: %w", GradientsFile, err)
	}
	defer f.Close()
	byName := make(map[string]*Param[T], len(a.Params))
	for _, p := range a.Params {
		byName[p.Name+gradSuffix] = p
	}
	for k, info := range f.Tensors {
		p, ok := byName[k]
		if !ok {
			return fmt.Errorf("%s: tensor %s is not the gradient of a tensor in %s", GradientsFile, k, peft.AdapterWeightsFile)
		}
		if len(info.Shape) != 2 || info.Shape[0] != int64(p.Shape[0]) || info.Shape[1] != int64(p.Shape[1]) {
			return fmt.Errorf("%s: %s has shape %v, want %v", GradientsFile, k, info.Shape, p.Shape)
		}
	}
	if len(f.Tensors) != len(a.Params) {
		return fmt.Errorf("%s holds %d tensors, want one gradient for each of the %d in %s", GradientsFile, len(f.Tensors), len(a.Params), peft.AdapterWeightsFile)
	}
	gs := make([][]T, len(a.Params))
	for i, p := range a.Params {
		gs[i] = make([]T, len(p.G))
		if err := readFinite(f, GradientsFile, p.Name+gradSuffix, gs[i], false); err != nil {
			return err
		}
		p.held(gs[i])
	}
	for i, p := range a.Params {
		copy(p.G, gs[i])
	}
	return nil
}
