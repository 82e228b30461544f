package tinkerlayout

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
)

const (
	exE, exR, exH, exI = 3, 2, 5, 4
	exPre              = "base_model.model.model.layers.0.mlp"
)

// expertAdapter writes a PEFT-layout adapter with one MoE layer's expert LoRA (gate_up_proj
// [E, 2I, H], down_proj [E, H, I], r 2 per expert), a q_proj and an lm_head LoRA, and its
// adapter_config.json, in a folder it returns with the weights file's bytes.
func expertAdapter(t testing.TB) (string, []byte) {
	t.Helper()
	val := 0
	mk := func(name string, shape ...int64) safetensors.Tensor {
		d := make([]float32, safetensors.Numel(shape))
		for i := range d {
			val++
			d[i] = float32(val%97)/10 - 4
		}
		return safetensors.Tensor{Name: name, Shape: shape, Data: d}
	}
	ts := []safetensors.Tensor{
		mk(exPre+".experts.base_layer.lora_A.weight", exE*exR, exH),
		mk(exPre+".experts.base_layer.lora_B.weight", 2*exI, exR*exE),
		mk(exPre+".experts.lora_A.weight", exE*exR, exI),
		mk(exPre+".experts.lora_B.weight", exH, exR*exE),
		mk("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", exR, exH),
		mk("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", exH, exR),
		mk("base_model.model.lm_head.lora_A.weight", exR, exH),
		mk("base_model.model.lm_head.lora_B.weight", 7, exR),
	}
	dir := t.TempDir()
	_, err := safetensors.Write(filepath.Join(dir, peft.AdapterWeightsFile), ts, map[string]string{"format": "pt"})
	require.NoError(t, err)
	cfg := `{"peft_type": "LORA", "r": 2, "lora_alpha": 32, "target_modules": ["lm_head", "q_proj"], "target_parameters": ["gate_up_proj", "down_proj"]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, peft.AdapterConfigFile), []byte(cfg), 0o644))
	b, err := os.ReadFile(filepath.Join(dir, peft.AdapterWeightsFile))
	require.NoError(t, err)
	return dir, b
}

// deltaPEFT is expert e's ΔW/scale = B_e·A_e of a PEFT expert LoRA (PEFT's ParamWrapper:
// A reshaped (E, r, in), B reshaped (out, r, E)), the rows from lo to hi by step.
func deltaPEFT(a, b []float64, in, lo, hi, step, e int) []float64 {
	d := make([]float64, 0, (hi-lo)*in)
	for o := lo; o < hi; o += step {
		for i := range in {
			s := 0.0
			for j := range exR {
				s += b[o*exR*exE+j*exE+e] * a[(e*exR+j)*in+i]
			}
			d = append(d, s)
		}
	}
	return d
}

// deltaTinker is expert e's B_e·A_e of a Tinker expert LoRA (A (E, r, in), B (E, out, r)).
func deltaTinker(a, b []float64, in, out, e int) []float64 {
	d := make([]float64, 0, out*in)
	for o := range out {
		for i := range in {
			s := 0.0
			for j := range exR {
				s += b[(e*out+o)*exR+j] * a[(e*exR+j)*in+i]
			}
			d = append(d, s)
		}
	}
	return d
}

func TestExpertsToTinkerAndBack(t *testing.T) {
	for family := range ExpertFamilies {
		t.Run(family, func(t *testing.T) { testExpertsRoundTrip(t, family) })
	}
}

func testExpertsRoundTrip(t *testing.T, family string) {
	dir, b := expertAdapter(t)
	rn, err := ToTinker(bytes.NewReader(b), int64(len(b)), Checkpoint{Rank: exR, Family: family})
	require.NoError(t, err)
	require.True(t, rn.Experts)
	out, err := io.ReadAll(rn)
	require.NoError(t, err)
	require.Equal(t, rn.Size, int64(len(out)))
	f, err := safetensors.Parse(bytes.NewReader(out), int64(len(out)), safetensors.Limits{})
	require.NoError(t, err)
	got, _ := tensors(t, out)
	want, _ := tensors(t, b)
	names := []string{}
	for k := range f.Tensors {
		names = append(names, k)
	}
	wantNames := []string{
		exPre + ".experts.w1.lora_A.weight", exPre + ".experts.w1.lora_B.weight",
		exPre + ".experts.w2.lora_A.weight", exPre + ".experts.w2.lora_B.weight",
		"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
		"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
		"base_model.model.model.unembed_tokens.lora_A.weight", "base_model.model.model.unembed_tokens.lora_B.weight",
	}
	lay := ExpertFamilies[family]
	if !lay.UpOnly {
		wantNames = append(wantNames, exPre+".experts.w3.lora_A.weight", exPre+".experts.w3.lora_B.weight")
	}
	require.ElementsMatch(t, wantNames, names)
	require.Equal(t, []int64{exE, exR, exH}, f.Tensors[exPre+".experts.w1.lora_A.weight"].Shape)
	gA, gB := want[exPre+".experts.base_layer.lora_A.weight"], want[exPre+".experts.base_layer.lora_B.weight"]
	dA, dB := want[exPre+".experts.lora_A.weight"], want[exPre+".experts.lora_B.weight"]
	if lay.UpOnly {
		// Nemotron-H: the first fused parameter is up_proj, all of it w1; no w3
		require.Equal(t, []int64{exE, 2 * exI, exR}, f.Tensors[exPre+".experts.w1.lora_B.weight"].Shape)
		for e := range exE {
			require.Equal(t, deltaPEFT(gA, gB, exH, 0, 2*exI, 1, e), deltaTinker(got[exPre+".experts.w1.lora_A.weight"], got[exPre+".experts.w1.lora_B.weight"], exH, 2*exI, e))
			require.Equal(t, deltaPEFT(dA, dB, exI, 0, exH, 1, e), deltaTinker(got[exPre+".experts.w2.lora_A.weight"], got[exPre+".experts.w2.lora_B.weight"], exI, exH, e))
		}
		expertsBack(t, family, dir, b, out, []any{"q_proj", "unembed_tokens", "w1", "w2"})
		return
	}
	require.Equal(t, []int64{exE, exI, exR}, f.Tensors[exPre+".experts.w3.lora_B.weight"].Shape)
	require.Equal(t, []int64{exE, exH, exR}, f.Tensors[exPre+".experts.w2.lora_B.weight"].Shape)
	// every expert's update is the same: gate rows (the first half, or the even rows for
	// gpt-oss) are w1, up rows w3
	gate, up := [3]int{0, exI, 1}, [3]int{exI, 2 * exI, 1}
	if lay.Interleaved {
		gate, up = [3]int{0, 2 * exI, 2}, [3]int{1, 2 * exI, 2}
	}
	for e := range exE {
		require.Equal(t, deltaPEFT(gA, gB, exH, gate[0], gate[1], gate[2], e), deltaTinker(got[exPre+".experts.w1.lora_A.weight"], got[exPre+".experts.w1.lora_B.weight"], exH, exI, e))
		require.Equal(t, deltaPEFT(gA, gB, exH, up[0], up[1], up[2], e), deltaTinker(got[exPre+".experts.w3.lora_A.weight"], got[exPre+".experts.w3.lora_B.weight"], exH, exI, e))
		require.Equal(t, deltaPEFT(dA, dB, exI, 0, exH, 1, e), deltaTinker(got[exPre+".experts.w2.lora_A.weight"], got[exPre+".experts.w2.lora_B.weight"], exI, exH, e))
	}
	expertsBack(t, family, dir, b, out, []any{"q_proj", "unembed_tokens", "w1", "w2", "w3"})
}

// expertsBack converts the config of the PEFT-layout adapter in dir (weights b) as a
// download does, checks its target_modules, and that the import reads the downloaded
// weights out back into b's tensors, bit for bit, with PEFT's config.
func expertsBack(t *testing.T, family, dir string, b, out []byte, modules []any) {
	t.Helper()
	want, _ := tensors(t, b)
	lay := ExpertFamilies[family]
	cb, err := os.ReadFile(filepath.Join(dir, peft.AdapterConfigFile))
	require.NoError(t, err)
	cb, _, err = RenameTargetModules(cb, TinkerModules)
	require.NoError(t, err)
	cb, err = ExpertConfigToTinker(cb, lay)
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(cb, &cfg))
	require.Equal(t, modules, cfg["target_modules"])
	require.NotContains(t, cfg, "target_parameters")

	// and back: the import reads Tinker's layout into the same tensors, bit for bit
	back := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(back, peft.AdapterWeightsFile), out, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(back, peft.AdapterConfigFile), cb, 0o644))
	changed, err := ToPEFT(back, Base{Family: family})
	require.NoError(t, err)
	require.True(t, changed)
	rb, err := os.ReadFile(filepath.Join(back, peft.AdapterWeightsFile))
	require.NoError(t, err)
	rt, _ := tensors(t, rb)
	require.Equal(t, want, rt)
	rf, err := safetensors.Parse(bytes.NewReader(rb), int64(len(rb)), safetensors.Limits{})
	require.NoError(t, err)
	orig, err := safetensors.Parse(bytes.NewReader(b), int64(len(b)), safetensors.Limits{})
	require.NoError(t, err)
	for k, info := range orig.Tensors {
		require.Equal(t, info.Shape, rf.Tensors[k].Shape, k)
	}
	var rc map[string]any
	rcb, err := os.ReadFile(filepath.Join(back, peft.AdapterConfigFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(rcb, &rc))
	require.Equal(t, []any{"q_proj", "lm_head"}, rc["target_modules"])
	require.Equal(t, []any{lay.Params[0], lay.Params[1]}, rc["target_parameters"])
}

func TestExpertsRefused(t *testing.T) {
	_, b := expertAdapter(t)
	for _, ex := range []Checkpoint{{Rank: exR, Family: "llama"}, {Rank: exR}} {
		rn, err := ToTinker(bytes.NewReader(b), int64(len(b)), ex)
		require.ErrorIs(t, err, ErrNoTinkerLayout)
		got, rerr := io.ReadAll(rn)
		require.NoError(t, rerr)
		require.Equal(t, b, got) // the original bytes
	}
	_, err := ToTinker(bytes.NewReader(b), int64(len(b)), Checkpoint{Rank: 5, Family: "qwen3_moe"})
	require.ErrorContains(t, err, "not a multiple of r=5")

	// Tinker-layout w1 and w3 with different lora_A: not Loops' gate_up_proj LoRA
	dir, b := expertAdapter(t)
	rn, err := ToTinker(bytes.NewReader(b), int64(len(b)), Checkpoint{Rank: exR, Family: "qwen3_moe"})
	require.NoError(t, err)
	out, err := io.ReadAll(rn)
	require.NoError(t, err)
	ts, _ := tensors(t, out)
	f, err := safetensors.Parse(bytes.NewReader(out), int64(len(out)), safetensors.Limits{})
	require.NoError(t, err)
	var w []safetensors.Tensor
	for k, v := range ts {
		d := make([]float32, len(v))
		for i := range v {
			d[i] = float32(v[i])
		}
		if k == exPre+".experts.w3.lora_A.weight" {
			d[0] += 1
		}
		w = append(w, safetensors.Tensor{Name: k, Shape: f.Tensors[k].Shape, Data: d})
	}
	_, err = safetensors.Write(filepath.Join(dir, peft.AdapterWeightsFile), w, nil)
	require.NoError(t, err)
	_, err = ToPEFT(dir, Base{Family: "qwen3_moe"})
	require.ErrorContains(t, err, "different lora_A")
	_, err = ToPEFT(dir, Base{Family: "llama"})
	require.ErrorContains(t, err, "not \"llama\"")
}

// TestNemotronEmptyW3: Tinker writes an empty w3 placeholder for Nemotron-H (its experts
// have no gate projection); the import skips it, and refuses a w3 that holds numbers.
func TestNemotronEmptyW3(t *testing.T) {
	dir, b := expertAdapter(t)
	rn, err := ToTinker(bytes.NewReader(b), int64(len(b)), Checkpoint{Rank: exR, Family: "nemotron_h"})
	require.NoError(t, err)
	out, err := io.ReadAll(rn)
	require.NoError(t, err)
	ts, _ := tensors(t, out)
	f, err := safetensors.Parse(bytes.NewReader(out), int64(len(out)), safetensors.Limits{})
	require.NoError(t, err)
	write := func(w3 []int64) {
		var w []safetensors.Tensor
		for k, v := range ts {
			d := make([]float32, len(v))
			for i := range v {
				d[i] = float32(v[i])
			}
			w = append(w, safetensors.Tensor{Name: k, Shape: f.Tensors[k].Shape, Data: d})
		}
		for _, fac := range []string{"A", "B"} {
			w = append(w, safetensors.Tensor{Name: exPre + ".experts.w3.lora_" + fac + ".weight", Shape: w3, Data: make([]float32, safetensors.Numel(w3))})
		}
		_, err := safetensors.Write(filepath.Join(dir, peft.AdapterWeightsFile), w, nil)
		require.NoError(t, err)
	}
	write([]int64{exE, 0, exH})
	changed, err := ToPEFT(dir, Base{Family: "nemotron_h"})
	require.NoError(t, err)
	require.True(t, changed)
	rb, err := os.ReadFile(filepath.Join(dir, peft.AdapterWeightsFile))
	require.NoError(t, err)
	got, _ := tensors(t, rb)
	want, _ := tensors(t, b)
	require.Equal(t, want, got)

	write([]int64{exE, exR, exH})
	_, err = ToPEFT(dir, Base{Family: "nemotron_h"})
	require.ErrorContains(t, err, "w3 must be empty")
}
