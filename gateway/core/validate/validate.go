package validate

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/loops-dev/loops/gateway/core/apierr"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/shape"
	"github.com/loops-dev/loops/internal/vision"
)

// lossSpec says what a loss function takes.
type lossSpec struct {
	inputs   []string // required loss_fn_inputs
	optional []string // optional loss_fn_inputs
}

// lossSpecs are the Tinker losses (DESIGN.md, "Semantics every backend implements"); the
// loss_fn_config keys each accepts, and their defaults, are semantics.LossConfig's.
var lossSpecs = map[string]lossSpec{
	"cross_entropy":       {inputs: []string{"target_tokens", "weights"}},
	"importance_sampling": {inputs: []string{"target_tokens", "logprobs", "advantages"}},
	"ppo":                 {inputs: []string{"target_tokens", "logprobs", "advantages"}},
	"cispo":               {inputs: []string{"target_tokens", "logprobs", "advantages"}},
	"dro":                 {inputs: []string{"target_tokens", "logprobs", "advantages"}},
	"gspo":                {inputs: []string{"target_tokens", "logprobs", "advantages", "sequence_ratio_mask"}},
}

// Limits are what a forward/backward request is checked against besides its model.
type Limits struct {
	// Losses are the loss functions the backend implements (its capabilities).
	Losses map[string]bool
	// MaxDatums caps the datums of one request (Options.MaxDatumsPerRequest).
	MaxDatums int
	// MaxBatchTokens caps the tokens of one request (Options.MaxBatchTokens).
	MaxBatchTokens int
}

// ForwardBackward checks a request against the model's limits, lim and the loss's inputs
// before it is queued, so that bad input is a 4xx at submission, never a failed operation.
// It returns the number of tokens in the request.
func ForwardBackward(model *loopsv1.ModelInfo, req *loopsv1.ForwardBackwardRequest, lim Limits) (int, error) {
	if why, refused := semantics.UnsupportedLosses[req.GetLossFn()]; refused {
		return 0, apierr.InvalidArgument("%s", why)
	}
	spec, ok := lossSpecs[req.GetLossFn()]
	if !ok || !lim.Losses[req.GetLossFn()] {
		return 0, apierr.InvalidArgument("unknown loss_fn %q: use one of %s", req.GetLossFn(), strings.Join(slices.Sorted(maps.Keys(lim.Losses)), ", "))
	}
	config, _ := semantics.LossConfig(req.GetLossFn())
	for k, v := range req.GetLossFnConfig() {
		if _, ok := config[k]; !ok {
			if len(config) == 0 {
				return 0, apierr.InvalidArgument("loss_fn_config key %q is not accepted by %s, which takes no config", k, req.GetLossFn())
			}
			return 0, apierr.InvalidArgument("loss_fn_config key %q is not accepted by %s: use %s", k, req.GetLossFn(), strings.Join(slices.Sorted(maps.Keys(config)), ", "))
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, apierr.InvalidArgument("loss_fn_config %q is %v; it must be finite", k, v)
		}
		if lo, hi := semantics.LossConfigRange(k); v < lo || v > hi {
			return 0, apierr.InvalidArgument("loss_fn_config %q is %v; it must be in [%v, %v]", k, v, lo, hi)
		}
	}
	data := req.GetData()
	if len(data) == 0 {
		return 0, apierr.InvalidArgument("data is empty: send at least one datum")
	}
	if len(data) > lim.MaxDatums {
		return 0, apierr.InvalidArgument("%d datums in one request is over the limit of %d: split the batch", len(data), lim.MaxDatums)
	}
	tokens, images := 0, 0
	for i, d := range data {
		if err := datum(model, spec, req.GetLossFn(), d); err != nil {
			return 0, apierr.InvalidArgument("datum %d: %v", i, err)
		}
		var err error
		if images, err = vision.Check(model, d.GetImages(), d.GetTokens(), images); err != nil {
			return 0, apierr.InvalidArgument("datum %d: %v", i, err)
		}
		tokens += len(d.GetTokens())
	}
	if tokens > lim.MaxBatchTokens {
		return 0, apierr.InvalidArgument("%d tokens in one request is over the batch limit of %d: split the batch", tokens, lim.MaxBatchTokens)
	}
	return tokens, nil
}

// datum checks one datum of a forward/backward request against the model and the loss.
func datum(model *loopsv1.ModelInfo, spec lossSpec, lossFn string, d *loopsv1.Datum) error {
	n := len(d.GetTokens())
	if n == 0 {
		return fmt.Errorf("model_input is empty")
	}
	if limit := int(model.GetMaxSequenceLength()); limit > 0 && n > limit {
		return fmt.Errorf("sequence of %d tokens is over %s's limit of %d: truncate it", n, model.GetName(), limit)
	}
	if err := TokenIDs(model, d.GetTokens(), "model_input"); err != nil {
		return err
	}
	for _, name := range spec.inputs {
		if _, ok := d.GetLossFnInputs()[name]; !ok {
			return fmt.Errorf("loss_fn_inputs lacks %q, which %s requires (it takes %s)", name, lossFn, strings.Join(append(slices.Clone(spec.inputs), spec.optional...), ", "))
		}
	}
	k := -1
	for name, t := range d.GetLossFnInputs() {
		if !slices.Contains(spec.inputs, name) && !slices.Contains(spec.optional, name) {
			return fmt.Errorf("loss_fn_inputs has %q, which %s does not take (it takes %s)", name, lossFn, strings.Join(append(slices.Clone(spec.inputs), spec.optional...), ", "))
		}
		shape, err := tensorShape(t)
		if err != nil {
			return fmt.Errorf("loss_fn_inputs[%q]: %v", name, err)
		}
		if shape[0] != int64(n) {
			return fmt.Errorf("loss_fn_inputs[%q] has %d rows but model_input has %d tokens: every per-token input has one entry per input position (position i predicts token i+1)", name, shape[0], n)
		}
		twoD := lossFn == "cross_entropy" && (name == "target_tokens" || name == "weights")
		switch {
		case len(shape) == 2 && twoD:
			if k >= 0 && int(shape[1]) != k {
				return fmt.Errorf("target_tokens and weights must have the same shape (N, K)")
			}
			k = int(shape[1])
		case len(shape) != 1:
			return fmt.Errorf("loss_fn_inputs[%q] has shape %v; it must be 1-D (N,)", name, shape)
		}
		wantInt := name == "target_tokens"
		switch {
		case wantInt && t.GetDtype() != loopsv1.Dtype_DTYPE_INT64:
			return fmt.Errorf("loss_fn_inputs[%q] must be int64 token ids, got %s", name, t.GetDtype())
		case !wantInt && t.GetDtype() != loopsv1.Dtype_DTYPE_FLOAT32:
			return fmt.Errorf("loss_fn_inputs[%q] must be float32, got %s", name, t.GetDtype())
		}
		for j, x := range t.GetFloat32Data() {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("loss_fn_inputs[%q][%d] is %v; values must be finite", name, j, x)
			}
		}
		if wantInt {
			for _, id := range t.GetInt64Data() {
				if id < 0 || (model.GetVocabSize() > 0 && id >= int64(model.GetVocabSize())) {
					return fmt.Errorf("target_tokens has token id %d outside %s's vocabulary [0, %d)", id, model.GetName(), model.GetVocabSize())
				}
			}
		}
	}
	if m, ok := d.GetLossFnInputs()["sequence_ratio_mask"]; ok && !slices.ContainsFunc(m.GetFloat32Data(), func(x float32) bool { return x != 0 }) {
		return fmt.Errorf("sequence_ratio_mask marks no position: %s's sequence ratio is the mean log-ratio over the marked positions, so mark at least one (1 on the sampled tokens, 0 elsewhere)", lossFn)
	}
	if t, ok := d.GetLossFnInputs()["target_tokens"]; ok && lossFn == "cross_entropy" {
		if _, hasW := d.GetLossFnInputs()["weights"]; hasW {
			ts, _ := tensorShape(t)
			ws, _ := tensorShape(d.GetLossFnInputs()["weights"])
			if !slices.Equal(ts, ws) {
				return fmt.Errorf("target_tokens has shape %v but weights has shape %v: they must match", ts, ws)
			}
		}
	}
	return nil
}

// TokenIDs checks that every token id is in the model's vocabulary; what names the ids in
// the error ("prompt", "stop").
func TokenIDs(model *loopsv1.ModelInfo, ids []int32, what string) error {
	v := model.GetVocabSize()
	for i, id := range ids {
		if id < 0 || (v > 0 && id >= v) {
			return fmt.Errorf("%s token %d is %d, outside %s's vocabulary [0, %d)", what, i, id, model.GetName(), v)
		}
	}
	return nil
}

// tensorShape returns a tensor's shape after checking that it matches its data.
func tensorShape(t *loopsv1.Tensor) ([]int64, error) {
	var n int
	switch t.GetDtype() {
	case loopsv1.Dtype_DTYPE_FLOAT32:
		n = len(t.GetFloat32Data())
		if len(t.GetInt64Data()) > 0 {
			return nil, fmt.Errorf("float32 tensor carries int64 data")
		}
	case loopsv1.Dtype_DTYPE_INT64:
		n = len(t.GetInt64Data())
		if len(t.GetFloat32Data()) > 0 {
			return nil, fmt.Errorf("int64 tensor carries float32 data")
		}
	default:
		return nil, fmt.Errorf("dtype %s is not supported: use float32 or int64", t.GetDtype())
	}
	dims := t.GetShape()
	if len(dims) == 0 {
		return []int64{int64(n)}, nil
	}
	if err := shape.Matches(dims, n); err != nil {
		return nil, err
	}
	return dims, nil
}

// Lora checks a LoRA config against the model. Rank 0 is full fine-tuning, which the
// model's backend must serve (ModelInfo.full_finetune) and which trains every weight.
func Lora(model *loopsv1.ModelInfo, l *loopsv1.LoraConfig) error {
	if l == nil {
		return apierr.InvalidArgument("lora config is required: give at least rank")
	}
	if l.GetRank() < 0 {
		return apierr.InvalidArgument("lora rank must be positive (or 0 for full fine-tuning), got %d", l.GetRank())
	}
	if l.GetRank() == 0 {
		if !model.GetFullFinetune() {
			return apierr.FailedPrecondition("full fine-tuning (lora rank 0) of %s is not served by its backend (%s): the torch worker serves it "+
				"(loops serve --backend torch); or give a LoRA rank from 1 to %d", model.GetName(), backendName(model), model.GetMaxLoraRank())
		}
		if !l.GetTrainAttn() || !l.GetTrainMlp() || !l.GetTrainUnembed() {
			return apierr.InvalidArgument("lora rank 0 is full fine-tuning, which trains every weight of the model: leave train_attn, train_mlp and train_unembed on, or give a LoRA rank of at least 1")
		}
		return nil
	}
	if m := model.GetMaxLoraRank(); m > 0 && l.GetRank() > m {
		return apierr.InvalidArgument("lora rank %d is over %s's limit of %d", l.GetRank(), model.GetName(), m)
	}
	if !l.GetTrainAttn() && !l.GetTrainMlp() && !l.GetTrainUnembed() {
		return apierr.InvalidArgument("lora config trains nothing: set at least one of train_attn, train_mlp, train_unembed")
	}
	return nil
}

// Adam checks a step's AdamParams.
func Adam(a *loopsv1.AdamParams) error {
	if a == nil {
		return apierr.InvalidArgument("adam params are required")
	}
	switch {
	case !(a.GetLearningRate() >= 0):
		return apierr.InvalidArgument("learning_rate must be >= 0, got %v", a.GetLearningRate())
	case !(a.GetBeta1() >= 0 && a.GetBeta1() < 1):
		return apierr.InvalidArgument("beta1 must be in [0, 1), got %v", a.GetBeta1())
	case !(a.GetBeta2() >= 0 && a.GetBeta2() < 1):
		return apierr.InvalidArgument("beta2 must be in [0, 1), got %v", a.GetBeta2())
	case !(a.GetEps() >= 0):
		return apierr.InvalidArgument("eps must be >= 0, got %v", a.GetEps())
	case !(a.GetWeightDecay() >= 0):
		return apierr.InvalidArgument("weight_decay must be >= 0, got %v", a.GetWeightDecay())
	case !(a.GetGradClipNorm() >= 0):
		return apierr.InvalidArgument("grad_clip_norm must be >= 0 (0 turns clipping off), got %v", a.GetGradClipNorm())
	}
	return nil
}

// CheckpointName checks a checkpoint name: 1 to 200 letters, digits, '-', '_' and '.', and
// not "." or ".." (a name is part of the checkpoint's store key and path).
func CheckpointName(name string) error {
	if name == "" {
		return apierr.InvalidArgument("checkpoint name is empty")
	}
	if len(name) > 200 {
		return apierr.InvalidArgument("checkpoint name is over 200 characters")
	}
	for _, r := range name {
		if !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return apierr.InvalidArgument("checkpoint name %q has %q: use letters, digits, '-', '_' and '.'", name, r)
		}
	}
	if name == "." || name == ".." {
		return apierr.InvalidArgument("checkpoint name %q is reserved", name)
	}
	return nil
}

// backendName names a model's backend for a message ("the reference engine" for reference).
func backendName(m *loopsv1.ModelInfo) string {
	switch b := m.GetBackend(); b {
	case "", "reference":
		return "the reference engine"
	default:
		return b
	}
}
