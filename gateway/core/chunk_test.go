package core

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// engineCore is a core on the reference engine (loops/tiny, two threads).
func engineCore(t *testing.T, opts Options) *Core {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	eng, err := reference.New(reference.Options{DataDir: dir, Threads: 2})
	require.NoError(t, err)
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	opts.DataDir = dir
	c, err := New(t.Context(), st, eng, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	return c
}

// stepBits is what a script sees of a training step, as bits: the forward/backward's
// log-probs and loss, and the adapter's weights after the optim_step.
type stepBits struct {
	logprobs [][]float32
	loss     uint64
	weights  []byte
}

// chunkedStep creates a run on c in ws, sends one forward/backward of the given datums and
// an optim_step, and returns the bits.
func chunkedStep(t *testing.T, c *Core, ws string, datums []*loopsv1.Datum) stepBits {
	t.Helper()
	svc, ctx := c.Services(), auth.WithWorkspace(t.Context(), ws)
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		done, err := svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Minute)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
		return done
	}
	run := wait(svc.Training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 7, TrainAttn: true, TrainMlp: true}})).GetTrainingRunId()
	fb := wait(svc.Training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: datums})).GetForwardBackward()
	wait(svc.Training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 1e-2}}))
	save := wait(svc.Training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "w", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))
	ck, ref, err := c.resolveCheckpoint(ctx, ws, save.GetSaveWeights().GetPath())
	require.NoError(t, err)
	defer ref.release()
	_ = ck
	weights, err := os.ReadFile(filepath.Join(ref.dir, "adapter_model.safetensors"))
	require.NoError(t, err)
	out := stepBits{loss: math.Float64bits(fb.GetMetrics()["loss:sum"]), weights: weights}
	for _, o := range fb.GetOutputs() {
		out.logprobs = append(out.logprobs, o.GetOutputs()["logprobs"].GetFloat32Data())
	}
	require.Len(t, out.logprobs, len(datums), "one output per datum, in order")
	_, stray := fb.GetMetrics()[weightKey]
	require.False(t, stray, "the pieces' bookkeeping does not reach the client")
	return out
}

// TestChunkedStepIsTheSameBitsAloneAndUnderLoad is issue 25's bit-identity: a step that runs
// as pieces (here 5 pieces of 16 tokens) gives the same log-probs, loss and weights alone
// and while another workspace floods the same base model from four runs; its log-probs are
// those of the step run whole.
func TestChunkedStepIsTheSameBitsAloneAndUnderLoad(t *testing.T) {
	var datums []*loopsv1.Datum
	for i := range 10 {
		toks := make([]int32, 8)
		for j := range toks {
			toks[j] = int32((i*13+j*7)%200 + 1)
		}
		datums = append(datums, datum(toks...))
	}
	alone := chunkedStep(t, engineCore(t, Options{ChunkTokens: 16}), "ws-a", datums)

	loaded := engineCore(t, Options{ChunkTokens: 16})
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			svc, fctx := loaded.Services(), auth.WithWorkspace(ctx, "ws-flood")
			op, err := svc.Training.CreateTrainingRun(fctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
			if err != nil {
				return
			}
			done, err := svc.Operations.WaitOperation(fctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Minute)})
			if err != nil {
				return
			}
			big := make([]*loopsv1.Datum, 6)
			for j := range big {
				big[j] = datums[(i+j)%len(datums)]
			}
			for ctx.Err() == nil {
				op, err := svc.Training.ForwardBackward(fctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: done.GetTrainingRunId(), LossFn: "cross_entropy", Data: big})
				if err != nil {
					return
				}
				_, _ = svc.Operations.WaitOperation(fctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Minute)})
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // the flood is running
	underLoad := chunkedStep(t, loaded, "ws-a", datums)
	stop()
	wg.Wait()
	require.Equal(t, alone, underLoad, "the same bits alone and beside a flood")

	whole := chunkedStep(t, engineCore(t, Options{ChunkTokens: 1 << 20}), "ws-a", datums)
	require.Equal(t, whole.logprobs, alone.logprobs, "a datum's log-probs do not depend on the pieces")
}
