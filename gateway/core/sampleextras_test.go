package core

import (
	"math"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestPromptLogprobsLastN: prompt_logprobs_last_n keeps the last N prompt log-probs and
// top-k rows of what the engine scored, and blanks the ones before (NaN; token 0 at
// -99999), whatever the engine.
func TestPromptLogprobsLastN(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	op, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{BaseModel: "fake/model", Prompt: []int32{5, 6, 7, 8, 9}, NumSamples: 1,
		PromptLogprobs: true, TopkPromptLogprobs: 2, PromptLogprobsLastN: 2})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	res := done.GetSample()
	lp := res.GetPromptLogprobs()
	require.Len(t, lp, 5)
	for i := range 3 {
		require.True(t, math.IsNaN(float64(lp[i])), "position %d is before the last 2: %g", i, lp[i])
	}
	require.Equal(t, []float32{-3, -4}, lp[3:])
	tk := res.GetTopkPromptLogprobs()
	require.Equal(t, []int32{0, 0, 0, 0, 0, 0, 3, 3, 4, 4}, tk.GetTokenIds())
	require.Equal(t, []float32{-99999, -99999, -99999, -99999, -99999, -99999, -3, -3, -4, -4}, tk.GetLogprobs())
}

// TestPromptExtrasTheEngineDoesNotReturnFail: a sample asking for target prompt log-probs
// or prompt draws fails with FAILED_PRECONDITION when the engine answers without them,
// rather than succeeding silently without.
func TestPromptExtrasTheEngineDoesNotReturnFail(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	for _, req := range []*loopsv1.SampleRequest{
		{TargetPromptTokens: &loopsv1.TargetPromptTokens{K: 1, TokenIds: []int32{3, 4}}},
		{PromptAltTokensK: 2},
	} {
		req.BaseModel, req.Prompt, req.NumSamples = "fake/model", []int32{5, 6, 7}, 1
		op, err := h.svc.Sampling.Sample(h.ctx, req)
		require.NoError(t, err)
		done := h.wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, done.GetState())
		require.Contains(t, done.GetError().GetMessage(), "does not return")
	}
}

// TestInflightSamplersFollowTheNewestInflightSave: an inflight sampler samples its run's
// newest inflight save, made before or after it (each sample reports the checkpoint it
// used), also once reloaded from its record; a snapshot sampler keeps its weights; a named
// inflight save is refused.
func TestInflightSamplersFollowTheNewestInflightSave(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	save := func(inflight bool) *loopsv1.SaveWeightsResult {
		t.Helper()
		op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Inflight: inflight})
		require.NoError(t, err)
		done := h.wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
		return done.GetSaveWeights()
	}
	used := func(sampler string) string {
		t.Helper()
		op, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: sampler, Prompt: []int32{1, 2}, NumSamples: 1})
		require.NoError(t, err)
		done := h.wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
		return done.GetSample().GetModelPath()
	}
	a := save(true)
	require.Equal(t, a.GetPath(), used(a.GetSamplerId()))
	snap := save(false)
	require.Equal(t, a.GetPath(), used(a.GetSamplerId()), "a snapshot save does not move the inflight weights")
	b := save(true)
	require.NotEqual(t, a.GetPath(), b.GetPath())
	require.Equal(t, b.GetPath(), used(b.GetSamplerId()))
	require.Equal(t, b.GetPath(), used(a.GetSamplerId()), "the first inflight sampler follows the newer save")
	require.Equal(t, snap.GetPath(), used(snap.GetSamplerId()), "a snapshot sampler keeps its weights")
	info, err := h.svc.Sampling.GetSampler(h.ctx, &loopsv1.GetSamplerRequest{Id: a.GetSamplerId()})
	require.NoError(t, err)
	require.Equal(t, run, info.GetInflightRunId())

	// dropped from memory, it is reloaded from its record onto the newest inflight save
	h.core.samplers.expire(time.Now().Add(365 * 24 * time.Hour))
	require.Zero(t, h.core.samplers.inMemory())
	c := save(true)
	require.Equal(t, c.GetPath(), used(a.GetSamplerId()))

	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "named", Inflight: true})
	if err == nil {
		done := h.wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, done.GetState())
		require.Contains(t, done.GetError().GetMessage(), "inflight applies to an unnamed sampler save")
	} else {
		require.ErrorContains(t, err, "inflight applies to an unnamed sampler save")
	}
}

// TestEmbedGoesThroughTheSampleQueue: SampleRequest.embed is checked (no sampling or prompt
// option, the prompt within the model's length), runs as a sample with no params and no
// sequences asked, is metered as its prompt tokens, and fails with FAILED_PRECONDITION on
// an engine that returns no embedding.
func TestEmbedGoesThroughTheSampleQueue(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	for _, req := range []*loopsv1.SampleRequest{
		{Params: &loopsv1.SamplingParams{MaxTokens: 1}},
		{NumSamples: 2},
		{PromptLogprobs: true},
		{PromptAltTokensK: 1},
		{Prompt: make([]int32, 100000)},
	} {
		req.BaseModel, req.Embed = "fake/model", true
		if req.Prompt == nil {
			req.Prompt = []int32{5, 6, 7}
		}
		_, err := h.svc.Sampling.Sample(h.ctx, req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	}

	embed := func() *loopsv1.Operation {
		t.Helper()
		op, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{BaseModel: "fake/model", Prompt: []int32{5, 6, 7}, Embed: true})
		require.NoError(t, err)
		return h.wait(op)
	}
	done := embed()
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, done.GetState())
	require.Equal(t, int32(connect.CodeFailedPrecondition), done.GetError().GetCode())
	require.Contains(t, done.GetError().GetMessage(), "does not compute embeddings")

	h.fake.mu.Lock()
	h.fake.embeds = true
	h.fake.mu.Unlock()
	done = embed()
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	require.Equal(t, []float32{3, 5}, done.GetSample().GetEmbedding())
	require.Empty(t, done.GetSample().GetSequences())
	h.fake.mu.Lock()
	for _, r := range h.fake.embedReqs {
		require.Nil(t, r.GetParams())
		require.Zero(t, r.GetNumSamples())
	}
	h.fake.mu.Unlock()

	res, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	got := map[loopsv1.UsageKind]int64{}
	for _, b := range res.GetBuckets() {
		got[b.GetKind()] += b.GetAmount()
	}
	require.Equal(t, map[loopsv1.UsageKind]int64{loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS: 3}, got)
}
