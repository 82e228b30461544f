package reference

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// writeMoEFolder writes a tiny random Qwen3-MoE model (loops/tiny's tokenizer) into dir.
func writeMoEFolder(t *testing.T, dir string) {
	cfg := tiny.Config()
	cfg.ModelType, cfg.Architectures, cfg.Layers = "qwen3_moe", []string{"Qwen3MoeForCausalLM"}, 2
	cfg.NumExperts, cfg.TopK, cfg.MoEInter, cfg.NormTopK = 4, 2, 32, true
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.05, Seed: 27})
	require.NoError(t, err)
	require.NoError(t, nn.WriteConfig(dir, m.Cfg, map[string]any{"eos_token_id": 0}))
	_, err = safetensors.Write(filepath.Join(dir, "model.safetensors"), m.Tensors(), map[string]string{"format": "pt"})
	require.NoError(t, err)
	require.NoError(t, tiny.Tokenizer().WriteHF(dir, tiny.EOS, cfg.MaxPos, ""))
}

// TestQwen3MoeServed: the engine serves a qwen3_moe folder (what `loops serve --model DIR`
// starts), reports it as the qwen3_moe family with its expert LoRA targets, and trains,
// saves, samples with and merges an adapter on it.
func TestQwen3MoeServed(t *testing.T) {
	dir := t.TempDir()
	writeMoEFolder(t, dir)
	e, err := New(Options{DataDir: t.TempDir(), Models: []string{dir}, MaxLoraRank: 8})
	require.NoError(t, err)
	defer e.Close()
	caps, err := e.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	info := caps.Models[0]
	require.Equal(t, "qwen3_moe", info.Family)
	require.Equal(t, []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}, info.LoraTargets)

	_, err = e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "moe", BaseModel: info.Name,
		Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMlp: true, TrainUnembed: true}})
	require.NoError(t, err)
	item := &backendv1.ForwardBackwardItem{AdapterId: "moe", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}}
	var losses []float64
	for range 4 {
		losses = append(losses, fb(t, e, item).Metrics["loss:sum"])
		_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "moe", Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}})
		require.NoError(t, err)
	}
	require.Less(t, losses[3], losses[0], "the loss falls: %v", losses)

	ckpt := t.TempDir()
	_, err = e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "moe", Dir: ckpt})
	require.NoError(t, err)
	r, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: info.Name, AdapterDir: ckpt, Prompt: toks32(seqA[:6]), NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 5, Temperature: 1, TopP: 1, Seed: seedp(3)}})
	require.NoError(t, err)
	require.Len(t, r.Result.Sequences, 2)
	require.Len(t, r.Result.Sequences[0].Tokens, 5)

	// the saved adapter (PEFT's layout: experts by target_parameters) passes the import
	// checks a PEFT adapter of this model passes: adapter_config.json, then the engine's
	cfg, err := os.ReadFile(filepath.Join(ckpt, peft.AdapterConfigFile))
	require.NoError(t, err)
	require.Contains(t, string(cfg), "target_parameters")
	require.NoError(t, peft.CheckConfig(cfg))
	_, err = e.CheckAdapter(ctx, info.Name, ckpt)
	require.NoError(t, err)

	out := t.TempDir()
	_, err = e.MergeAdapter(ctx, backends.MergeRequest{BaseModel: info.Name, AdapterDir: ckpt, OutDir: out})
	require.NoError(t, err)
	merged, err := nn.Load[float32](out)
	require.NoError(t, err)
	require.NotNil(t, merged.Layers[0].MoE)
}
