package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestExpiredResultOnEverySurface: a forward_backward whose result is no longer kept (here:
// a result cache too small to hold any) answers RESULT_EXPIRED: FailedPrecondition (400) on
// loops.v1 GetOperation and WaitOperation, 410 with the reason on Tinker's retrieve_future;
// an unknown request is a 410 that says to resubmit. With room, two polls get the same bytes.
func TestExpiredResultOnEverySurface(t *testing.T) {
	for _, tc := range []struct {
		name    string
		budget  int64
		expired bool
	}{{"kept", 0, false}, {"expired", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.ResultCacheBytes = tc.budget })
			ctx := t.Context()
			training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
			ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
			created := must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
				BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
			}))
			in, tgt, w := tokens(8)
			fb := must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: created.GetTrainingRunId(), LossFn: "cross_entropy",
				Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
					"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
					"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
				}}}}))
			got, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: fb.GetId(), Timeout: durationpb.New(20 * time.Second)})
			_, gerr := ops.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: fb.GetId()})
			if tc.expired {
				for _, err := range []error{err, gerr} {
					require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), err)
					require.Contains(t, err.Error(), "result expired")
					require.Contains(t, err.Error(), "rerun the step")
					require.Equal(t, errs.ReasonResultExpired, errs.Reason(err))
				}
			} else {
				require.NoError(t, err)
				require.NoError(t, gerr)
				require.Len(t, got.GetForwardBackward().GetOutputs(), 1)
			}

			retrieve := func(id string) (int, []byte) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/v1/retrieve_future", bytes.NewReader([]byte(`{"request_id":"`+id+`"}`)))
				req.Header.Set("X-API-Key", keyA)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				return resp.StatusCode, b
			}
			status, body := retrieve(fb.GetId())
			if tc.expired {
				require.Equal(t, http.StatusGone, status, string(body))
				var eb map[string]string
				require.NoError(t, json.Unmarshal(body, &eb))
				require.Equal(t, errs.ReasonResultExpired, eb["reason"])
				require.Contains(t, eb["detail"], "result expired")
			} else {
				require.Equal(t, http.StatusOK, status, string(body))
				require.Contains(t, string(body), "loss_fn_outputs")
				_, again := retrieve(fb.GetId())
				require.Equal(t, body, again)
			}
			status, body = retrieve("op-never-recorded")
			require.Equal(t, http.StatusGone, status, string(body))
			require.Contains(t, string(body), "resubmit")
		})
	}
}
