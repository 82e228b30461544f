package core

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
)

// FuzzImportTar feeds arbitrary bodies to the import's reader: every body is either taken
// (both adapter files, each within its cap, nothing else written) or refused with a 4xx,
// never a panic or a server error; the adapter config rewrite refuses what is not a JSON
// object the same way.
func FuzzImportTar(f *testing.F) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, data := range map[string]string{"adapter_config.json": `{"r": 4, "peft_type": "LORA"}`, "adapter_model.safetensors": "x"} {
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(data))
	}
	_ = tw.Close()
	f.Add(b.Bytes())
	f.Add([]byte("not a tar"))
	f.Add(b.Bytes()[:600])
	f.Fuzz(func(t *testing.T, body []byte) {
		dir := t.TempDir()
		err := untarAdapter(bytes.NewReader(body), dir)
		if err == nil {
			err = setAdapterBase(dir, "loops/tiny")
		}
		if err != nil {
			if c := connect.CodeOf(err); c != connect.CodeInvalidArgument {
				t.Fatalf("refused with %v, want InvalidArgument: %v", c, err)
			}
			return
		}
		es, _ := os.ReadDir(dir)
		if len(es) != 2 {
			t.Fatalf("an accepted import wrote %d files", len(es))
		}
		cfg, _ := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
		var m map[string]any
		if json.Unmarshal(cfg, &m) != nil || m["base_model_name_or_path"] != "loops/tiny" {
			t.Fatalf("the rewritten config does not name the base model: %s", cfg)
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
