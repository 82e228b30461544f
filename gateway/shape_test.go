package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestWrappedShapeIsRefusedOnEverySurface is the regression test for a one-request outage:
// a ForwardBackward whose (N, K) shape product wraps int64 to the number of values was
// accepted and then crashed the server inside the reference engine. It must be a 400 at
// submission over Connect and REST, and the server must keep training afterwards.
func TestWrappedShapeIsRefusedOnEverySurface(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		op, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(20 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	}))).GetTrainingRunId()

	for _, dims := range [][]int64{{4, 4611686018427387905}, {4, 0}} {
		n := int(dims[0] * dims[1])
		tgt, w := make([]int64, n), make([]float32, n)
		_, err := training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{{
			Tokens: []int32{65, 66, 67, 68},
			LossFnInputs: map[string]*loopsv1.Tensor{
				"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: dims, Int64Data: tgt},
				"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: dims, Float32Data: w},
			},
		}}})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "Connect, shape %v", dims)

		shape := fmt.Sprintf(`["%d","%d"]`, dims[0], dims[1])
		body := `{"loss_fn":"cross_entropy","data":[{"tokens":[65,66,67,68],"loss_fn_inputs":{` +
			`"target_tokens":{"dtype":"DTYPE_INT64","shape":` + shape + `,"int64_data":` + jsonList(n, `"70"`) + `},` +
			`"weights":{"dtype":"DTYPE_FLOAT32","shape":` + shape + `,"float32_data":` + jsonList(n, `1`) + `}}}]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/training_runs/"+run+"/forward_backward", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-API-Key", keyA)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "REST, shape %v: %s", dims, msg)
		require.Contains(t, string(msg), "shape [")
	}

	// The server is alive and the run still trains.
	in, tgt, w := tokens(8)
	fb := must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{{
		Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		},
	}}}))
	require.NotEmpty(t, wait(fb).GetForwardBackward().GetOutputs())
}

func jsonList(n int, v string) string {
	return "[" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "]"
}
