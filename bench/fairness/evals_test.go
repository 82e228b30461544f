package fairness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestEvalFairness: what a tenant's server-side evals cost another tenant. Tenant A has an
// NLL eval of evalRows rows (32 + 32 tokens) attached to its run and saves for the sampler
// evalSaves times at once (so its evals run MaxConcurrentEvalRunsPerWorkspace at a time,
// the rest queued); tenant B meanwhile samples (16 + 16 tokens, one at a time) and trains
// (forward_backward of 32 tokens, one at a time). B's median and p95 latencies while A's
// evals run are set against the same requests with A idle, measured in the same process.
func TestEvalFairness(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the fairness benchmark")
	}
	const (
		keyA, keyB = "tml-bench-evals-a", "tml-bench-evals-b"
		evalRows   = 200
		evalSaves  = 4
		probes     = 30
	)
	url := startServer(t, []string{keyA, keyB + "=bench-b"}, core.Options{})
	a, b := newTenant(url, keyA), newTenant(url, keyB)
	hc := &http.Client{Transport: keyTransport{keyA, http.DefaultTransport}}
	ev := loopsv1connect.NewEvalServiceClient(hc, url)
	var data strings.Builder
	for i := range evalRows {
		p, c := make([]int32, 32), make([]int32, 32)
		for j := range p {
			p[j], c[j] = int32(65+(i+j)%26), int32(97+(i*7+j)%26)
		}
		raw, _ := json.Marshal(map[string][]int32{"prompt": p, "completion": c})
		data.Write(raw)
		data.WriteByte('\n')
	}
	_, err := ev.CreateEval(t.Context(), &loopsv1.CreateEvalRequest{Name: "heldout", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, Dataset: []byte(data.String())})
	require.NoError(t, err)
	op, err := a.training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny",
		Lora: &loopsv1.LoraConfig{Rank: 8, TrainAttn: true, TrainMlp: true}, UserMetadata: map[string]string{"loops.evals": "heldout"}})
	require.NoError(t, err)
	require.NoError(t, a.wait(t.Context(), op))
	runA := op.GetTrainingRunId()
	runB, samplerB := b.newRun(t), b.newSampler(t)

	measure := func() (sample, step []time.Duration) {
		for range probes {
			d, _, err := b.sample(t.Context(), samplerB, lightPrompt, lightMax)
			require.NoError(t, err)
			sample = append(sample, d)
			d, err = b.step(t.Context(), runB, 32)
			require.NoError(t, err)
			step = append(step, d)
		}
		return sample, step
	}
	aloneSample, aloneStep := measure()

	start := time.Now()
	for i := range evalSaves {
		op, err := a.training.SaveWeights(t.Context(), &loopsv1.SaveWeightsRequest{TrainingRunId: runA, Name: fmt.Sprintf("s%d", i), Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})
		require.NoError(t, err)
		require.NoError(t, a.wait(t.Context(), op))
	}
	busySample, busyStep := measure()
	var done []*loopsv1.EvalResult
	for {
		res, err := ev.ListEvalResults(t.Context(), &loopsv1.ListEvalResultsRequest{TrainingRunId: runA})
		require.NoError(t, err)
		done = slices.DeleteFunc(res.GetResults(), func(r *loopsv1.EvalResult) bool {
			return r.GetState() == loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING
		})
		if len(done) == evalSaves {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	evalTime := time.Since(start)
	for _, r := range done {
		require.Equal(t, loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED, r.GetState(), r.GetError())
	}
	row := func(name string, alone, busy []time.Duration) {
		ma, mb := percentile(alone, 0.5), percentile(busy, 0.5)
		pa, pb := percentile(alone, 0.95), percentile(busy, 0.95)
		fmt.Printf("%-28s median %8v -> %8v (x%.2f)   p95 %8v -> %8v (x%.2f)\n", name,
			ma.Round(time.Microsecond), mb.Round(time.Microsecond), float64(mb)/float64(ma),
			pa.Round(time.Microsecond), pb.Round(time.Microsecond), float64(pb)/float64(pa))
	}
	fmt.Printf("tenant A: %d evals of %d NLL rows (32+32 tokens) on %d saves, done in %v (%.0f rows/s); loadavg %s\n",
		evalSaves, evalRows, evalSaves, evalTime.Round(time.Millisecond), float64(evalSaves*evalRows)/evalTime.Seconds(), loadavg())
	// The same load as plain sampling: as many closed-loop clients as A's evals keep rows
	// in the queue (2 eval runs × 4 rows), each a 64-token prompt scored, 1 token sampled.
	samplerA := a.newSampler(t)
	var floodSample, floodStep []time.Duration
	a.floodWhile(t, samplerA, core.MaxConcurrentEvalRunsPerWorkspace*core.EvalRowParallel, 64, 1, func() {
		floodSample, floodStep = measure()
	}, 0)
	fmt.Println("tenant B, alone -> while A's evals run:")
	row("sample (16+16 tokens)", aloneSample, busySample)
	row("forward_backward (32 tok)", aloneStep, busyStep)
	fmt.Println("tenant B, alone -> while A runs the same load as plain samples (8 clients, 64+1 tokens):")
	row("sample (16+16 tokens)", aloneSample, floodSample)
	row("forward_backward (32 tok)", aloneStep, floodStep)
}
