package reference

import (
	"github.com/loops-dev/loops/backends/reference/nn"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/constrain"
	"github.com/loops-dev/loops/internal/semantics"
)

// vocabOf is bm's vocabulary as constrain needs it (the token ids of the model's
// embedding; ids the tokenizer does not know stand for no text) with its end-of-sequence
// ids, built on first use.
func (bm *baseModel) vocabOf() *constrain.Vocab {
	bm.vocabOnce.Do(func() { bm.vocab = constrain.NewVocab(bm.m.Cfg.Vocab, bm.tok.TokenBytes, bm.eos) })
	return bm.vocab
}

// adjustments checks p's logit adjustments and response_format and sets them on sp.
func (bm *baseModel) adjustments(p *loopsv1.SamplingParams, sp *nn.SampleParams) error {
	if err := semantics.CheckAdjustments(p, bm.m.Cfg.Vocab); err != nil {
		return invalid("%v", err)
	}
	if len(p.LogitBias) > 0 {
		sp.LogitBias = make(map[int]float64, len(p.LogitBias))
		for id, b := range p.LogitBias {
			sp.LogitBias[int(id)] = float64(b)
		}
	}
	sp.PresencePenalty, sp.FrequencyPenalty, sp.MinP = float64(p.PresencePenalty), float64(p.FrequencyPenalty), float64(p.MinP)
	if !semantics.Constrained(p) {
		return nil
	}
	if bm.tok == nil {
		return invalid("model %q has no tokenizer.json this engine can read, so a response_format cannot be enforced", bm.name)
	}
	if len(bm.eos) == 0 {
		return invalid("model %q has no end-of-sequence token, so a response_format cannot end its output", bm.name)
	}
	a := constrain.JSONObject()
	if p.ResponseFormat.GetType() == loopsv1.ResponseFormat_TYPE_JSON_SCHEMA {
		var err error
		if a, err = constrain.Schema([]byte(p.ResponseFormat.GetJsonSchema())); err != nil {
			return invalid("response_format.json_schema: %v", err)
		}
	}
	sp.Constraint = constrain.ForVocab(a, bm.vocabOf())
	return nil
}
