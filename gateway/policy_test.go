package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The workspaces of the policy tests: team-a has every limit, team-b may use only the
// second model, and every other workspace (keyOpen's) gets the default section.
const keyTeamA, keyTeamB, keyOpen = "tml-policy-a", "tml-policy-b", "tml-policy-open"

// startPolicyServer starts a server on 127.0.0.1:0 that serves loops/tiny and a second model
// (a copy of it under another name, the folder the engine writes loops/tiny to) with the
// policy of the policy tests. It returns the URL and the second model's name.
func startPolicyServer(t *testing.T) (url, second string) {
	t.Helper()
	dir := t.TempDir()
	second = filepath.Join(dir, "models", "loops-tiny")
	pol, err := policy.Parse(fmt.Appendf(nil, `
default:
  models: [loops/tiny]
workspaces:
  team-a:
    max_sequence_length: 24
    max_lora_rank: 8
    max_concurrent_runs: 1
    max_queued_operations: 3
    sampling_concurrency: 1
  team-b:
    models: [%q]
`, second))
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyTeamA + "=team-a", keyTeamB + "=team-b", keyOpen})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: dir, Keys: keys}
	// loops/tiny comes first: loading it writes the folder the second model is loaded from.
	cfg.BackendConfig.Models = []string{"loops/tiny", second}
	cfg.Core.Policy = pol
	cfg.Core.GapTimeout = time.Hour // operations queued behind a seq_id gap stay queued
	srv, err := gateway.New(t.Context(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String(), second
}

// call sends a JSON request (nil body: a GET) with key and returns the status and the decoded
// body.
func call(t *testing.T, url, path, key string, body any) (int, map[string]any) {
	t.Helper()
	code, out, _ := callHeaders(t, url, path, key, body)
	return code, out
}

// callHeaders is call that also returns the answer's headers.
func callHeaders(t *testing.T, url, path, key string, body any) (int, map[string]any, http.Header) {
	t.Helper()
	method, rd := http.MethodGet, (*bytes.Reader)(nil)
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(t.Context(), method, url+path, rd)
	} else {
		req, err = http.NewRequestWithContext(t.Context(), method, url+path, nil)
	}
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out, resp.Header
}

// tinkerDatum is one cross-entropy datum of n tokens in Tinker's JSON.
func tinkerDatum(n int) map[string]any {
	in, tgt, w := tokens(n)
	return map[string]any{
		"model_input": map[string]any{"chunks": []any{map[string]any{"type": "encoded_text", "tokens": in}}},
		"loss_fn_inputs": map[string]any{
			"target_tokens": map[string]any{"data": tgt, "dtype": "int64", "shape": []int{n}},
			"weights":       map[string]any{"data": w, "dtype": "float32", "shape": []int{n}},
		},
	}
}

func datumOf(n int) *loopsv1.Datum {
	in, tgt, w := tokens(n)
	return &loopsv1.Datum{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
	}}
}

func requireCode(t *testing.T, err error, code connect.Code, msg string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, connect.CodeOf(err), err.Error())
	require.Contains(t, err.Error(), msg)
}

func requireTinker(t *testing.T, status int, body map[string]any, want int, msg string) {
	t.Helper()
	require.Equal(t, want, status, body)
	require.Contains(t, body["detail"], msg)
}

// TestWorkspacePolicyCapabilities: each key sees only its workspace's models, with its
// limits, in get_server_capabilities, ListModels (Connect and REST) and GET /v1/workspace.
func TestWorkspacePolicyCapabilities(t *testing.T) {
	url, second := startPolicyServer(t)
	ctx := t.Context()
	caps := func(key string) []any {
		code, body := call(t, url, "/api/v1/get_server_capabilities", key, nil)
		require.Equal(t, http.StatusOK, code, body)
		return body["supported_models"].([]any)
	}
	a := caps(keyTeamA)
	require.Len(t, a, 1)
	require.Equal(t, "loops/tiny", a[0].(map[string]any)["model_name"])
	require.EqualValues(t, 24, a[0].(map[string]any)["max_context_length"])
	b := caps(keyTeamB)
	require.Len(t, b, 1)
	require.Equal(t, second, b[0].(map[string]any)["model_name"])
	open := caps(keyOpen)
	require.Len(t, open, 1)
	require.Equal(t, "loops/tiny", open[0].(map[string]any)["model_name"])
	require.Greater(t, open[0].(map[string]any)["max_context_length"].(float64), float64(24), "no limit of the default workspace's own")

	models := must(loopsv1connect.NewModelServiceClient(http.DefaultClient, url, withKey(keyTeamA)).ListModels(ctx, &loopsv1.ListModelsRequest{}))
	require.Len(t, models.GetModels(), 1)
	require.Equal(t, int32(24), models.GetModels()[0].GetMaxSequenceLength())
	require.Equal(t, int32(8), models.GetModels()[0].GetMaxLoraRank())
	code, body := call(t, url, "/v1/models", keyTeamB, nil)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, body["models"], 1)
	require.Equal(t, second, body["models"].([]any)[0].(map[string]any)["name"])

	ws := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyTeamA)).GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{}))
	require.Equal(t, "team-a", ws.GetName())
	l := ws.GetLimits()
	require.Equal(t, []int32{24, 8, 1, 3, 1}, []int32{l.GetMaxSequenceLength(), l.GetMaxLoraRank(), l.GetMaxConcurrentRuns(), l.GetMaxQueuedOperations(), l.GetSamplingConcurrency()})
	require.Len(t, l.GetModels(), 1)
	require.Equal(t, "loops/tiny", l.GetModels()[0].GetName())
	require.Equal(t, int32(8), l.GetModels()[0].GetMaxLoraRank())
	wsOpen := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyOpen)).GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{}))
	require.True(t, strings.HasPrefix(wsOpen.GetName(), "ws-"), wsOpen.GetName())
	require.Zero(t, wsOpen.GetLimits().GetMaxConcurrentRuns())
	require.Len(t, wsOpen.GetLimits().GetModels(), 1)
}

// TestWorkspacePolicyEnforced: every limit, over loops.v1 (Connect, REST) and Tinker's
// routes, with its status and a message that names it; GET /v1/workspace shows the use.
func TestWorkspacePolicyEnforced(t *testing.T) {
	url, second := startPolicyServer(t)
	ctx := t.Context()
	trainA := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyTeamA))
	sampA := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyTeamA))
	opsA := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyTeamA))
	wsA := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyTeamA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(opsA.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	lora := func(rank int32) *loopsv1.LoraConfig { return &loopsv1.LoraConfig{Rank: rank, TrainAttn: true} }
	tinkerLora := func(rank int) map[string]any { return map[string]any{"rank": rank, "train_attn": true} }

	// Models: 403 naming the model and the allowed ones, for runs and samplers.
	trainB := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyTeamB))
	_, err := trainB.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora(4)})
	requireCode(t, err, connect.CodePermissionDenied, fmt.Sprintf(`workspace "team-b" may not use base model "loops/tiny": its policy allows %s`, second))
	_, err = loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyTeamB)).CreateSampler(ctx, &loopsv1.CreateSamplerRequest{BaseModel: "loops/tiny"})
	requireCode(t, err, connect.CodePermissionDenied, `may not use base model "loops/tiny"`)
	_, err = loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyOpen)).CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: second, Lora: lora(4)})
	requireCode(t, err, connect.CodePermissionDenied, "its policy allows loops/tiny")
	status, body := call(t, url, "/api/v1/create_model", keyTeamB, map[string]any{"base_model": "loops/tiny", "lora_config": tinkerLora(4)})
	requireTinker(t, status, body, http.StatusForbidden, `workspace "team-b" may not use base model "loops/tiny"`)
	status, body = call(t, url, "/api/v1/create_sampling_session", keyTeamB, map[string]any{"base_model": "loops/tiny"})
	requireTinker(t, status, body, http.StatusForbidden, `may not use base model "loops/tiny"`)
	status, body = call(t, url, "/v1/training_runs", keyTeamB, map[string]any{"base_model": "loops/tiny", "lora": map[string]any{"rank": 4, "train_attn": true}})
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body["message"], `may not use base model "loops/tiny"`)

	// LoRA rank: 400.
	_, err = trainA.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora(16)})
	requireCode(t, err, connect.CodeInvalidArgument, `LoRA rank 16 is over workspace "team-a"'s limit of 8 (max_lora_rank`)
	status, body = call(t, url, "/api/v1/create_model", keyTeamA, map[string]any{"base_model": "loops/tiny", "lora_config": tinkerLora(16)})
	requireTinker(t, status, body, http.StatusBadRequest, "max_lora_rank")

	// Runs at once: 429 naming the limit; the run is counted until its session ends.
	sess := must(loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyTeamA)).CreateSession(ctx, &loopsv1.CreateSessionRequest{}))
	run := wait(must(trainA.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{SessionId: sess.GetId(), BaseModel: "loops/tiny", Lora: lora(8)}))).GetTrainingRun().GetId()
	_, err = trainA.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora(4)})
	requireCode(t, err, connect.CodeResourceExhausted, `workspace "team-a" has 1 training runs live, its limit (max_concurrent_runs`)
	status, body, h := callHeaders(t, url, "/api/v1/create_model", keyTeamA, map[string]any{"base_model": "loops/tiny", "lora_config": tinkerLora(4)})
	requireTinker(t, status, body, http.StatusTooManyRequests, `max_concurrent_runs in its policy, now 1): unload a run or end its session, then retry; or ask a workspace admin for more: loops access request --model loops/tiny --runs 2 --reason "..."`)
	require.Equal(t, "false", h.Get("X-Should-Retry"), "the SDK fails at once rather than backing off for minutes")
	use := must(wsA.GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{})).GetUse()
	require.Equal(t, int32(1), use.GetLiveRuns())
	require.Zero(t, use.GetQueuedOperations())

	// Sequence length: 400 for forward_backward and sampling.
	_, err = trainA.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datumOf(8), datumOf(30)}})
	requireCode(t, err, connect.CodeInvalidArgument, `datum 1: sequence of 30 tokens is over workspace "team-a"'s limit of 24 (max_sequence_length`)
	status, body = call(t, url, "/api/v1/forward_backward", keyTeamA, map[string]any{"model_id": run, "type": "forward_backward",
		"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{tinkerDatum(30)}}})
	requireTinker(t, status, body, http.StatusBadRequest, "max_sequence_length")
	wait(must(trainA.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datumOf(24)}})))

	sampler := must(sampA.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{BaseModel: "loops/tiny"})).GetId()
	prompt, _, _ := tokens(20)
	_, err = sampA.Sample(ctx, &loopsv1.SampleRequest{SamplerId: sampler, Prompt: prompt, NumSamples: 1, Params: &loopsv1.SamplingParams{MaxTokens: 10, Temperature: 1, TopP: 1}})
	requireCode(t, err, connect.CodeInvalidArgument, `prompt (20 tokens) + max_tokens (10) is over workspace "team-a"'s limit of 24 tokens`)
	status, body = call(t, url, "/api/v1/asample", keyTeamA, map[string]any{"sampling_session_id": sampler, "num_samples": 1, "type": "sample",
		"prompt": map[string]any{"chunks": []any{map[string]any{"type": "encoded_text", "tokens": prompt}}}, "sampling_params": map[string]any{"max_tokens": 10}})
	requireTinker(t, status, body, http.StatusBadRequest, "max_sequence_length")
	// Left out, max_tokens is lowered to fit.
	seed := uint64(1)
	res := wait(must(sampA.Sample(ctx, &loopsv1.SampleRequest{SamplerId: sampler, Prompt: prompt, NumSamples: 2, Params: &loopsv1.SamplingParams{Temperature: 1, TopP: 1, Seed: &seed}})))
	for _, s := range res.GetSample().GetSequences() {
		require.LessOrEqual(t, len(s.GetTokens()), 4)
	}

	// Queued operations: work queued behind a seq_id gap stays queued; the fourth is a 429.
	for seq := int64(100); seq < 103; seq++ {
		op := must(trainA.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: seq, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datumOf(4)}}))
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_PENDING, op.GetState())
	}
	_, err = trainA.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: 103, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datumOf(4)}})
	requireCode(t, err, connect.CodeResourceExhausted, `workspace "team-a" has 3 operations queued or running, its limit (max_queued_operations`)
	status, body = call(t, url, "/api/v1/forward_backward", keyTeamA, map[string]any{"model_id": run, "seq_id": 103, "type": "forward_backward",
		"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{tinkerDatum(4)}}})
	requireTinker(t, status, body, http.StatusTooManyRequests, "max_queued_operations")
	_, err = sampA.Sample(ctx, &loopsv1.SampleRequest{SamplerId: sampler, Prompt: prompt[:4], NumSamples: 1})
	requireCode(t, err, connect.CodeResourceExhausted, "max_queued_operations")
	status, body = call(t, url, "/v1/workspace", keyTeamA, nil)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "team-a", body["name"])
	require.EqualValues(t, 1, body["use"].(map[string]any)["live_runs"])
	require.EqualValues(t, 3, body["use"].(map[string]any)["queued_operations"])
	require.EqualValues(t, 3, body["limits"].(map[string]any)["max_queued_operations"])
	// Another workspace is not held back by team-a's use.
	code, b := call(t, url, "/v1/workspace", keyTeamB, nil)
	require.Equal(t, http.StatusOK, code)
	require.Nil(t, b["use"].(map[string]any)["live_runs"])

	// Ending the session unloads the run and fails its queued work: the use is back to zero
	// and a new run may be created.
	must(loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyTeamA)).FinishSession(ctx, &loopsv1.FinishSessionRequest{Id: sess.GetId(), Reason: "success"}))
	require.Eventually(t, func() bool {
		u := must(wsA.GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{})).GetUse()
		return u.GetLiveRuns() == 0 && u.GetQueuedOperations() == 0
	}, 10*time.Second, 10*time.Millisecond)
	wait(must(trainA.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora(4)})))
}
