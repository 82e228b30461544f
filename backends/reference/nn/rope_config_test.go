package nn

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRopeConfigForms: the dense families' RoPE is read from transformers 5's
// rope_parameters as from the older rope_theta and rope_scaling (a config saved by
// transformers 5 has only rope_parameters: before, its base silently became 10000); the two
// must agree when both are given, and a scaling type the engine does not compute is refused.
func TestRopeConfigForms(t *testing.T) {
	read := func(extra string) (Config, error) {
		dir := t.TempDir()
		body := `{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
			"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32` + extra + `}`
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(body), 0o600))
		return ReadConfig(dir)
	}
	c, err := read(`, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}`)
	require.NoError(t, err)
	require.Equal(t, 1e6, c.RopeTheta)
	require.Nil(t, c.RopeScaling)

	c, err = read(`, "rope_theta": 500000`)
	require.NoError(t, err)
	require.Equal(t, 5e5, c.RopeTheta)

	c, err = read(`, "rope_parameters": {"rope_theta": 500000, "rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}`)
	require.NoError(t, err)
	require.Equal(t, 5e5, c.RopeTheta)
	require.Equal(t, RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 8192}, *c.RopeScaling)

	c, err = read(`, "rope_theta": 500000, "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}`)
	require.NoError(t, err)
	require.Equal(t, "llama3", c.RopeScaling.ropeType())

	_, err = read(`, "rope_theta": 10000, "rope_parameters": {"rope_theta": 1000000}`)
	require.ErrorContains(t, err, "disagree")
	_, err = read(`, "rope_parameters": {"rope_theta": 1000000, "rope_type": "yarn", "factor": 4}`)
	require.ErrorContains(t, err, `rope scaling type "yarn" is not computed by the reference engine`)
	_, err = read(`, "rope_scaling": {"rope_type": "linear", "factor": 2}`)
	require.ErrorContains(t, err, `"linear"`)
	_, err = read(`, "rope_parameters": {"rope_type": "llama3", "factor": 0.5}`)
	require.ErrorContains(t, err, "llama3 needs")
}
