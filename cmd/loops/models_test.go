package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestPrintModelsRenderer checks the FAMILY, PUBLISHER, MODALITIES, USE, AVAILABILITY and
// COOKBOOK RENDERER columns of `loops models`: loops/tiny takes qwen3_instruct (passed explicitly, with the hint how), a
// Hugging Face id the cookbook knows is looked up by name, a local folder takes its
// family's renderer when the backend names one, else its own chat template's.
func TestPrintModelsRenderer(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, printModels(&out, []*loopsv1.ModelInfo{
		{Name: "loops/tiny", Family: "qwen3", Publisher: "Qwen", Architecture: "Qwen3ForCausalLM", MaxSequenceLength: 512,
			VocabSize: 1024, MaxLoraRank: 64, Backend: "reference", Renderer: "qwen3_instruct", Modalities: []string{"text"},
			ParameterCount: 615000, WeightDtype: "float32", DevicesPerReplica: 1, DeviceMemoryBytes: 24 << 30,
			Trainable: true, Sampleable: true, Availability: []string{"serverless", "dedicated"}},
		{Name: "Qwen/Qwen3-0.6B", Architecture: "Qwen3ForCausalLM", Sampleable: true, Availability: []string{"serverless"}},
		{Name: "/data/models/my-llama", Architecture: "LlamaForCausalLM"},
		{Name: "/data/models/my-moe", Family: "qwen3_moe", Publisher: "Qwen", Architecture: "Qwen3MoeForCausalLM", Renderer: "qwen3", Backend: "torch",
			ParameterCount: 30_532_122_624, WeightDtype: "bfloat16", DeviceMemoryBytes: 80 << 30},
	}))
	lines := strings.Split(out.String(), "\n")
	require.Contains(t, lines[0], "FAMILY")
	require.Contains(t, lines[0], "COOKBOOK RENDERER")
	require.Contains(t, lines[0], "MODALITIES")
	require.Regexp(t, `^loops/tiny\s+qwen3\s+Qwen\s+Qwen3ForCausalLM\s+text\s+512\s+1024\s+64\s+train,sample\s+serverless,dedicated\s+0\.61M\s+float32\s+1 × 24 GiB\s+reference\s+qwen3_instruct$`, lines[1])
	require.Regexp(t, `^Qwen/Qwen3-0\.6B\s+-\s+-\s.*\ssample\s+serverless\s.*\(by model name\)$`, lines[2])
	require.Regexp(t, `^/data/models/my-llama\s.*\(its chat template's\)$`, lines[3])
	require.Regexp(t, `^/data/models/my-moe\s+qwen3_moe\s+Qwen\s.*30\.53B\s+bfloat16\s+none of 80 GiB\s+torch\s+qwen3$`, lines[4])
	require.Regexp(t, `^Qwen/Qwen3-0\.6B(\s+-){2}.*\s-\s+-\s+-\s+\(by model name\)$`, lines[2], "not planned")
	require.Contains(t, out.String(), "DEVICES/REPLICA: devices of that memory")
	require.Contains(t, out.String(), "model_name=loops/tiny renderer_name=qwen3_instruct")

	out.Reset()
	require.NoError(t, printModels(&out, []*loopsv1.ModelInfo{{Name: "Qwen/Qwen3-0.6B"}}))
	require.NotContains(t, out.String(), "renderer_name=", "no hint when no model needs one")
	require.NotContains(t, out.String(), "DEVICES/REPLICA:", "no note when no model is planned")
}
