package gateway_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestImportTinkerLayout: one adapter with an unembedding LoRA, written by hand in three
// layouts — PEFT's (lm_head), Tinker's (model.unembed_tokens, as `tinker checkpoint
// download` writes it) and the cookbook's build_lora_adapter output for a tied model
// (model.embed_tokens with lora_A/lora_B) — imports in each, and the three checkpoints give
// the same prompt log-probs, bit for bit; a merged model folder is refused with what to
// send instead.
func TestImportTinkerLayout(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dataDir := t.TempDir()
	tinyDir := filepath.Join(dataDir, "models", "loops-tiny")
	require.NoError(t, tiny.Write(tinyDir))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dataDir, Keys: keys,
		BackendConfig: backends.Config{Models: []string{tiny.Name}}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	url := "http://" + ln.Addr().String()
	ctx := t.Context()

	// The adapter: q_proj and the head, values from a fixed pattern (B nonzero).
	m, err := nn.Load[float32](tinyDir)
	require.NoError(t, err)
	a, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 2, Seed: 3, Attn: true, Unembed: true})
	require.NoError(t, err)
	write := func(head string, tying bool) map[string][]byte {
		dir := t.TempDir()
		var ts []safetensors.Tensor
		for i, p := range a.Params {
			d := make([]float32, len(p.W))
			for j := range d {
				d[j] = float32(p.W[j])
				if strings.Contains(p.Name, "lora_B") {
					d[j] = float32((i*7+j)%13-6) * 0.01
				}
			}
			name := strings.Replace(p.Name, "base_model.model.lm_head.", head+".", 1)
			ts = append(ts, safetensors.Tensor{Name: name, Shape: []int64{int64(p.Shape[0]), int64(p.Shape[1])}, Data: d})
		}
		_, err := safetensors.Write(filepath.Join(dir, "adapter_model.safetensors"), ts, nil)
		require.NoError(t, err)
		mod := head[strings.LastIndex(head, ".")+1:]
		c := map[string]any{"peft_type": "LORA", "r": 2, "lora_alpha": 32, "task_type": "CAUSAL_LM",
			"target_modules": []string{"q_proj", "k_proj", "v_proj", "o_proj", mod}}
		if tying {
			c["ensure_weight_tying"] = true
		}
		cfg, _ := json.Marshal(c)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), cfg, 0o644))
		return adapterFiles(t, dir)
	}
	sampling := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	prompt := []int32{72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}
	logprobs := func(req *loopsv1.CreateSamplerRequest) []float32 {
		smp := must(sampling.CreateSampler(ctx, req))
		op := must(sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: prompt, NumSamples: 1,
			PromptLogprobs: true, Params: &loopsv1.SamplingParams{MaxTokens: 1}}))
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op.GetSample().GetPromptLogprobs()[1:]
	}
	// loops/tiny is tied: Tinker's unembedding (and the cookbook's embed_tokens form of it)
	// adapts the shared matrix, which PEFT's layout says with ensure_weight_tying.
	var want []float32
	for _, head := range []string{"base_model.model.lm_head", "base_model.model.model.unembed_tokens", "base_model.model.model.embed_tokens"} {
		st, body := importTar(t, url, keyA, tiny.Name, "l"+head[len(head)-6:], tarOf(t, write(head, head == "base_model.model.lm_head")))
		require.Equal(t, 200, st, "%s: %s", head, body)
		var ck loopsv1.Checkpoint
		require.NoError(t, protojson.Unmarshal(body, &ck))
		require.True(t, ck.GetLora().GetTrainUnembed(), head)
		got := logprobs(&loopsv1.CreateSamplerRequest{ModelPath: ck.GetTinkerPath()})
		if want == nil {
			want = got
			continue
		}
		require.Equal(t, want, got, head)
	}
	base := logprobs(&loopsv1.CreateSamplerRequest{BaseModel: tiny.Name})
	require.NotEqual(t, base, want, "the adapter moves the log-probs")
	// a PEFT adapter without ensure_weight_tying adapts the head alone, as PEFT applies it
	st, body := importTar(t, url, keyA, tiny.Name, "head-only", tarOf(t, write("base_model.model.lm_head", false)))
	require.Equal(t, 200, st, "%s", body)
	var ck loopsv1.Checkpoint
	require.NoError(t, protojson.Unmarshal(body, &ck))
	headOnly := logprobs(&loopsv1.CreateSamplerRequest{ModelPath: ck.GetTinkerPath()})
	require.NotEqual(t, want, headOnly)
	require.NotEqual(t, base, headOnly)

	st, body = importTar(t, url, keyA, tiny.Name, "merged", tarOf(t, map[string][]byte{"config.json": []byte("{}"), "model.safetensors": []byte("x")}))
	require.Equal(t, 400, st)
	require.Contains(t, string(body), "a merged model is not an adapter")
}
