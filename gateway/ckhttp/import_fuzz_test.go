package ckhttp

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends/peft"
)

// FuzzImportTar feeds arbitrary bodies to the import's reader, then the adapter config it
// took to peft.CheckConfig: every body is either taken (both adapter files, each within its
// cap, nothing else written) or refused with InvalidArgument (a 400), never a panic or a
// server error; and no entry writes more than the body holds.
func FuzzImportTar(f *testing.F) {
	tarOf := func(files map[string]string, pad int) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for name, data := range files {
			_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
			_, _ = tw.Write([]byte(data))
		}
		_ = tw.Close()
		b.Write(make([]byte, pad))
		return b.Bytes()
	}
	good := tarOf(map[string]string{
		"adapter_config.json":       `{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}`,
		"adapter_model.safetensors": "x",
	}, 0)
	f.Add(good)
	f.Add(tarOf(map[string]string{"adapter_config.json": `{"r": 4, "lora_alpha": 1e308, "target_modules": ["q_proj"]}`, "adapter_model.safetensors": "x"}, 0))
	f.Add(tarOf(map[string]string{"adapter_config.json": `{}`, "adapter_model.safetensors": "x", "evil.sh": "x"}, 0))
	f.Add(tarOf(map[string]string{"adapter_config.json": `{}`, "adapter_model.safetensors": "x"}, 10240-len(good)%10240))
	for _, name := range []string{"pax-sparse.tar", "gnu-sparse.tar"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("not a tar"))
	f.Add(good[:600])
	f.Fuzz(func(t *testing.T, body []byte) {
		dir := t.TempDir()
		err := untarAdapter(bytes.NewReader(body), dir)
		if err == nil {
			var cfg []byte
			cfg, err = os.ReadFile(filepath.Join(dir, peft.AdapterConfigFile))
			if err != nil {
				t.Fatalf("an accepted import has no config: %v", err)
			}
			if cerr := peft.CheckConfig(cfg); cerr != nil {
				err = invalidArgument("%v", cerr)
			}
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
		for _, e := range es {
			if fi, err := e.Info(); err != nil || fi.Size() > int64(len(body)) {
				t.Fatalf("%s holds more than the body: %v", e.Name(), fi)
			}
		}
	})
}
