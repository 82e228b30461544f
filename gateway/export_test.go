package gateway_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// writeQwen3Mini writes a Qwen3-shaped model with random weights from a fixed seed and an
// untied head (loops/tiny's is tied), with loops/tiny's tokenizer files, into dir.
func writeQwen3Mini(t *testing.T, dir, tinyDir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	cfg := nn.Config{
		Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3",
		Vocab: tiny.VocabLen, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Inter: 128,
		MaxPos: 512, RopeTheta: 1e6, Eps: 1e-6, Tied: false, HiddenAct: "silu", TorchDType: "float32",
	}
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.1, Seed: 20261203})
	require.NoError(t, err)
	require.NoError(t, nn.WriteConfig(dir, m.Cfg, map[string]any{"attention_bias": false, "use_cache": true}))
	_, err = safetensors.Write(filepath.Join(dir, "model.safetensors"), m.Tensors(), map[string]string{"format": "pt"})
	require.NoError(t, err)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(tinyDir, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
}

// fetchExport downloads a checkpoint's export over the loops.v1 route into dir.
func fetchExport(t *testing.T, url, key, path string, format loopsv1.ExportFormat, dir string) {
	t.Helper()
	cks := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(key))
	res, err := cks.GetCheckpointExportURL(t.Context(), &loopsv1.GetCheckpointExportURLRequest{Path: path, Format: format})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), "GET", url+res.GetUrl(), nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("export: %s: %s", resp.Status, b)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	tr := tar.NewReader(resp.Body)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Equal(t, filepath.Base(h.Name), h.Name)
		f, err := os.Create(filepath.Join(dir, h.Name))
		require.NoError(t, err)
		_, err = io.Copy(f, tr)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
}

// TestExport trains a step on loops/tiny (tied head) and on a Qwen3-shaped model with an
// untied head, adapting attention, MLP and the unembedding, and exports each checkpoint. The peft
// export is the adapter folder; the merged export loads as a model folder whose logits equal
// the base model's with the adapter (here with the engine's own loader; with
// LOOPS_TORCH_PYTHON set, with transformers + PEFT, within 1e-4 in float32).
func TestExport(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dataDir := t.TempDir()
	tinyDir := filepath.Join(dataDir, "models", "loops-tiny")
	require.NoError(t, tiny.Write(tinyDir))
	mini := filepath.Join(t.TempDir(), "qwen3-mini")
	writeQwen3Mini(t, mini, tinyDir)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b"})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dataDir, Keys: keys,
		BackendConfig: backends.Config{Models: []string{tiny.Name, mini}}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	url := "http://" + ln.Addr().String()
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := waiter(t, url, keyA)
	for _, tc := range []struct{ model, base string }{{tiny.Name, tinyDir}, {mini, mini}} {
		t.Run(filepath.Base(tc.model), func(t *testing.T) {
			run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
				BaseModel: tc.model, Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 3, TrainAttn: true, TrainMlp: true, TrainUnembed: true},
			}))).GetTrainingRun().GetId()
			in, tgt, w := tokens(16)
			for range 2 {
				wait(must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy",
					Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
						"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
						"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
					}}}})))
				wait(must(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 0.02}})))
			}
			path := wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "final",
				Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))).GetSaveWeights().GetPath()

			out := t.TempDir()
			peftDir, mergedDir := filepath.Join(out, "peft"), filepath.Join(out, "merged")
			fetchExport(t, url, keyA, path, loopsv1.ExportFormat_EXPORT_FORMAT_PEFT, peftDir)
			fetchExport(t, url, keyA, path, loopsv1.ExportFormat_EXPORT_FORMAT_MERGED, mergedDir)
			names := func(dir string) []string {
				es, err := os.ReadDir(dir)
				require.NoError(t, err)
				var out []string
				for _, e := range es {
					out = append(out, e.Name())
				}
				return out
			}
			require.ElementsMatch(t, []string{"adapter_config.json", "adapter_model.safetensors"}, names(peftDir))
			require.Subset(t, names(mergedDir), []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
			var cfg map[string]any
			b, err := os.ReadFile(filepath.Join(mergedDir, "config.json"))
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &cfg))
			// a tied model's unembedding LoRA adapts the shared matrix: the merged model stays tied
			require.Equal(t, tc.model == tiny.Name, cfg["tie_word_embeddings"])
			if tc.model == tiny.Name {
				pc, err := peft.ReadConfig(peftDir)
				require.NoError(t, err)
				require.True(t, pc.EnsureWeightTying, "the PEFT export says so as PEFT does")
			}
			require.Equal(t, "float32", cfg["torch_dtype"])

			// The engine's own loader: merged logits = base + adapter logits.
			base, err := nn.Load[float64](tc.base)
			require.NoError(t, err)
			ad, err := nn.LoadAdapter(peftDir, base, false, 64)
			require.NoError(t, err)
			merged, err := nn.Load[float64](mergedDir)
			require.NoError(t, err)
			toks := []int{3, 14, 15, 92, 65, 35, 89, 79}
			pos := []int{0, 1, 2, 3, 4, 5, 6, 7}
			c1, c2 := make([]*nn.KVCache[float64], len(toks)), make([]*nn.KVCache[float64], len(toks))
			k1, k2 := base.NewCache(), merged.NewCache()
			for i := range toks {
				c1[i], c2[i] = k1, k2
			}
			want := base.Logits(base.Step(toks, pos, c1, ad), len(toks), ad)
			got := merged.Logits(merged.Step(toks, pos, c2, nil), len(toks), nil)
			require.InDeltaSlice(t, want, got, 1e-5)

			if py := os.Getenv("LOOPS_TORCH_PYTHON"); py != "" {
				cmd := exec.CommandContext(ctx, py, "testdata/export_compare.py", tc.base, peftDir, mergedDir)
				cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
				outb, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", outb)
				t.Logf("transformers + PEFT vs merged (%s): %s", tc.model, outb)
			}
		})
	}

	// Another workspace: the checkpoint is not theirs.
	cks := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(keyB))
	list := must(loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(keyA)).ListCheckpoints(ctx, &loopsv1.ListCheckpointsRequest{}))
	require.NotEmpty(t, list.GetCheckpoints())
	_, err = cks.GetCheckpointExportURL(ctx, &loopsv1.GetCheckpointExportURLRequest{Path: list.GetCheckpoints()[0].GetTinkerPath(), Format: loopsv1.ExportFormat_EXPORT_FORMAT_MERGED})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = cks.GetCheckpointExportURL(ctx, &loopsv1.GetCheckpointExportURLRequest{Path: list.GetCheckpoints()[0].GetTinkerPath()})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "a format is required")
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/checkpoint_exports?format=merged&path="+list.GetCheckpoints()[0].GetTinkerPath(), nil)
	req.Header.Set("X-API-Key", keyB)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}
