package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestPrintModelsRenderer checks the COOKBOOK RENDERER column of `loops models`: loops/tiny
// takes qwen3_instruct (passed explicitly, with the hint how), a Hugging Face id the cookbook
// knows is looked up by name, and a local folder takes its own chat template's renderer.
func TestPrintModelsRenderer(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, printModels(&out, []*loopsv1.ModelInfo{
		{Name: "loops/tiny", Architecture: "Qwen3ForCausalLM", MaxSequenceLength: 512, VocabSize: 1024, MaxLoraRank: 64, Backend: "reference"},
		{Name: "Qwen/Qwen3-0.6B", Architecture: "Qwen3ForCausalLM"},
		{Name: "/data/models/my-llama", Architecture: "LlamaForCausalLM"},
	}))
	lines := strings.Split(out.String(), "\n")
	require.Contains(t, lines[0], "COOKBOOK RENDERER")
	require.Regexp(t, `^loops/tiny\s+Qwen3ForCausalLM\s+512\s+1024\s+64\s+reference\s+qwen3_instruct$`, lines[1])
	require.Regexp(t, `^Qwen/Qwen3-0\.6B\s.*\(by model name\)$`, lines[2])
	require.Regexp(t, `^/data/models/my-llama\s.*\(its chat template's\)$`, lines[3])
	require.Contains(t, out.String(), "model_name=loops/tiny renderer_name=qwen3_instruct")

	out.Reset()
	require.NoError(t, printModels(&out, []*loopsv1.ModelInfo{{Name: "Qwen/Qwen3-0.6B"}}))
	require.NotContains(t, out.String(), "renderer_name=", "no hint when no model needs one")
}
