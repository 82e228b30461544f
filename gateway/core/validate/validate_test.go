package validate

import (
	"bytes"
	"image"
	"image/png"
	"math"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

var model = &loopsv1.ModelInfo{Name: "tiny", MaxSequenceLength: 16, VocabSize: 100, MaxLoraRank: 8}

var limits = Limits{
	Losses:         map[string]bool{"cross_entropy": true, "ppo": true, "dro": true, "importance_sampling": true, "gspo": true},
	MaxDatums:      4,
	MaxBatchTokens: 24,
}

func ints(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i + 1)
	}
	return out
}

func i64s(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i + 2)
	}
	return out
}

func f32s(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// ceDatum is a valid cross_entropy datum of n tokens.
func ceDatum(n int) *loopsv1.Datum {
	return &loopsv1.Datum{Tokens: ints(n), LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: i64s(n)},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(n, 1)},
	}}
}

// rlDatum is a valid datum of n tokens for the RL losses.
func rlDatum(n int) *loopsv1.Datum {
	return &loopsv1.Datum{Tokens: ints(n), LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: i64s(n)},
		"logprobs":      {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(n, -1)},
		"advantages":    {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(n, 0.5)},
	}}
}

// gspoDatum is a valid gspo datum of n tokens: an RL datum whose mask marks every position.
func gspoDatum(n int) *loopsv1.Datum {
	d := rlDatum(n)
	d.LossFnInputs["sequence_ratio_mask"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(n, 1)}
	return d
}

func TestForwardBackwardCountsTheTokensOfAValidRequest(t *testing.T) {
	n, err := ForwardBackward(model, &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(5), ceDatum(7)}}, limits)
	require.NoError(t, err)
	require.Equal(t, 12, n)
	n, err = ForwardBackward(model, &loopsv1.ForwardBackwardRequest{LossFn: "ppo", LossFnConfig: map[string]float64{"clip_low_threshold": 0.8}, Data: []*loopsv1.Datum{rlDatum(3)}}, limits)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = ForwardBackward(model, &loopsv1.ForwardBackwardRequest{LossFn: "gspo", LossFnConfig: map[string]float64{"clip_low_threshold": 0, "clip_high_threshold": 100}, Data: []*loopsv1.Datum{gspoDatum(4)}}, limits)
	require.NoError(t, err, "gspo with its mask, the config at its bounds")
	require.Equal(t, 4, n)
	// cross_entropy takes (N, K) targets and weights of the same shape.
	d := ceDatum(2)
	d.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: i64s(6), Shape: []int64{2, 3}}
	d.LossFnInputs["weights"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(6, 1), Shape: []int64{2, 3}}
	_, err = ForwardBackward(model, &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{d}}, limits)
	require.NoError(t, err)
}

// TestForwardBackwardRefusesBadRequests: each bad request is InvalidArgument, and its message
// says what was wrong.
func TestForwardBackwardRefusesBadRequests(t *testing.T) {
	with := func(d *loopsv1.Datum, f func(*loopsv1.Datum)) *loopsv1.Datum { f(d); return d }
	for _, c := range []struct {
		name string
		req  *loopsv1.ForwardBackwardRequest
		want string
	}{
		{"unknown loss", &loopsv1.ForwardBackwardRequest{LossFn: "mse", Data: []*loopsv1.Datum{ceDatum(2)}}, `unknown loss_fn "mse": use one of cross_entropy, dro, gspo, importance_sampling, ppo`},
		{"loss the backend lacks", &loopsv1.ForwardBackwardRequest{LossFn: "cispo", Data: []*loopsv1.Datum{rlDatum(2)}}, `unknown loss_fn "cispo"`},
		{"config of a loss without one", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", LossFnConfig: map[string]float64{"beta": 1}, Data: []*loopsv1.Datum{ceDatum(2)}}, `loss_fn_config key "beta" is not accepted by cross_entropy, which takes no config`},
		{"config key of another loss", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", LossFnConfig: map[string]float64{"beta": 1}, Data: []*loopsv1.Datum{rlDatum(2)}}, `loss_fn_config key "beta" is not accepted by ppo: use clip_high_threshold, clip_low_threshold`},
		{"stable_reinforce", &loopsv1.ForwardBackwardRequest{LossFn: "stable_reinforce", Data: []*loopsv1.Datum{rlDatum(2)}}, `stable_reinforce is not supported by Loops: Tinker publishes its inputs (sampling with record_stability_info and datum provenance) but not its objective`},
		{"dppo", &loopsv1.ForwardBackwardRequest{LossFn: "dppo", Data: []*loopsv1.Datum{rlDatum(2)}}, `dppo is not supported by Loops: Baseten lists it among its losses but publishes no formula for it`},
		{"clip low over 1", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", LossFnConfig: map[string]float64{"clip_low_threshold": 1.5}, Data: []*loopsv1.Datum{rlDatum(2)}}, `loss_fn_config "clip_low_threshold" is 1.5; it must be in [0, 1]`},
		{"clip low negative", &loopsv1.ForwardBackwardRequest{LossFn: "gspo", LossFnConfig: map[string]float64{"clip_low_threshold": -0.1}, Data: []*loopsv1.Datum{gspoDatum(2)}}, `loss_fn_config "clip_low_threshold" is -0.1; it must be in [0, 1]`},
		{"clip high under 1", &loopsv1.ForwardBackwardRequest{LossFn: "gspo", LossFnConfig: map[string]float64{"clip_high_threshold": 0.9}, Data: []*loopsv1.Datum{gspoDatum(2)}}, `loss_fn_config "clip_high_threshold" is 0.9; it must be in [1, 100]`},
		{"clip high huge", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", LossFnConfig: map[string]float64{"clip_high_threshold": 1e9}, Data: []*loopsv1.Datum{rlDatum(2)}}, `loss_fn_config "clip_high_threshold" is 1e+09; it must be in [1, 100]`},
		{"beta negative", &loopsv1.ForwardBackwardRequest{LossFn: "dro", LossFnConfig: map[string]float64{"beta": -1}, Data: []*loopsv1.Datum{rlDatum(2)}}, `loss_fn_config "beta" is -1; it must be in [0, 1000]`},
		{"gspo without its mask", &loopsv1.ForwardBackwardRequest{LossFn: "gspo", Data: []*loopsv1.Datum{rlDatum(2)}}, `loss_fn_inputs lacks "sequence_ratio_mask", which gspo requires (it takes target_tokens, logprobs, advantages, sequence_ratio_mask)`},
		{"gspo mask marking nothing", &loopsv1.ForwardBackwardRequest{LossFn: "gspo", Data: []*loopsv1.Datum{with(gspoDatum(3), func(d *loopsv1.Datum) {
			d.LossFnInputs["sequence_ratio_mask"].Float32Data = f32s(3, 0)
		})}}, `datum 0: sequence_ratio_mask marks no position`},
		{"gspo mask of the wrong length", &loopsv1.ForwardBackwardRequest{LossFn: "gspo", Data: []*loopsv1.Datum{with(gspoDatum(3), func(d *loopsv1.Datum) {
			d.LossFnInputs["sequence_ratio_mask"].Float32Data = f32s(2, 1)
		})}}, `loss_fn_inputs["sequence_ratio_mask"] has 2 rows but model_input has 3 tokens`},
		{"mask on another loss", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", Data: []*loopsv1.Datum{gspoDatum(2)}}, `loss_fn_inputs has "sequence_ratio_mask", which ppo does not take`},
		{"config not finite", &loopsv1.ForwardBackwardRequest{LossFn: "dro", LossFnConfig: map[string]float64{"beta": math.Inf(1)}, Data: []*loopsv1.Datum{rlDatum(2)}}, `loss_fn_config "beta" is +Inf; it must be finite`},
		{"no data", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy"}, "data is empty"},
		{"too many datums", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(1), ceDatum(1), ceDatum(1), ceDatum(1), ceDatum(1)}}, "5 datums in one request is over the limit of 4"},
		{"too many tokens", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(16), ceDatum(9)}}, "25 tokens in one request is over the batch limit of 24"},
		{"empty datum", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(2), {}}}, "datum 1: model_input is empty"},
		{"over the sequence length", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(17)}}, "sequence of 17 tokens is over tiny's limit of 16"},
		{"token outside the vocabulary", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) { d.Tokens[1] = 100 })}}, "model_input token 1 is 100, outside tiny's vocabulary [0, 100)"},
		{"missing input", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", Data: []*loopsv1.Datum{with(rlDatum(2), func(d *loopsv1.Datum) { delete(d.LossFnInputs, "advantages") })}}, `loss_fn_inputs lacks "advantages", which ppo requires (it takes target_tokens, logprobs, advantages)`},
		{"input the loss does not take", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["advantages"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(2, 1)}
		})}}, `loss_fn_inputs has "advantages", which cross_entropy does not take`},
		{"rows not one per token", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(3), func(d *loopsv1.Datum) {
			d.LossFnInputs["weights"].Float32Data = f32s(2, 1)
		})}}, `loss_fn_inputs["weights"] has 2 rows but model_input has 3 tokens`},
		{"shape that does not match the data", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(3), func(d *loopsv1.Datum) {
			d.LossFnInputs["weights"].Shape = []int64{2, 2}
		})}}, `loss_fn_inputs["weights"]:`},
		{"2-D input of an RL loss", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", Data: []*loopsv1.Datum{with(rlDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["logprobs"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(4, -1), Shape: []int64{2, 2}}
		})}}, `loss_fn_inputs["logprobs"] has shape [2 2]; it must be 1-D (N,)`},
		{"targets and weights of different shapes", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: i64s(6), Shape: []int64{2, 3}}
		})}}, "target_tokens has shape [2 3] but weights has shape [2]: they must match"},
		{"float targets", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: f32s(2, 1)}
		})}}, `loss_fn_inputs["target_tokens"] must be int64 token ids, got DTYPE_FLOAT32`},
		{"int weights", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["weights"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: i64s(2)}
		})}}, `loss_fn_inputs["weights"] must be float32, got DTYPE_INT64`},
		{"mixed data", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["weights"].Int64Data = i64s(2)
		})}}, "float32 tensor carries int64 data"},
		{"no dtype", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["weights"].Dtype = loopsv1.Dtype_DTYPE_UNSPECIFIED
		})}}, "dtype DTYPE_UNSPECIFIED is not supported: use float32 or int64"},
		{"NaN advantage", &loopsv1.ForwardBackwardRequest{LossFn: "ppo", Data: []*loopsv1.Datum{with(rlDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["advantages"].Float32Data[1] = float32(math.NaN())
		})}}, `loss_fn_inputs["advantages"][1] is NaN; values must be finite`},
		{"target outside the vocabulary", &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{with(ceDatum(2), func(d *loopsv1.Datum) {
			d.LossFnInputs["target_tokens"].Int64Data[0] = -1
		})}}, "target_tokens has token id -1 outside tiny's vocabulary [0, 100)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ForwardBackward(model, c.req, limits)
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
			require.Contains(t, errs.Message(err), c.want)
		})
	}
}

func TestSampleFillsInDefaults(t *testing.T) {
	p, err := Sample(model, &loopsv1.SampleRequest{Prompt: ints(4)}, 8)
	require.NoError(t, err)
	// No params: temperature 1, top_p 1, and max_tokens what the sequence length leaves.
	require.Empty(t, cmpParams(&loopsv1.SamplingParams{Temperature: 1, TopP: 1, MaxTokens: 12}, p))

	big := &loopsv1.ModelInfo{Name: "big", VocabSize: 100}
	req := &loopsv1.SampleRequest{Prompt: ints(4), Params: &loopsv1.SamplingParams{Temperature: 0.5, StopTokens: []int32{7}}}
	p, err = Sample(big, req, 8)
	require.NoError(t, err)
	require.Empty(t, cmpParams(&loopsv1.SamplingParams{Temperature: 0.5, TopP: 1, MaxTokens: 1024, StopTokens: []int32{7}}, p))
	require.Zero(t, req.GetParams().GetMaxTokens(), "the request's own params are left alone")
}

func cmpParams(want, got *loopsv1.SamplingParams) string {
	return cmp.Diff(want, got, protocmp.Transform())
}

func TestSampleRefusesBadRequests(t *testing.T) {
	for _, c := range []struct {
		req  *loopsv1.SampleRequest
		want string
	}{
		{&loopsv1.SampleRequest{}, "prompt is empty"},
		{&loopsv1.SampleRequest{Prompt: []int32{1, 100}}, "prompt token 1 is 100, outside tiny's vocabulary [0, 100)"},
		{&loopsv1.SampleRequest{Prompt: ints(2), NumSamples: 9}, "num_samples 9 is out of range [1, 8]"},
		{&loopsv1.SampleRequest{Prompt: ints(2), NumSamples: -1}, "num_samples -1 is out of range [1, 8]"},
		{&loopsv1.SampleRequest{Prompt: ints(2), TopkPromptLogprobs: 101}, "topk_prompt_logprobs 101 is out of range [0, 100]"},
		{&loopsv1.SampleRequest{Prompt: ints(2), Params: &loopsv1.SamplingParams{TopLogprobs: 21}}, "top_logprobs 21 is out of range [0, 20]"},
		{&loopsv1.SampleRequest{Prompt: ints(17)}, "prompt of 17 tokens is over tiny's limit of 16"},
		{&loopsv1.SampleRequest{Prompt: ints(2), Params: &loopsv1.SamplingParams{MaxTokens: -1}}, "max_tokens must not be negative"},
		{&loopsv1.SampleRequest{Prompt: ints(10), Params: &loopsv1.SamplingParams{MaxTokens: 7}}, "prompt (10 tokens) + max_tokens (7) is over tiny's limit of 16 tokens: lower max_tokens"},
		{&loopsv1.SampleRequest{Prompt: ints(2), Params: &loopsv1.SamplingParams{Temperature: float32(math.NaN())}}, "temperature must be >= 0"},
		{&loopsv1.SampleRequest{Prompt: ints(2), Params: &loopsv1.SamplingParams{Temperature: 1, TopP: 1.5}}, "top_p must be in (0, 1]"},
		{&loopsv1.SampleRequest{Prompt: ints(2), Params: &loopsv1.SamplingParams{Temperature: 1, StopTokens: []int32{-3}}}, "stop token 0 is -3"},
		{&loopsv1.SampleRequest{Prompt: ints(2), Params: &loopsv1.SamplingParams{Temperature: 1, StopStrings: []string{"ok", ""}}}, "stop strings must not be empty"},
		{&loopsv1.SampleRequest{Prompt: ints(3), PromptLogprobsLastN: 1}, "prompt_logprobs_last_n applies to prompt logprobs: set prompt_logprobs too"},
		{&loopsv1.SampleRequest{Prompt: ints(3), PromptLogprobs: true, PromptLogprobsLastN: 3}, "prompt_logprobs_last_n 3 is out of range [1, 2]"},
		{&loopsv1.SampleRequest{Prompt: ints(3), PromptLogprobs: true, PromptLogprobsLastN: -1}, "prompt_logprobs_last_n -1 is out of range [1, 2]"},
		{&loopsv1.SampleRequest{Prompt: ints(3), PromptAltTokensK: 101}, "prompt_alt_tokens_k 101 is out of range [0, 100]"},
		{&loopsv1.SampleRequest{Prompt: ints(1), PromptAltTokensK: 1}, "prompt_alt_tokens_k needs a prompt of at least 2 tokens"},
		{&loopsv1.SampleRequest{Prompt: ints(3), TargetPromptTokens: &loopsv1.TargetPromptTokens{}}, "target_prompt_logprobs has 0 ids per position; give 1 to 100"},
		{&loopsv1.SampleRequest{Prompt: ints(1), TargetPromptTokens: &loopsv1.TargetPromptTokens{K: 1}}, "needs a prompt of at least 2 tokens"},
		{&loopsv1.SampleRequest{Prompt: ints(3), TargetPromptTokens: &loopsv1.TargetPromptTokens{K: 1, TokenIds: []int32{1}}}, "target_prompt_logprobs has 1 ids; a prompt of 3 tokens with 1 per position needs 2"},
		{&loopsv1.SampleRequest{Prompt: ints(3), TargetPromptTokens: &loopsv1.TargetPromptTokens{K: 1, TokenIds: []int32{1, 100}}}, "target_prompt_logprobs[1][0] = 100 is outside tiny's vocabulary [0, 100)"},
		{&loopsv1.SampleRequest{Prompt: ints(3), TargetPromptTokens: &loopsv1.TargetPromptTokens{K: 1, TokenIds: []int32{-2, 1}}}, "target_prompt_logprobs[0][0] = -2 is outside"},
		{&loopsv1.SampleRequest{Prompt: ints(3), TargetPromptTokens: &loopsv1.TargetPromptTokens{K: 2, TokenIds: []int32{-1, -1, -1, -1}}}, "names no token id"},
	} {
		_, err := Sample(model, c.req, 8)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", c.req)
		require.Contains(t, errs.Message(err), c.want)
	}
}

func TestLora(t *testing.T) {
	require.NoError(t, Lora(model, &loopsv1.LoraConfig{Rank: 8, TrainMlp: true}))
	for _, c := range []struct {
		l    *loopsv1.LoraConfig
		want string
	}{
		{nil, "lora config is required"},
		{&loopsv1.LoraConfig{Rank: -1, TrainMlp: true}, "lora rank must be positive (or 0 for full fine-tuning), got -1"},
		{&loopsv1.LoraConfig{Rank: 9, TrainMlp: true}, "lora rank 9 is over tiny's limit of 8"},
		{&loopsv1.LoraConfig{Rank: 4}, "lora config trains nothing"},
	} {
		err := Lora(model, c.l)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
		require.Contains(t, errs.Message(err), c.want)
	}
}

// Rank 0 is full fine-tuning: refused on a backend that does not serve it (the reference
// engine), naming the one that does; every weight is trained, so no train_* flag may be off.
func TestLoraRankZero(t *testing.T) {
	all := &loopsv1.LoraConfig{TrainAttn: true, TrainMlp: true, TrainUnembed: true}
	ref := proto.CloneOf(model)
	ref.Backend = "reference"
	err := Lora(ref, all)
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Equal(t, "full fine-tuning (lora rank 0) of tiny is not served by its backend (the reference engine): the torch worker serves it (loops serve --backend torch); or give a LoRA rank from 1 to 8", errs.Message(err))
	torch := proto.CloneOf(model)
	torch.Backend, torch.FullFinetune = "torch", true
	require.NoError(t, Lora(torch, all))
	err = Lora(torch, &loopsv1.LoraConfig{TrainAttn: true, TrainMlp: true})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Contains(t, errs.Message(err), "trains every weight of the model: leave train_attn, train_mlp and train_unembed on")
}

func TestAdam(t *testing.T) {
	require.NoError(t, Adam(&loopsv1.AdamParams{LearningRate: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}))
	for _, c := range []struct {
		a    *loopsv1.AdamParams
		want string
	}{
		{nil, "adam params are required"},
		{&loopsv1.AdamParams{LearningRate: math.NaN()}, "learning_rate must be >= 0"},
		{&loopsv1.AdamParams{Beta1: 1}, "beta1 must be in [0, 1)"},
		{&loopsv1.AdamParams{Beta2: -0.1}, "beta2 must be in [0, 1)"},
		{&loopsv1.AdamParams{Eps: -1}, "eps must be >= 0"},
		{&loopsv1.AdamParams{WeightDecay: -1}, "weight_decay must be >= 0"},
		{&loopsv1.AdamParams{GradClipNorm: math.Inf(-1)}, "grad_clip_norm must be >= 0"},
	} {
		err := Adam(c.a)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
		require.Contains(t, errs.Message(err), c.want)
	}
}

func TestCheckpointName(t *testing.T) {
	for _, ok := range []string{"final", "step-10", "a.b_c", strings.Repeat("x", 200)} {
		require.NoError(t, CheckpointName(ok), ok)
	}
	for name, want := range map[string]string{
		"":                       "checkpoint name is empty",
		strings.Repeat("x", 201): "over 200 characters",
		"a/b":                    `has '/'`,
		"a@1":                    `has '@'`,
		"é":                      `has 'é'`,
		".":                      "is reserved",
		"..":                     "is reserved",
	} {
		err := CheckpointName(name)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), name)
		require.Contains(t, errs.Message(err), want)
	}
}

// TestImages: image chunks are checked against the model (vision.Check) in forward/backward
// and sampling requests; their placeholder tokens count as tokens.
func TestImages(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, image.NewGray(image.Rect(0, 0, 48, 40)))) // 6 tokens below
	vl := &loopsv1.ModelInfo{Name: "tiny-vl", MaxSequenceLength: 64, VocabSize: 100, Modalities: []string{"text", "image"},
		Vision: &loopsv1.VisionInfo{PatchSize: 8, MergeSize: 2, MinPixels: 1024, MaxPixels: 4096}}
	im := &loopsv1.Image{Data: b.Bytes(), Format: "png", Offset: 1, Tokens: 6, Width: 48, Height: 40}
	d := ceDatum(8)
	for i := 1; i < 7; i++ {
		d.Tokens[i] = 0
	}
	d.Images = []*loopsv1.Image{im}
	req := &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{d}}
	n, err := ForwardBackward(vl, req, limits)
	require.NoError(t, err)
	require.Equal(t, 8, n)
	_, err = ForwardBackward(model, req, limits)
	require.ErrorContains(t, err, "datum 0: model tiny takes [text] input only, not images")

	sreq := &loopsv1.SampleRequest{Prompt: d.GetTokens(), NumSamples: 1, PromptImages: []*loopsv1.Image{im}}
	_, err = Sample(vl, sreq, 4)
	require.NoError(t, err)
	sreq.PromptImages[0].Tokens = 5
	_, err = Sample(vl, sreq, 4)
	require.ErrorContains(t, err, "has expected_tokens 5, but tiny-vl's image processor makes 6 tokens of it")
	sreq.PromptImages[0].Tokens = 6
	sreq.Embed, sreq.NumSamples = true, 0
	_, err = Sample(vl, sreq, 4)
	require.ErrorContains(t, err, "an embedding takes a text prompt")
}
