package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestConnectCompressesOnlyLargeResponses: a client that accepts gzip gets a small response
// (an operation without per-token outputs) uncompressed, since gzip costs more than it saves
// there, and a large one (a forward_backward's outputs) compressed.
func TestConnectCompressesOnlyLargeResponses(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	created := must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	}))
	created = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: created.GetId(), Timeout: durationpb.New(20 * time.Second)}))
	var data []*loopsv1.Datum
	for range 8 {
		in, tgt, w := tokens(64)
		data = append(data, &loopsv1.Datum{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}})
	}
	fb := must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: created.GetTrainingRunId(), LossFn: "cross_entropy", Data: data}))
	must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: fb.GetId(), Timeout: durationpb.New(20 * time.Second)}))

	get := func(id string) (encoding string, size int) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/loops.v1.OperationService/GetOperation", bytes.NewReader([]byte(`{"id":"`+id+`"}`)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept-Encoding", "gzip") // set by hand: the transport then leaves the body as sent
		req.Header.Set("X-API-Key", keyA)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		return resp.Header.Get("Content-Encoding"), len(b)
	}
	enc, size := get(created.GetId())
	require.Empty(t, enc, "a %d-byte response is not compressed", size)
	require.Less(t, size, 4096)
	enc, size = get(fb.GetId())
	require.Equal(t, "gzip", enc, "a large response is compressed (%d bytes)", size)
}
