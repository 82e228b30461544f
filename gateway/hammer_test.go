package gateway_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/core"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestLoadWeightsOfEvictedRunsUnderEviction is issue 23's black-box check of item 1: for a
// while (5 s; a minute with LOOPS_TEST_LARGE=1, as make test-large runs it), clients
// hammer load_weights with checkpoints of runs that the janitor keeps evicting from memory
// (a sweep every 20 ms, runs idle for 1 ms leave), while other runs train; every request,
// of every client, still answers. On the old core a load_weights check that resolved its
// checkpoint under the run's lock while the sweep walked the runs blocked them all.
func TestLoadWeightsOfEvictedRunsUnderEviction(t *testing.T) {
	duration := 5 * time.Second
	if os.Getenv("LOOPS_TEST_LARGE") != "" {
		duration = time.Minute
	}
	addr := startServerWith(t, func(c *gateway.Config) {
		c.Core.SweepInterval = 20 * time.Millisecond
		c.Core.Limits = core.Limits{RunIdleTTL: time.Millisecond, LiveRunIdleTTL: time.Millisecond}
	})
	url := "http://" + addr
	training := loopsv1connect.NewTrainingServiceClient(h2cClient(), url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(h2cClient(), url, withKey(keyA))
	ctx := t.Context()
	lora := &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}
	wait := func(op *loopsv1.Operation) (*loopsv1.Operation, error) {
		return ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
	}
	newRun := func() string {
		op := must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora}))
		done := must(wait(op))
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
		return done.GetTrainingRunId()
	}
	// Checkpoints of runs that are then unloaded: the sweep evicts them again and again.
	var paths []string
	for i := range 4 {
		run := newRun()
		op := must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: fmt.Sprintf("c%d", i), Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING}))
		paths = append(paths, must(wait(op)).GetSaveWeights().GetPath())
		must(wait(must(training.UnloadTrainingRun(ctx, &loopsv1.UnloadTrainingRunRequest{Id: run}))))
	}
	targets := []string{newRun(), newRun()}
	trainers := []string{newRun(), newRun()}

	in, tgt, w := tokens(8)
	datum := &loopsv1.Datum{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
	}}
	// Each call must answer within this bound: a hang detector, not a timing.
	const answerWithin = 30 * time.Second
	var calls, slowest atomic.Int64
	call := func(what string, f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, answerWithin)
		defer cancel()
		start := time.Now()
		err := f(cctx)
		took := time.Since(start)
		calls.Add(1)
		for {
			s := slowest.Load()
			if int64(took) <= s || slowest.CompareAndSwap(s, int64(took)) {
				break
			}
		}
		if connect.CodeOf(err) == connect.CodeDeadlineExceeded || cctx.Err() != nil {
			return fmt.Errorf("%s did not answer within %v: %w", what, answerWithin, err)
		}
		return err
	}
	end := time.Now().Add(duration)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i, run := range targets {
		wg.Go(func() {
			for n := 0; time.Now().Before(end); n++ {
				path := paths[(i+n)%len(paths)]
				err := call("load_weights", func(ctx context.Context) error {
					op, err := training.LoadWeights(ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path})
					if err != nil {
						return err
					}
					done, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(answerWithin)})
					if err == nil && done.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
						err = fmt.Errorf("load_weights of %s: %s", path, done.GetError().GetMessage())
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for _, run := range trainers {
		wg.Go(func() {
			for time.Now().Before(end) {
				err := call("forward_backward", func(ctx context.Context) error {
					op, err := training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum}})
					if err != nil {
						return err
					}
					done, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(answerWithin)})
					if err == nil && done.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
						err = fmt.Errorf("forward_backward: %s", done.GetError().GetMessage())
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Readers that name the evicted runs directly, reloading them from the store (one client:
	// a transport per call left a connection open per call, and a minute of them ran the
	// process out of file descriptors).
	checkpoints := loopsv1connect.NewCheckpointServiceClient(h2cClient(), url, withKey(keyA))
	wg.Go(func() {
		for n := 0; time.Now().Before(end); n++ {
			err := call("get_checkpoint", func(ctx context.Context) error {
				_, err := checkpoints.GetCheckpoint(ctx, &loopsv1.GetCheckpointRequest{Path: paths[n%len(paths)]})
				return err
			})
			if err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("%d calls in %v, the slowest answered in %v", calls.Load(), duration, time.Duration(slowest.Load()))
	require.Positive(t, calls.Load())
}
