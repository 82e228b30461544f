package gateway_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestUsageOverEverySurface trains one step and reads its usage back over Connect, REST and
// Tinker's billing route; another workspace sees none of it.
func TestUsageOverEverySurface(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true},
	}))).GetTrainingRun().GetId()
	in, tgt, w := tokens(12)
	wait(must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})))
	wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "s1"})))

	// Connect.
	usage := loopsv1connect.NewUsageServiceClient(http.DefaultClient, url, withKey(keyA))
	res := must(usage.GetUsage(ctx, &loopsv1.GetUsageRequest{}))
	got := map[loopsv1.UsageKind]int64{}
	for _, b := range res.GetBuckets() {
		require.Equal(t, "loops/tiny", b.GetBaseModel())
		got[b.GetKind()] += b.GetAmount()
	}
	require.Equal(t, map[loopsv1.UsageKind]int64{
		loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS: 12,
		loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS:     1,
	}, got)
	other := must(loopsv1connect.NewUsageServiceClient(http.DefaultClient, url, withKey(keyB)).GetUsage(ctx, &loopsv1.GetUsageRequest{}))
	require.Empty(t, other.GetBuckets())
	now := time.Now()
	_, err := usage.GetUsage(ctx, &loopsv1.GetUsageRequest{StartTime: timestamppb.New(now), EndTime: timestamppb.New(now.Add(-time.Hour))})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	get := func(path, key string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
	}

	// REST.
	code, body := get("/v1/usage", keyA)
	require.Equal(t, http.StatusOK, code, body)
	kinds := map[string]bool{}
	for _, b := range body["buckets"].([]any) {
		kinds[b.(map[string]any)["kind"].(string)] = true
	}
	require.Equal(t, map[string]bool{"USAGE_KIND_TRAINING_TOKENS": true, "USAGE_KIND_CHECKPOINTS": true}, kinds)
	code, _ = get("/v1/usage?start_time=2025-01-01T00:00:00Z&end_time=2024-01-01T00:00:00Z", keyA)
	require.Equal(t, http.StatusBadRequest, code)

	// Tinker.
	code, body = get("/api/v1/billing/usage/events", keyA)
	require.Equal(t, http.StatusOK, code, body)
	types := map[string]bool{}
	for _, ev := range body["data"].([]any) {
		types[ev.(map[string]any)["event_info"].(map[string]any)["type"].(string)] = true
	}
	require.Equal(t, map[string]bool{"training": true, "checkpoint": true}, types)
	code, body = get("/api/v1/billing/usage/events", keyB)
	require.Equal(t, http.StatusOK, code, body)
	require.Empty(t, body["data"])
}
