package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

const keyA, keyB = "tml-test-key-a", "tml-test-key-b"

func startServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b"})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

func withKey(key string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", key)
			return next(ctx, req)
		}
	}))
}

func tokens(n int) ([]int32, []int64, []float32) {
	in := make([]int32, n)
	tgt := make([]int64, n)
	w := make([]float32, n)
	for i := range n {
		in[i] = int32(65 + i%20)
		tgt[i] = int64(65 + (i+1)%20)
		w[i] = 1
	}
	return in, tgt, w
}

// TestConnectTrainsAndSamples drives a whole SFT step and a sample over Connect against the
// real reference engine.
func TestConnectTrainsAndSamples(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	sampling := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for !(op.GetState() == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED || op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED) {
			var err error
			op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
			require.NoError(t, err)
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	created := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMlp: true},
	})))
	run := created.GetTrainingRun().GetId()
	in, tgt, w := tokens(16)
	datum := &loopsv1.Datum{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
	}}
	var losses []float64
	for range 3 {
		fb := must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, Data: []*loopsv1.Datum{datum}, LossFn: "cross_entropy"}))
		opt := must(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}}))
		res := wait(fb).GetForwardBackward()
		require.Len(t, res.GetOutputs(), 1)
		require.Len(t, res.GetOutputs()[0].GetOutputs()["logprobs"].GetFloat32Data(), 16)
		losses = append(losses, res.GetMetrics()["loss:sum"])
		wait(opt)
	}
	require.Less(t, losses[2], losses[0], "loss should fall: %v", losses)

	saved := wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})))
	samplerID := saved.GetSaveWeights().GetSamplerId()
	require.NotEmpty(t, samplerID)
	seed := uint64(7)
	sample := wait(must(sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: samplerID, Prompt: in[:4], NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 5, Temperature: 1, TopP: 1, Seed: &seed}})))
	seqs := sample.GetSample().GetSequences()
	require.Len(t, seqs, 2)
	for _, s := range seqs {
		require.Len(t, s.GetLogprobs(), len(s.GetTokens()))
	}

	// Another key's workspace sees none of it.
	other := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyB))
	_, err := other.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	// An unknown key is refused.
	bad := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey("tml-nope"))
	_, err = bad.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestSurfacesShareOneCore checks that gRPC, REST and Tinker routes reach the same core and
// map errors consistently.
func TestSurfacesShareOneCore(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()

	// gRPC (h2c) on the same port.
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	gctx := metadata.AppendToOutgoingContext(ctx, "x-api-key", keyA)
	models, err := loopsv1.NewModelServiceClient(conn).ListModels(gctx, &loopsv1.ListModelsRequest{})
	require.NoError(t, err)
	require.Equal(t, "loops/tiny", models.GetModels()[0].GetName())
	_, err = loopsv1.NewTrainingServiceClient(conn).GetTrainingRun(gctx, &loopsv1.GetTrainingRunRequest{Id: "run-nope"})
	require.Equal(t, codes.NotFound, status.Code(err))
	_, err = loopsv1.NewModelServiceClient(conn).ListModels(ctx, &loopsv1.ListModelsRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))

	// REST.
	get := func(path, key string) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
	}
	code, body := get("/v1/models", keyA)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "loops/tiny", body["models"].([]any)[0].(map[string]any)["name"])
	code, body = get("/v1/training_runs/run-nope", keyA)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body["message"], "not found")
	code, _ = get("/v1/models", "")
	require.Equal(t, http.StatusUnauthorized, code)

	// REST bad input is a 400 with a reason.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/training_runs", strings.NewReader(`{"base_model":"loops/tiny","lora":{"rank":0,"train_mlp":true}}`))
	req.Header.Set("X-API-Key", keyA)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
	// rank 0 is full fine-tuning, which the reference engine does not serve
	require.Contains(t, string(b), "full fine-tuning (lora rank 0) of loops/tiny is not served by its backend (the reference engine): the torch worker serves it (loops serve --backend torch)")

	// Tinker.
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/v1/create_session", bytes.NewReader([]byte(`{"tags":[],"user_metadata":{},"sdk_version":"0.38.0","type":"create_session"}`)))
	req.Header.Set("X-API-Key", keyA)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	var sess map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sess))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// The session is visible through loops.v1 too.
	got, err := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA)).GetSession(ctx, &loopsv1.GetSessionRequest{Id: sess["session_id"].(string)})
	require.NoError(t, err)
	require.Equal(t, "0.38.0", got.GetSdkVersion())

	// Public endpoints.
	for _, p := range []string{"/healthz", "/openapi.json", "/metrics"} {
		resp, err := http.Get(url + p)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
		if p == "/openapi.json" {
			require.Contains(t, string(b), "/v1/training_runs/{training_run_id}/forward_backward")
		}
		if p == "/metrics" {
			require.Contains(t, string(b), "loops_operation_waiters")
		}
	}
}
