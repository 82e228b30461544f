package gateway_test

import (
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
)

// pic is a 24×16 grey PNG.
const pic = "iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII="

// TestModalityPolicy: a workspace whose policy's allowed_modalities leaves out image gets a
// 403 naming the policy key for an image on every surface (Tinker routes, loops.v1, OpenAI,
// Anthropic), before anything else is checked: the served model (loops/tiny, the reference
// engine) takes text only, so another workspace's same requests get past the policy to the
// model's own 400. The catalog shows each workspace its allowed modalities and the
// availability, trainable and sampleable fields on every catalog surface.
func TestModalityPolicy(t *testing.T) {
	const keyText, keyAny, keyPooled = "tml-mod-text", "tml-mod-any", "tml-mod-pooled"
	dir := t.TempDir()
	pol, err := policy.Parse([]byte(`
workspaces:
  texty:
    allowed_modalities: [text]
  pooled:
    dedicated: always
`))
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyText + "=texty", keyAny + "=anyone", keyPooled + "=pooled"})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: dir, Keys: keys}
	cfg.BackendConfig.Models = []string{"loops/tiny"}
	cfg.Core.Policy = pol
	srv, err := gateway.New(t.Context(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	url := "http://" + ln.Addr().String()
	ctx := t.Context()
	data, err := base64.StdEncoding.DecodeString(pic)
	require.NoError(t, err)

	// The workspace shows the modalities it may send: its policy's, or every one.
	for key, want := range map[string][]string{keyText: {policy.ModalityText}, keyAny: policy.Modalities} {
		ws := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(key)).GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{}))
		require.Equal(t, want, ws.GetLimits().GetAllowedModalities(), key)
	}

	// The catalog, on each surface.
	m := must(loopsv1connect.NewModelServiceClient(http.DefaultClient, url, withKey(keyAny)).ListModels(ctx, &loopsv1.ListModelsRequest{})).GetModels()[0]
	require.True(t, m.GetTrainable())
	require.True(t, m.GetSampleable())
	require.Equal(t, []string{policy.AvailabilityServerless}, m.GetAvailability(), "the reference engine has no dedicated pools")
	require.Equal(t, "reference", m.GetBackend())
	code, body := call(t, url, "/api/v1/get_server_capabilities", keyAny, nil)
	require.Equal(t, http.StatusOK, code, body)
	sm := body["supported_models"].([]any)[0].(map[string]any)
	for k, v := range map[string]any{"model_name": "loops/tiny", "trainable": true, "sampleable": true, "backend": "reference",
		"availability": []any{"serverless"}, "modalities": []any{"text"}, "family": m.GetFamily(),
		"max_sequence_length": float64(m.GetMaxSequenceLength()), "max_lora_rank": float64(m.GetMaxLoraRank())} {
		require.Equal(t, v, sm[k], k)
	}
	code, body = call(t, url, "/oai/api/v1/models", keyAny, nil)
	require.Equal(t, http.StatusOK, code, body)
	om := body["data"].([]any)[0].(map[string]any)
	for k, v := range map[string]any{"id": "loops/tiny", "object": "model", "owned_by": "loops", "trainable": true, "sampleable": true,
		"backend": "reference", "availability": []any{"serverless"}, "modalities": []any{"text"},
		"max_sequence_length": float64(m.GetMaxSequenceLength()), "max_lora_rank": float64(m.GetMaxLoraRank())} {
		require.Equal(t, v, om[k], k)
	}
	code, body = call(t, url, "/oai/api/v1/models/loops/tiny", keyAny, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []any{"text"}, body["modalities"])

	// Image input from the workspace whose policy denies it: 403 naming allowed_modalities,
	// on every surface. From another workspace: past the policy, the model's own 400.
	const deny = `may not send image input`
	const how = `allowed_modalities in its workspace policy): send text input only, or ask an operator to add image to allowed_modalities`
	const model = "model loops/tiny takes [text] input only, not images"
	for _, c := range []struct {
		key    string
		code   connect.Code
		status int
		msg    string
	}{{keyText, connect.CodePermissionDenied, http.StatusForbidden, deny}, {keyAny, connect.CodeInvalidArgument, http.StatusBadRequest, model}} {
		train := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(c.key))
		samp := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(c.key))
		run := waiter(t, url, c.key)(must(train.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}}))).GetTrainingRun().GetId()
		sampler := must(samp.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{BaseModel: "loops/tiny"})).GetId()
		img := &loopsv1.Image{Data: data, Format: "png", Offset: 4, Tokens: 4, Width: 24, Height: 16}

		// loops.v1: Sample and ForwardBackward.
		_, err := samp.Sample(ctx, &loopsv1.SampleRequest{SamplerId: sampler, Prompt: []int32{1, 2, 3, 4, 0, 0, 0, 0}, PromptImages: []*loopsv1.Image{img},
			NumSamples: 1, Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1, TopP: 1}})
		requireCode(t, err, c.code, c.msg)
		d := datumOf(8)
		d.Tokens = []int32{1, 2, 3, 4, 0, 0, 0, 0}
		d.Images = []*loopsv1.Image{img}
		_, err = train.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{d}})
		requireCode(t, err, c.code, c.msg)

		// Tinker: asample and forward_backward with an image chunk.
		chunks := []any{map[string]any{"type": "encoded_text", "tokens": []int{1, 2, 3, 4}},
			map[string]any{"type": "image", "data": pic, "format": "png", "expected_tokens": 4}}
		status, body := call(t, url, "/api/v1/asample", c.key, map[string]any{"sampling_session_id": sampler, "num_samples": 1, "type": "sample",
			"prompt": map[string]any{"chunks": chunks}, "sampling_params": map[string]any{"max_tokens": 2}})
		requireTinker(t, status, body, c.status, c.msg)
		_, tgt, w := tokens(8)
		status, body = call(t, url, "/api/v1/forward_backward", c.key, map[string]any{"model_id": run, "type": "forward_backward",
			"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{map[string]any{
				"model_input": map[string]any{"chunks": chunks},
				"loss_fn_inputs": map[string]any{
					"target_tokens": map[string]any{"data": tgt, "dtype": "int64", "shape": []int{8}},
					"weights":       map[string]any{"data": w, "dtype": "float32", "shape": []int{8}},
				}}}}})
		requireTinker(t, status, body, c.status, c.msg)

		// OpenAI image_url part and Anthropic image block.
		status, body = call(t, url, "/oai/api/v1/chat/completions", c.key, map[string]any{"model": "loops/tiny", "max_tokens": 2,
			"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + pic}}}}}})
		require.Equal(t, c.status, status, body)
		require.Contains(t, body["error"].(map[string]any)["message"], c.msg)
		status, body = call(t, url, "/anthropic/api/v1/messages", c.key, map[string]any{"model": "loops/tiny", "max_tokens": 2,
			"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": pic}}}}}})
		require.Equal(t, c.status, status, body)
		require.Contains(t, body["error"].(map[string]any)["message"], c.msg)
		if c.key == keyText {
			require.Contains(t, body["error"].(map[string]any)["message"], how)
		}
	}

	// A workspace's view: its policy's dedicated: always leaves serverless out, and on a
	// backend without dedicated pools (the reference engine refuses such runs) nothing is
	// left to train on; allowed_modalities narrows modalities.
	pm := must(loopsv1connect.NewModelServiceClient(http.DefaultClient, url, withKey(keyPooled)).ListModels(ctx, &loopsv1.ListModelsRequest{})).GetModels()[0]
	require.Empty(t, pm.GetAvailability())
	require.False(t, pm.GetTrainable())
	require.True(t, pm.GetSampleable())
	code, body = call(t, url, "/api/v1/get_server_capabilities", keyText, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []any{"text"}, body["supported_models"].([]any)[0].(map[string]any)["modalities"])
}
