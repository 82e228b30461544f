package peft

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// written is an adapter_config.json as PEFT 0.21 writes it (every field, at its defaults
// but r, lora_alpha, lora_dropout and target_modules).
const written = `{
  "alora_invocation_tokens": null, "alpha_pattern": {}, "arrow_config": null,
  "auto_mapping": null, "base_model_name_or_path": "Qwen/Qwen3-0.6B", "bias": "none",
  "corda_config": null, "ensure_weight_tying": false, "eva_config": null,
  "exclude_modules": null, "fan_in_fan_out": false, "inference_mode": true,
  "init_lora_weights": true, "kasa_config": null, "layer_replication": null,
  "layers_pattern": null, "layers_to_transform": null, "loftq_config": {},
  "lora_alpha": 16, "lora_bias": false, "lora_dropout": 0.05, "lora_ga_config": null,
  "megatron_config": null, "megatron_core": "megatron.core", "modules_to_save": null,
  "monteclora_config": null, "peft_type": "LORA", "peft_version": "0.21.2",
  "qalora_group_size": 16, "r": 8, "rank_pattern": {}, "revision": null,
  "target_modules": ["q_proj", "v_proj"], "target_parameters": null, "task_type": "CAUSAL_LM",
  "trainable_token_indices": null, "use_bdlora": null, "use_dora": false, "use_qalora": false,
  "use_rslora": false, "velora_config": null
}`

func with(t *testing.T, field string, v any) []byte {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(written), &m))
	if v == nil {
		delete(m, field)
	} else {
		m[field] = v
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

func TestCheckConfigTakesWhatPEFTWrites(t *testing.T) {
	require.NoError(t, CheckConfig([]byte(written)))
	require.NoError(t, CheckConfig([]byte(`{"r": 4, "lora_alpha": 32, "target_modules": ["q_proj"]}`)))
	// a MoE adapter as PEFT writes it: the experts' fused parameters by name (the backend
	// checks them against its model)
	require.NoError(t, CheckConfig(with(t, "target_parameters", []any{"gate_up_proj", "down_proj"})))
	for _, init := range []any{false, "gaussian", "eva", "orthogonal", "MiCA"} {
		require.NoError(t, CheckConfig(with(t, "init_lora_weights", init)), "%v", init)
	}
}

func TestCheckConfigRefusesWithTheReason(t *testing.T) {
	for _, tc := range []struct {
		field string
		value any
		want  string
	}{
		{"r", 0, "integer from 1 to 65536"},
		{"r", 8.5, "integer from 1"},
		{"r", "8", "integer from 1"},
		{"r", 1e20, "integer from 1"},
		{"lora_alpha", 1e308, "at most 65536"},
		{"lora_alpha", 0, "above 0"},
		{"lora_alpha", "16", "above 0"},
		{"lora_dropout", 1, "below 1"},
		{"qalora_group_size", 0, "integer from 1"},
		{"fan_in_fan_out", true, "transposed"},
		{"bias", "all", `only "none"`},
		{"layers_to_transform", 3, "every layer"},
		{"layers_to_transform", []int{0}, "every layer"},
		{"use_rslora", true, "sqrt(r)"},
		{"init_lora_weights", "pissa_niter_4", "rewrites the base model's weights"},
		{"init_lora_weights", "loftq", "rewrites the base model's weights"},
		{"init_lora_weights", 3, "not an initialization"},
		{"target_modules", "all-linear", "list of module names"},
		{"target_modules", []any{1}, "list of module names"},
		{"target_parameters", "experts.*", "list of parameter names"},
		{"target_parameters", []any{2}, "list of parameter names"},
		{"peft_type", "LOHA", "only LoRA"},
		{"inference_mode", "yes", "true or false"},
		{"a_future_option", []int{1}, "does not know this option"},
		{"lora_alpha", nil, "has no lora_alpha"},
		{"r", nil, "has no r"},
	} {
		err := CheckConfig(with(t, tc.field, tc.value))
		require.Error(t, err, "%s=%v", tc.field, tc.value)
		require.ErrorContains(t, err, tc.want, "%s=%v", tc.field, tc.value)
		if tc.value != nil {
			require.ErrorContains(t, err, `"`+tc.field+`"`)
		}
	}
	require.NoError(t, CheckConfig(with(t, "a_future_option", false)), "an unknown field at an empty value is taken")
	for _, bad := range []string{``, `[]`, `null`, `{"r": 4} {}`, `{"r": 4`, strings.Repeat(" ", MaxConfigBytes+1)} {
		require.Error(t, CheckConfig([]byte(bad)), "%q", bad)
	}
	err := CheckConfig(with(t, strings.Repeat("x", 200), 1))
	require.Less(t, len(err.Error()), 400, "a long field name is clipped")
}
