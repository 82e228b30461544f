package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// jsonl writes rows as JSON Lines.
func jsonl(t *testing.T, rows ...any) []byte {
	t.Helper()
	var b strings.Builder
	for _, r := range rows {
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		b.Write(raw)
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// TestEvalsOnSamplerSaves: evals attached by user_metadata run on each sampler save of the
// run, on the real reference engine, through the sampling queue; their results are kept
// per checkpoint with its step, the NLL score equals the mean negative prompt log-prob of
// the completions computed from the same checkpoint's samples, the multiple-choice score
// is the accuracy of the argmax of the summed log-probs, and the generation score counts
// the matched rows. The deploy gate refuses a checkpoint below a threshold, naming the
// score, the threshold and the checkpoint, and a deployment shows its lineage.
func TestEvalsOnSamplerSaves(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	url, _ := depServer(t, t.TempDir())
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	sampling := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyA))
	ev := loopsv1connect.NewEvalServiceClient(http.DefaultClient, url, withKey(keyA))
	evB := loopsv1connect.NewEvalServiceClient(http.DefaultClient, url, withKey(keyB))
	dep := loopsv1connect.NewDeploymentServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}

	type nllRow struct {
		Prompt     []int32 `json:"prompt"`
		Completion []int32 `json:"completion"`
	}
	type mcRow struct {
		Prompt  []int32   `json:"prompt"`
		Choices [][]int32 `json:"choices"`
		Answer  int       `json:"answer"`
	}
	nllRows := []nllRow{{[]int32{65, 66, 67}, []int32{68, 69}}, {[]int32{70}, []int32{71, 72, 73}}}
	mcRows := []mcRow{{[]int32{65, 66}, [][]int32{{67}, {90, 91}, {80}}, 0}, {[]int32{70, 71}, [][]int32{{72, 73}, {74}}, 1}}
	nllData := jsonl(t, nllRows[0], nllRows[1])

	// A bad row is a 400 naming its line.
	_, err := ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "bad", Kind: loopsv1.EvalKind_EVAL_KIND_NLL,
		Dataset: []byte("{\"prompt\": [1], \"completion\": [2]}\n{\"prompt\": [1]}\n")})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, `dataset line 2: "completion" is missing`)

	nll := must(ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "heldout", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, Dataset: nllData}))
	sum := sha256.Sum256(nllData)
	require.Equal(t, hex.EncodeToString(sum[:]), nll.GetSha256())
	require.Equal(t, int64(2), nll.GetRows())
	require.False(t, nll.GetHigherIsBetter())
	must(ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "mc", Kind: loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE, Dataset: jsonl(t, mcRows[0], mcRows[1])}))
	must(ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "gen", Kind: loopsv1.EvalKind_EVAL_KIND_GENERATION, Match: loopsv1.EvalMatch_EVAL_MATCH_REGEX, MaxTokens: 4,
		Dataset: jsonl(t, map[string]string{"prompt": "hello", "target": `(?s)^.*$`}, map[string]string{"prompt": "hello", "target": "impossible"})}))
	_, err = ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "mc", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, Dataset: nllData})
	require.Equal(t, connect.CodeAlreadyExists, connect.CodeOf(err))
	_, err = evB.GetEval(ctx, &loopsv1.GetEvalRequest{Id: nll.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "another workspace's eval")

	lora := &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMlp: true}
	_, err = training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora,
		UserMetadata: map[string]string{"loops.evals": "heldout,nope"}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, `eval "nope" not found`)
	run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: lora,
		UserMetadata: map[string]string{"loops.evals": "heldout, mc,gen"}}))).GetTrainingRun().GetId()
	save := func(name string) string {
		return wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: name,
			Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))).GetSaveWeights().GetPath()
	}
	c1 := save("s1")
	in, tgt, w := tokens(12)
	wait(must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})))
	wait(must(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 0.05}})))
	c2 := save("s2")

	// Both saves are scored by the three evals (a bound for a hang, not a timing).
	var results []*loopsv1.EvalResult
	deadline := time.Now().Add(2 * time.Minute)
	for {
		results = must(ev.ListEvalResults(ctx, &loopsv1.ListEvalResultsRequest{TrainingRunId: run})).GetResults()
		done := 0
		for _, r := range results {
			if r.GetState() != loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING {
				done++
			}
		}
		if done == 6 {
			break
		}
		require.True(t, time.Now().Before(deadline), "eval results: %v", results)
		time.Sleep(50 * time.Millisecond)
	}
	byKey := map[string]*loopsv1.EvalResult{}
	for _, r := range results {
		require.Equal(t, loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED, r.GetState(), r.GetError())
		byKey[r.GetEvalName()+"@"+r.GetTinkerPath()] = r
	}
	require.Len(t, byKey, 6)

	// Independent sums from the same checkpoints' prompt log-probs, in float64.
	logprobs := func(path string, seq []int32, n int) []float64 {
		op := wait(must(sampling.Sample(ctx, &loopsv1.SampleRequest{ModelPath: path, Prompt: seq, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 1}, PromptLogprobs: true})))
		lps := op.GetSample().GetPromptLogprobs()
		out := make([]float64, n)
		for i := range n {
			out[i] = float64(lps[len(lps)-n+i])
		}
		return out
	}
	for i, path := range []string{c1, c2} {
		var nllSum float64
		var count int
		for _, r := range nllRows {
			var s float64
			for _, lp := range logprobs(path, append(append([]int32{}, r.Prompt...), r.Completion...), len(r.Completion)) {
				s += lp
			}
			nllSum += -s
			count += len(r.Completion)
		}
		got := byKey["heldout@"+path]
		require.InDelta(t, nllSum/float64(count), got.GetScore(), 1e-9, path)
		require.InDelta(t, float64(count), got.GetMetrics()["tokens"], 0)
		require.Equal(t, int64(i), got.GetStep(), "the run's optimizer steps at the save")
		require.Equal(t, nll.GetSha256(), got.GetDatasetSha256())

		correct := 0
		for _, r := range mcRows {
			best, bestAt := 0.0, -1
			for j, ch := range r.Choices {
				var s float64
				for _, lp := range logprobs(path, append(append([]int32{}, r.Prompt...), ch...), len(ch)) {
					s += lp
				}
				if bestAt < 0 || s > best {
					best, bestAt = s, j
				}
			}
			if bestAt == r.Answer {
				correct++
			}
		}
		require.InDelta(t, float64(correct)/2, byKey["mc@"+path].GetScore(), 0, path)
		require.InDelta(t, 0.5, byKey["gen@"+path].GetScore(), 0, "the first row's regex matches anything, the second's target cannot fit in 4 tokens")
	}
	// The eval's own view lists its results too; another workspace sees none.
	require.Len(t, must(ev.ListEvalResults(ctx, &loopsv1.ListEvalResultsRequest{EvalId: "heldout"})).GetResults(), 2)
	_, err = evB.ListEvalResults(ctx, &loopsv1.ListEvalResultsRequest{TrainingRunId: run})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// The deploy gate.
	score := byKey["heldout@"+c2].GetScore()
	_, err = dep.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "gated", Checkpoints: []string{c2},
		RequireEvals: []*loopsv1.EvalRequirement{{Eval: "heldout", Op: "<=", Threshold: score - 0.01}}})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, fmt.Sprintf("checkpoint %s scores %g on eval heldout, below the threshold <= %g", c2, score, score-0.01))
	_, err = dep.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "gated", Checkpoints: []string{c2},
		RequireEvals: []*loopsv1.EvalRequirement{{Eval: "gen", Threshold: 0.6}}})
	require.ErrorContains(t, err, fmt.Sprintf("checkpoint %s scores 0.5 on eval gen, below the threshold >= 0.6", c2))
	must(ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "unattached", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, Dataset: nllData}))
	_, err = dep.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "gated", Checkpoints: []string{c2},
		RequireEvals: []*loopsv1.EvalRequirement{{Eval: "unattached", Threshold: 0}}})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "has no result of eval unattached")

	d := must(dep.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "gated", Checkpoints: []string{c2},
		RequireEvals: []*loopsv1.EvalRequirement{{Eval: "heldout", Op: "<=", Threshold: score}, {Eval: "gen", Threshold: 0.5}}}))
	dc := d.GetCheckpoints()[0]
	require.Equal(t, run, dc.GetTrainingRunId())
	require.Equal(t, "loops/tiny", dc.GetBaseModel())
	require.Equal(t, int64(1), dc.GetStep())
	require.Len(t, dc.GetEvals(), 3)
	for _, r := range dc.GetEvals() {
		require.Equal(t, c2, r.GetTinkerPath())
		require.NotEmpty(t, r.GetDatasetSha256())
	}
	// The training data's lineage: the hash of the receipt's batch hashes before c2's save.
	rec := must(loopsv1connect.NewReceiptServiceClient(http.DefaultClient, url, withKey(keyA)).GetRunReceipt(ctx,
		&loopsv1.GetRunReceiptRequest{TrainingRunId: run}))
	h, batches := sha256.New(), int64(0)
	for _, s := range rec.GetSteps() {
		if s.GetCheckpointPath() == c2 {
			break
		}
		if s.GetBatchSha256() != "" {
			h.Write([]byte(s.GetBatchSha256() + "\n"))
			batches++
		}
	}
	require.Positive(t, batches)
	require.Equal(t, "sha256:"+hex.EncodeToString(h.Sum(nil)), dc.GetTrainingDataSha256())
	require.Equal(t, batches, dc.GetTrainingBatches())
	require.Equal(t, rec.GetBaseModelRevision(), dc.GetBaseModelRevision())
	require.NotEmpty(t, dc.GetBaseModelRevision())
	// The lineage is kept with the deployment.
	got := must(dep.GetDeployment(ctx, &loopsv1.GetDeploymentRequest{Name: "gated"}))
	require.Len(t, got.GetCheckpoints()[0].GetEvals(), 3)
}

// TestRewardEvalRunsInTheJobsSandbox: a reward eval's Python function runs as a job of the
// workspace in the jobs sandbox on each row's greedy completion; the score is the mean
// reward, and a function that raises fails the result with its traceback.
func TestRewardEvalRunsInTheJobsSandbox(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	url := startSandboxJobsServer(t)
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	ev := loopsv1connect.NewEvalServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	data := jsonl(t, map[string]any{"prompt": "hello", "info": map[string]int{"k": 1}}, map[string]any{"prompt": []int32{65, 66}, "info": map[string]int{"k": 2}})
	script := "def reward(prompt, completion, info):\n    assert isinstance(prompt, str) and isinstance(completion, str)\n    return 1.0 if info['k'] == 1 else 0.25\n"
	_, err := ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "r0", Kind: loopsv1.EvalKind_EVAL_KIND_REWARD, Dataset: data})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "needs reward_script")
	must(ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "reward", Kind: loopsv1.EvalKind_EVAL_KIND_REWARD, MaxTokens: 4, Dataset: data, RewardScript: script}))
	must(ev.CreateEval(ctx, &loopsv1.CreateEvalRequest{Name: "raises", Kind: loopsv1.EvalKind_EVAL_KIND_REWARD, MaxTokens: 4, Dataset: data,
		RewardScript: "def reward(prompt, completion, info):\n    raise ValueError('no reward today')\n"}))
	list := must(ev.ListEvals(ctx, &loopsv1.ListEvalsRequest{})).GetEvals()
	require.Empty(t, list[0].GetRewardScript(), "lists leave the script out")
	require.Equal(t, script, must(ev.GetEval(ctx, &loopsv1.GetEvalRequest{Id: "reward"})).GetRewardScript())

	run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny",
		Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}, UserMetadata: map[string]string{"loops.evals": "reward,raises"}}))).GetTrainingRun().GetId()
	wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "s1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})))
	var results []*loopsv1.EvalResult
	for deadline := time.Now().Add(2 * time.Minute); ; { // a bound for a hang
		results = must(ev.ListEvalResults(ctx, &loopsv1.ListEvalResultsRequest{TrainingRunId: run})).GetResults()
		if len(results) == 2 && results[0].GetState() != loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING && results[1].GetState() != loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING {
			break
		}
		require.True(t, time.Now().Before(deadline), "%v", results)
		time.Sleep(100 * time.Millisecond)
	}
	for _, r := range results {
		switch r.GetEvalName() {
		case "reward":
			require.Equal(t, loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED, r.GetState(), r.GetError())
			require.InDelta(t, 0.625, r.GetScore(), 1e-12)
			require.InDelta(t, 0.25, r.GetMetrics()["min_reward"], 0)
			require.LessOrEqual(t, r.GetMetrics()["mean_generated_tokens"], 4.0)
		case "raises":
			require.Equal(t, loopsv1.EvalResultState_EVAL_RESULT_STATE_FAILED, r.GetState())
			require.Contains(t, r.GetError(), "no reward today")
		}
	}
	// The reward functions ran as the workspace's jobs.
	jobs := must(loopsv1connect.NewJobServiceClient(http.DefaultClient, url, withKey(keyA)).ListJobs(ctx, &loopsv1.ListJobsRequest{})).GetJobs()
	require.Len(t, jobs, 2)
}
