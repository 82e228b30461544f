package gateway_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// tarOf returns a tar of the named files' contents.
func tarOf(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, data := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}))
		_, err := tw.Write(data)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

// adapterFiles reads an adapter folder's two files.
func adapterFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		out[f] = b
	}
	return out
}

// importTar posts an import and returns the status and body.
func importTar(t *testing.T, url, key, base, name string, body []byte) (int, []byte) {
	t.Helper()
	q := neturl.Values{"base_model": {base}, "name": {name}}
	req, err := http.NewRequestWithContext(t.Context(), "POST", url+"/v1/checkpoint_imports?"+q.Encode(), bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// TestImport: a PEFT adapter folder uploaded over the import route becomes a checkpoint of
// the workspace that samples, deploys and starts a training run; bad folders get 400s that
// name the mismatch. With LOOPS_TORCH_PYTHON set, the adapter is one PEFT wrote in Python
// (fixed seed), and sampling it through the OpenAI route gives PEFT's greedy continuation,
// and the engine's prompt logprobs are PEFT's within 1e-4.
func TestImport(t *testing.T) {
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

	// The adapter: PEFT's in Python when a torch venv is given, else one the engine writes.
	adapterDir := filepath.Join(t.TempDir(), "adapter")
	prompt := []int{72, 101, 108, 108, 111, 32, 119}
	var peftOut struct {
		Generated      []int      `json:"generated"`
		Sequence       []int32    `json:"sequence"`
		PromptLogprobs []*float64 `json:"prompt_logprobs"`
	}
	py := os.Getenv("LOOPS_TORCH_PYTHON")
	if py != "" {
		pj, _ := json.Marshal(prompt)
		cmd := exec.CommandContext(ctx, py, "testdata/peft_adapter.py", tinyDir, adapterDir, string(pj), "8")
		cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "%s", stderr.String())
		require.NoError(t, json.Unmarshal(out, &peftOut), "%s", out)
	} else {
		m, err := nn.Load[float32](tinyDir)
		require.NoError(t, err)
		a, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 4, Seed: 9, Attn: true})
		require.NoError(t, err)
		_, err = nn.SaveAdapter(adapterDir, a, tiny.Name, false)
		require.NoError(t, err)
	}
	files := adapterFiles(t, adapterDir)

	// Bad imports: each a 400 (or 413) that says what is wrong.
	cfg := map[string]any{}
	require.NoError(t, json.Unmarshal(files["adapter_config.json"], &cfg))
	bigRank := map[string]any{}
	for k, v := range cfg {
		bigRank[k] = v
	}
	bigRank["r"] = 4096
	bigRankJSON, _ := json.Marshal(bigRank)
	for name, tc := range map[string]struct {
		base string
		body []byte
		want string
	}{
		"no base":        {"", tarOf(t, files), "base_model"},
		"unknown base":   {"no/such", tarOf(t, files), "no/such"},
		"other base":     {mini, tarOf(t, files), "does not fit base model"},
		"missing file":   {tiny.Name, tarOf(t, map[string][]byte{"adapter_config.json": files["adapter_config.json"]}), "adapter_model.safetensors"},
		"extra file":     {tiny.Name, tarOf(t, map[string][]byte{"adapter_config.json": files["adapter_config.json"], "adapter_model.safetensors": files["adapter_model.safetensors"], "evil.sh": []byte("x")}), "evil.sh"},
		"not a tar":      {tiny.Name, []byte("{}"), "tar"},
		"rank too big":   {tiny.Name, tarOf(t, map[string][]byte{"adapter_config.json": bigRankJSON, "adapter_model.safetensors": files["adapter_model.safetensors"]}), "r = 4096"},
		"bad safetensor": {tiny.Name, tarOf(t, map[string][]byte{"adapter_config.json": files["adapter_config.json"], "adapter_model.safetensors": []byte("12345678garbage")}), "adapter_model.safetensors"},
	} {
		st, body := importTar(t, url, keyA, tc.base, "bad", tc.body)
		require.True(t, st == 400 || st == 404, "%s: %d %s", name, st, body)
		require.Contains(t, string(body), tc.want, name)
	}

	st, body := importTar(t, url, keyA, tiny.Name, "ext", tarOf(t, files))
	require.Equal(t, 200, st, "%s", body)
	var ck loopsv1.Checkpoint
	require.NoError(t, protojson.Unmarshal(body, &ck))
	require.True(t, strings.HasPrefix(ck.GetTinkerPath(), "tinker://"), ck.GetTinkerPath())
	require.Contains(t, ck.GetTinkerPath(), "/weights/ext")
	require.Equal(t, tiny.Name, ck.GetBaseModel())
	require.EqualValues(t, 4, ck.GetLora().GetRank())

	// The checkpoint is the workspace's: listed, and not another's.
	cks := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(keyA))
	_, err = cks.GetCheckpoint(ctx, &loopsv1.GetCheckpointRequest{Path: ck.GetTinkerPath()})
	require.NoError(t, err)
	_, err = loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(keyB)).GetCheckpoint(ctx, &loopsv1.GetCheckpointRequest{Path: ck.GetTinkerPath()})
	require.Error(t, err)

	// Sampled through the OpenAI route, and deployed.
	complete := func(model string) map[string]any {
		raw, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0})
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/oai/api/v1/completions", bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+keyA)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, 200, resp.StatusCode, "%s", b)
		require.NoError(t, json.Unmarshal(b, &out))
		return out
	}
	viaPath := completeText(complete(ck.GetTinkerPath()))
	_, err = loopsv1connect.NewDeploymentServiceClient(http.DefaultClient, url, withKey(keyA)).CreateDeployment(ctx,
		&loopsv1.CreateDeploymentRequest{Name: "imported", Checkpoints: []string{ck.GetTinkerPath()}})
	require.NoError(t, err)
	require.Equal(t, viaPath, completeText(complete("imported")))

	// A training run starts from it.
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	op := must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: ck.GetTinkerPath()}))
	for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
		op = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
	}
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())

	if py == "" {
		return
	}
	// PEFT's greedy continuation, as text, is the OpenAI route's (and not the base model's).
	require.NotEqual(t, completeText(complete(tiny.Name)), viaPath, "the adapter changes the output")
	tok := tiny.Tokenizer()
	require.Equal(t, tok.Decode(peftOut.Generated), viaPath, "PEFT generated %v", peftOut.Generated)
	// The engine's log-probabilities of PEFT's sequence are PEFT's.
	sampling := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyA))
	smp := must(sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{ModelPath: ck.GetTinkerPath()}))
	sop := must(sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: peftOut.Sequence, NumSamples: 1,
		PromptLogprobs: true, Params: &loopsv1.SamplingParams{MaxTokens: 1}}))
	for sop.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && sop.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
		sop = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: sop.GetId(), Timeout: durationpb.New(10 * time.Second)}))
	}
	got := sop.GetSample().GetPromptLogprobs()
	require.Len(t, got, len(peftOut.Sequence))
	worst := 0.0
	for i := 1; i < len(got); i++ {
		worst = math.Max(worst, math.Abs(float64(got[i])-*peftOut.PromptLogprobs[i]))
	}
	t.Logf("imported PEFT adapter: greedy %q; max |logprob(engine) - logprob(PEFT)| = %.2g over %d tokens", viaPath, worst, len(got)-1)
	require.Less(t, worst, 1e-4)
}

func completeText(body map[string]any) string {
	return body["choices"].([]any)[0].(map[string]any)["text"].(string)
}

// TestImportRefusesConfigsItCannotHonour: every numeric field of adapter_config.json is
// range-checked, and a PEFT option whose non-default value changes the adapter's math is
// refused with the reason, each a 400 naming the field, never taken and ignored.
func TestImportRefusesConfigsItCannotHonour(t *testing.T) {
	dataDir := t.TempDir()
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.DataDir = dataDir })
	files := tinyAdapter(t, dataDir)
	with := func(field string, v any) []byte {
		cfg := map[string]any{}
		require.NoError(t, json.Unmarshal(files["adapter_config.json"], &cfg))
		cfg[field] = v
		b, err := json.Marshal(cfg)
		require.NoError(t, err)
		return tarOf(t, map[string][]byte{"adapter_config.json": b, "adapter_model.safetensors": files["adapter_model.safetensors"]})
	}
	for _, tc := range []struct {
		field string
		value any
		want  string
	}{
		{"lora_alpha", 1e308, "lora_alpha"},
		{"lora_alpha", -1, "lora_alpha"},
		{"lora_dropout", 1.5, "lora_dropout"},
		{"lora_dropout", -0.1, "lora_dropout"},
		{"r", 4.5, "r"},
		{"r", 1 << 40, "r"},
		{"fan_in_fan_out", true, "fan_in_fan_out"},
		{"bias", "all", "bias"},
		{"bias", "lora_only", "bias"},
		{"layers_to_transform", []int{0, 1}, "layers_to_transform"},
		{"layers_pattern", "layers", "layers_pattern"},
		{"use_dora", true, "use_dora"},
		{"use_rslora", true, "use_rslora"},
		{"lora_bias", true, "lora_bias"},
		{"layer_replication", [][]int{{0, 2}}, "layer_replication"},
		{"trainable_token_indices", []int{3}, "trainable_token_indices"},
		{"alpha_pattern", map[string]any{"q_proj": 64}, "alpha_pattern"},
		{"megatron_config", map[string]any{"x": 1}, "megatron_config"},
		{"some_future_option", 3, "some_future_option"},
	} {
		st, body := importTar(t, url, keyA, tiny.Name, "bad", with(tc.field, tc.value))
		require.Equal(t, http.StatusBadRequest, st, "%s=%v: %s", tc.field, tc.value, body)
		require.Contains(t, string(body), tc.want, "%s=%v", tc.field, tc.value)
	}
	// Default values of the same options, and PEFT's own metadata, are taken.
	for field, v := range map[string]any{"fan_in_fan_out": false, "bias": "none", "layers_to_transform": nil,
		"lora_dropout": 0.05, "peft_version": "0.21.2", "revision": nil, "use_dora": false, "lora_bias": false,
		"exclude_modules": nil, "megatron_core": "megatron.core", "loftq_config": map[string]any{}} {
		st, body := importTar(t, url, keyA, tiny.Name, "ok", with(field, v))
		require.Equal(t, http.StatusOK, st, "%s=%v: %s", field, v, body)
	}
}
