package core_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// slotRunResult is what one run produced: every forward_backward's loss and the bytes of
// its final adapter and optimizer state.
type slotRunResult struct {
	losses    []float64
	steps     []map[string]float64 // each optim_step's metrics
	weights   []byte
	optimizer []byte
}

// trainThroughSlots trains k runs, interleaved (every run's work submitted before any is
// awaited, so they contend for slots), on a core whose engine holds maxAdapters adapters.
func trainThroughSlots(t *testing.T, k, maxAdapters int) []slotRunResult {
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	eng, err := reference.New(reference.Options{DataDir: dir, Threads: 1, MaxAdapters: maxAdapters})
	require.NoError(t, err)
	return trainRuns(t, dir, eng, k, nil)
}

// trainRuns runs the training script of trainThroughSlots on a core over be, whose data
// dir dir holds the tiny model. midStep, if set, is called with the runs' ids once the
// work of each step is submitted and before any of it is awaited.
func trainRuns(t *testing.T, dir string, be backends.Backend, k int, midStep func(step int, runs []string)) []slotRunResult {
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	c, err := core.New(t.Context(), st, be, core.Options{DataDir: dir})
	require.NoError(t, err)
	defer func() {
		_ = c.Close()
		_ = st.Close()
	}()
	svc := c.Services()
	ctx := auth.WithWorkspace(t.Context(), "ws")
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	runs := make([]string, k)
	for i := range runs {
		runs[i] = wait(svc.Training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
			BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, Seed: uint64(i + 1), TrainAttn: true, TrainMlp: true},
		})).GetTrainingRunId()
	}
	datum := func(i, step int) *loopsv1.Datum {
		d := &loopsv1.Datum{LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32},
		}}
		for j := range 12 {
			d.Tokens = append(d.Tokens, int32(65+(i*7+step*3+j)%26))
			d.LossFnInputs["target_tokens"].Int64Data = append(d.LossFnInputs["target_tokens"].Int64Data, int64(65+(i*7+step*3+j+1)%26))
			d.LossFnInputs["weights"].Float32Data = append(d.LossFnInputs["weights"].Float32Data, 1)
		}
		return d
	}
	out := make([]slotRunResult, k)
	for step := range 3 {
		fbs := make([][]*loopsv1.Operation, k)
		var opts []*loopsv1.Operation
		for half := range 2 { // two forward_backward calls accumulate before each step
			for i, run := range runs {
				op, err := svc.Training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(i, step*2+half)}})
				require.NoError(t, err)
				fbs[i] = append(fbs[i], op)
			}
		}
		for i, run := range runs {
			op, err := svc.Training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 1e-2 * float64(i+1), Beta1: 0.9, Beta2: 0.95, Eps: 1e-12, WeightDecay: 0.01}})
			require.NoError(t, err)
			opts = append(opts, op)
		}
		if midStep != nil {
			midStep(step, runs)
		}
		for i := range runs {
			for _, op := range fbs[i] {
				out[i].losses = append(out[i].losses, wait(op, nil).GetForwardBackward().GetMetrics()["loss:sum"])
			}
			out[i].steps = append(out[i].steps, wait(opts[i], nil).GetOptimStep().GetMetrics())
		}
	}
	// One more forward_backward leaves gradients pending, then a save of every run.
	for i, run := range runs {
		out[i].losses = append(out[i].losses, wait(svc.Training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(i, 99)}})).GetForwardBackward().GetMetrics()["loss:sum"])
	}
	for i, run := range runs {
		wait(svc.Training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "final"}))
		m, err := filepath.Glob(filepath.Join(dir, "checkpoint-store", "ws", run, "weights", "final@*", "@parts", "*", "adapter_model.safetensors"))
		require.NoError(t, err)
		require.Len(t, m, 1)
		out[i].weights, err = os.ReadFile(m[0])
		require.NoError(t, err)
		out[i].optimizer, err = os.ReadFile(filepath.Join(filepath.Dir(m[0]), "optimizer.safetensors"))
		require.NoError(t, err)
	}
	return out
}

// TestRunsThroughOneSlotMatchRunsWithTheirOwn: three runs interleaved through an engine
// that holds one adapter (the scheduler offloads and restores them, gradients included)
// end bit-identical — every loss, the weights and the optimizer state — to the same runs
// on an engine with a slot each.
func TestRunsThroughOneSlotMatchRunsWithTheirOwn(t *testing.T) {
	const k = 3
	own := trainThroughSlots(t, k, k)
	shared := trainThroughSlots(t, k, 1)
	for i := range k {
		require.Equal(t, own[i].losses, shared[i].losses, "run %d losses", i)
		require.Equal(t, own[i].steps, shared[i].steps, "run %d optim_step metrics", i)
		require.Equal(t, own[i].weights, shared[i].weights, fmt.Sprintf("run %d weights", i))
		require.Equal(t, own[i].optimizer, shared[i].optimizer, fmt.Sprintf("run %d optimizer state", i))
	}
}
