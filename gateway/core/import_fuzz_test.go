package core

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"connectrpc.com/connect"
)

// FuzzImportConfig feeds arbitrary adapter_config.json bytes to the import's config
// check: every config is either taken, rewritten to name the base model with every other
// field kept, or refused with InvalidArgument (a 400), never a panic or a server error.
func FuzzImportConfig(f *testing.F) {
	for _, s := range []string{
		`{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}`,
		`{"r": 4, "lora_alpha": 1e308, "target_modules": ["q_proj"]}`,
		`{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "fan_in_fan_out": true}`,
		`{"r": 4.5}`, `[]`, `null`, `{"r": 4} {}`, `not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, cfg []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := checkImportedConfig(dir, "loops/tiny"); err != nil {
			if c := connect.CodeOf(err); c != connect.CodeInvalidArgument {
				t.Fatalf("refused with %v, want InvalidArgument: %v", c, err)
			}
			return
		}
		var before, after map[string]any
		if err := json.Unmarshal(cfg, &before); err != nil {
			t.Fatalf("took a config that is not a JSON object: %q", cfg)
		}
		out, _ := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
		if err := json.Unmarshal(out, &after); err != nil || after["base_model_name_or_path"] != "loops/tiny" {
			t.Fatalf("the rewritten config does not name the base model: %s", out)
		}
		delete(before, "base_model_name_or_path")
		delete(after, "base_model_name_or_path")
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("the rewrite changed other fields: %s -> %s", cfg, out)
		}
	})
}

// FuzzParseDeploymentRef: any model string parses to a valid reference whose canonical
// string parses back to itself, or is refused with InvalidArgument.
func FuzzParseDeploymentRef(f *testing.F) {
	for _, s := range []string{"dep", "dep/c1", "ws-a:dep/c1", ":x", "a:b:c", "x/", "Qwen/Qwen3-8B", "-x", "a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseDeploymentRef("ws-self", s)
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		back, err := ParseDeploymentRef("other", r.String())
		if err != nil || back != r {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, r, r.String(), back, err)
		}
	})
}
