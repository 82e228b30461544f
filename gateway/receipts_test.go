package gateway_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/receipt"
	"github.com/loops-dev/loops/internal/replay"
	"github.com/loops-dev/loops/internal/semantics"
)

// receiptServer is a keyed server (keyA, keyB) on dataDir with the given core limits; stop
// closes it (at the end of the test if not before).
func receiptServer(t *testing.T, dataDir string, limits core.Limits) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b"})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dataDir, Keys: keys, Core: core.Options{Limits: limits}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Close(ctx))
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

func replayClients(url, key string) replay.Clients {
	return replay.Clients{
		Training:   loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(key)),
		Operations: loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(key)),
		Receipts:   loopsv1connect.NewReceiptServiceClient(http.DefaultClient, url, withKey(key)),
	}
}

// waitOK waits for op and requires that it succeeded.
func waitOK(t *testing.T, ops loopsv1connect.OperationServiceClient, op *loopsv1.Operation) *loopsv1.Operation {
	t.Helper()
	for op.GetState() == loopsv1.OperationState_OPERATION_STATE_PENDING || op.GetState() == loopsv1.OperationState_OPERATION_STATE_RUNNING {
		var err error
		op, err = ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
		require.NoError(t, err)
	}
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
	return op
}

// sftBatch is a batch of two datums whose tokens depend on k.
func sftBatch(k int) []*loopsv1.Datum {
	var out []*loopsv1.Datum
	for d := range 2 {
		n := 12 + 2*d
		in := make([]int32, n)
		tgt := make([]int64, n)
		w := make([]float32, n)
		for i := range n {
			in[i] = int32(65 + (i*7+k*3+d)%40)
			tgt[i] = int64(65 + ((i+1)*7+k*3+d)%40)
			w[i] = 1
		}
		out = append(out, &loopsv1.Datum{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}})
	}
	return out
}

// trainRecorded creates a run (record_data asked through user_metadata, as a tinker script
// does) and trains it for steps steps of forward_backward + optim_step, with a sampler save
// after the first; it returns the run and each forward_backward's loss and batch.
func trainRecorded(t *testing.T, url string, steps int) (string, []float64, [][]*loopsv1.Datum) {
	t.Helper()
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	created := waitOK(t, ops, must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 3, TrainAttn: true, TrainMlp: true},
		UserMetadata: map[string]string{core.MetaRecordData: "true"},
		Client:       &loopsv1.ClientInfo{Name: "receipts-test", Version: "1"},
	})))
	run := created.GetTrainingRun().GetId()
	var losses []float64
	var batches [][]*loopsv1.Datum
	for k := range steps {
		data := sftBatch(k)
		fb := waitOK(t, ops, must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, Data: data, LossFn: "cross_entropy"})))
		losses = append(losses, fb.GetForwardBackward().GetMetrics()["loss:sum"])
		batches = append(batches, data)
		waitOK(t, ops, must(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 1e-2}})))
		if k == 0 {
			waitOK(t, ops, must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "first"})))
		}
	}
	return run, losses, batches
}

// TestReceiptRecordsAndReplays: a recorded tiny run's receipt lists what determines its
// result, only its own workspace reads it, it replays bit for bit, a changed stored batch
// is caught at its step, and the receipt survives a restart of the gateway.
func TestReceiptRecordsAndReplays(t *testing.T) {
	dataDir := t.TempDir()
	url, stop := receiptServer(t, dataDir, core.Limits{})
	ctx := t.Context()
	run, losses, batches := trainRecorded(t, url, 3)

	rc := loopsv1connect.NewReceiptServiceClient(http.DefaultClient, url, withKey(keyA))
	rec, err := replay.Receipt(ctx, rc, run)
	require.NoError(t, err)
	require.Equal(t, "loops/tiny", rec.GetBaseModel())
	require.True(t, strings.HasPrefix(rec.GetBaseModelRevision(), "sha256:"), rec.GetBaseModelRevision())
	require.Empty(t, cmpProto(&loopsv1.LoraConfig{Rank: 4, Seed: 3, TrainAttn: true, TrainMlp: true}, rec.GetLora()))
	require.Equal(t, "receipts-test", rec.GetClient().GetName())
	require.True(t, rec.GetRecordData())
	require.Positive(t, rec.GetRecordedDataBytes())
	require.Equal(t, receipt.BatchEncoding, rec.GetBatchEncoding())
	// fb, optim, save, then (fb, optim) twice.
	kinds := []loopsv1.OperationKind{}
	for _, s := range rec.GetSteps() {
		kinds = append(kinds, s.GetKind())
	}
	FB, OPT := loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP
	require.Equal(t, []loopsv1.OperationKind{FB, OPT, loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER, FB, OPT, FB, OPT}, kinds)
	fbs := []*loopsv1.ReceiptStep{}
	for _, s := range rec.GetSteps() {
		switch s.GetKind() {
		case FB:
			fbs = append(fbs, s)
		case OPT:
			require.Empty(t, cmpProto(semantics.AdamWithDefaults(&loopsv1.AdamParams{LearningRate: 1e-2}), s.GetAdam()))
		default:
			require.Equal(t, "tinker://"+run+"/sampler_weights/first", s.GetCheckpointPath())
		}
	}
	for i, s := range fbs {
		require.Equal(t, receipt.BatchHash(batches[i]), s.GetBatchSha256())
		require.Equal(t, losses[i], s.GetLoss())
		require.Equal(t, "cross_entropy", s.GetLossFn())
		require.True(t, s.GetDataRecorded())
		require.Equal(t, int64(i+1), s.GetStep())
	}

	// The same over REST, and a recorded batch.
	for _, path := range []string{"/v1/training_runs/" + run + "/receipt?page_size=2",
		"/v1/training_runs/" + run + "/receipt/batches/" + strconv.FormatInt(fbs[0].GetSeqId(), 10)} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", keyA)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusOK, res.StatusCode, string(body))
		require.Contains(t, string(body), fbs[0].GetBatchSha256())
	}

	// Another workspace finds neither the receipt nor its batches.
	other := loopsv1connect.NewReceiptServiceClient(http.DefaultClient, url, withKey(keyB))
	_, err = other.GetRunReceipt(ctx, &loopsv1.GetRunReceiptRequest{TrainingRunId: run})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = other.GetReceiptBatch(ctx, &loopsv1.GetReceiptBatchRequest{TrainingRunId: run, SeqId: fbs[0].GetSeqId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = replay.Run(ctx, replayClients(url, keyB), run, nil)
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// The replay matches bit for bit.
	rep, err := replay.Run(ctx, replayClients(url, keyA), run, nil)
	require.NoError(t, err)
	require.True(t, rep.Matched, "%+v", rep.FirstMismatch)
	require.Equal(t, 6, rep.Replayed)
	require.Equal(t, 3, rep.ForwardBackwards)
	require.Equal(t, rep.BaseModelRevision, rep.ReplayBaseModelRevision)

	// The second batch, changed in the checkpoint store, is caught at its step.
	cks, err := ckstore.NewLocal(filepath.Join(dataDir, ckfiles.LocalStoreFolder), ckstore.Options{})
	require.NoError(t, err)
	keys, err := cks.List(ctx, "")
	require.NoError(t, err)
	var key string
	for _, k := range keys {
		if strings.HasSuffix(k, "/"+run+"/receipt/batch-"+strconv.FormatInt(fbs[1].GetSeqId(), 10)) {
			key = k
		}
	}
	require.NotEmpty(t, key, "no stored batch for seq_id %d in %v", fbs[1].GetSeqId(), keys)
	changed := proto.CloneOf(batches[1][0])
	changed.Tokens[3]++
	blob, err := receipt.EncodeBatch(&loopsv1.ReceiptBatch{TrainingRunId: run, SeqId: fbs[1].GetSeqId(),
		Data: []*loopsv1.Datum{changed, batches[1][1]}, LossFn: "cross_entropy"})
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, ckfiles.ReceiptBatchFile), blob, 0o600))
	_, err = cks.Put(ctx, key, dir)
	require.NoError(t, err)
	rep, err = replay.Run(ctx, replayClients(url, keyA), run, nil)
	require.NoError(t, err)
	require.False(t, rep.Matched)
	require.Equal(t, fbs[1].GetSeqId(), rep.FirstMismatch.SeqID)
	require.Equal(t, int64(2), rep.FirstMismatch.Step)
	require.Equal(t, fbs[1].GetBatchSha256(), rep.FirstMismatch.RecordedBatchSHA256)
	require.NotEqual(t, rep.FirstMismatch.RecordedBatchSHA256, rep.FirstMismatch.StoredBatchSHA256)
	require.Contains(t, rep.FirstMismatch.Reason, "the loss differs")
	require.Equal(t, 3, rep.Replayed, "stops at the second forward_backward")

	// A restart keeps the receipt: it is in the store.
	stop()
	url, _ = receiptServer(t, dataDir, core.Limits{})
	again, err := replay.Receipt(ctx, loopsv1connect.NewReceiptServiceClient(http.DefaultClient, url, withKey(keyA)), run)
	require.NoError(t, err)
	require.Empty(t, cmpProto(rec, again))
}

// TestReceiptBounds: past max_record_data_bytes a run stops recording, says why, and cannot
// be replayed; past max_receipt_steps its receipt says truncated.
func TestReceiptBounds(t *testing.T) {
	ctx := t.Context()
	one, err := receipt.EncodeBatch(&loopsv1.ReceiptBatch{TrainingRunId: "run-x", SeqId: 2, Data: sftBatch(0), LossFn: "cross_entropy"})
	require.NoError(t, err)
	// Room for one batch and a half; five steps in the receipt.
	url, _ := receiptServer(t, t.TempDir(), core.Limits{MaxRecordDataBytesPerRun: len(one) * 3 / 2, MaxReceiptStepsPerRun: 5})
	run, _, _ := trainRecorded(t, url, 3)
	rec, err := replay.Receipt(ctx, loopsv1connect.NewReceiptServiceClient(http.DefaultClient, url, withKey(keyA)), run)
	require.NoError(t, err)
	require.Contains(t, rec.GetRecordDataStopped(), "max_record_data_bytes")
	require.Contains(t, rec.GetRecordDataStopped(), "recording stopped at seq_id 4")
	require.LessOrEqual(t, rec.GetRecordedDataBytes(), int64(len(one)*3/2))
	require.Len(t, rec.GetSteps(), 5)
	require.True(t, rec.GetTruncated())
	require.True(t, rec.GetSteps()[0].GetDataRecorded())
	require.False(t, rec.GetSteps()[3].GetDataRecorded())
	_, err = replay.Run(ctx, replayClients(url, keyA), run, nil)
	require.ErrorContains(t, err, "max_record_data_bytes")
}

func cmpProto(want, got proto.Message) string { return cmp.Diff(want, got, protocmp.Transform()) }
