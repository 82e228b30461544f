package compat

import (
	"encoding/binary"
	"math"
	"strings"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

// cleanMetrics keeps only keys with exactly one ':' (the SDK's chunk merger crashes on any
// other key) and reports the keys it dropped.
func cleanMetrics(m map[string]float64) (map[string]float64, []string) {
	out := make(map[string]float64, len(m))
	var dropped []string
	for k, v := range m {
		if strings.Count(k, ":") != 1 {
			dropped = append(dropped, k)
			continue
		}
		out[k] = v
	}
	return out, dropped
}

// fieldMeta is the per-datum layout of one output field.
type fieldMeta struct {
	dtype    loopsv1.Dtype
	trailing []int64
}

func metaOf(t *loopsv1.Tensor) fieldMeta {
	m := fieldMeta{dtype: t.GetDtype()}
	if m.dtype != loopsv1.Dtype_DTYPE_INT64 {
		m.dtype = loopsv1.Dtype_DTYPE_FLOAT32
	}
	if len(t.GetShape()) > 1 {
		m.trailing = t.GetShape()[1:]
	}
	return m
}

func (a fieldMeta) equal(b fieldMeta) bool {
	if a.dtype != b.dtype || len(a.trailing) != len(b.trailing) {
		return false
	}
	for i := range a.trailing {
		if a.trailing[i] != b.trailing[i] {
			return false
		}
	}
	return true
}

// outputFields are the field names present in every datum's outputs, sorted.
func outputFields(outs []*loopsv1.DatumOutput) []string {
	if len(outs) == 0 {
		return nil
	}
	var names []string
	for _, k := range sortedKeys(outs[0].GetOutputs()) {
		all := true
		for _, o := range outs[1:] {
			if _, ok := o.GetOutputs()[k]; !ok {
				all = false
				break
			}
		}
		if all {
			names = append(names, k)
		}
	}
	return names
}

// forwardBackwardToProto encodes a core result as the SDK's ForwardBackwardOutput: one
// ArrayRecord for all datums, or one per datum when a field's dtype or trailing shape
// differs between datums.
func forwardBackwardToProto(r *loopsv1.ForwardBackwardResult) (*publicv1.ForwardBackwardOutput, []string) {
	metrics, dropped := cleanMetrics(r.GetMetrics())
	out := &publicv1.ForwardBackwardOutput{LossFnOutputType: "ArrayRecord", Metrics: metrics}
	outs := r.GetOutputs()
	if len(outs) == 0 {
		return out, dropped
	}
	names := outputFields(outs)
	uniform := true
	for _, k := range names {
		m0 := metaOf(outs[0].GetOutputs()[k])
		for _, o := range outs[1:] {
			if !metaOf(o.GetOutputs()[k]).equal(m0) {
				uniform = false
			}
		}
	}
	if uniform {
		out.LossFnOutputs = []*publicv1.ArrayRecord{arrayRecord(outs, names)}
	} else {
		for _, o := range outs {
			out.LossFnOutputs = append(out.LossFnOutputs, arrayRecord([]*loopsv1.DatumOutput{o}, names))
		}
	}
	return out, dropped
}

func arrayRecord(outs []*loopsv1.DatumOutput, names []string) *publicv1.ArrayRecord {
	rec := &publicv1.ArrayRecord{TypeTag: "ArrayRecord", NumDatums: int64(len(outs)), Fields: map[string]*publicv1.BatchedTensor{}}
	for _, k := range names {
		meta := metaOf(outs[0].GetOutputs()[k])
		bt := &publicv1.BatchedTensor{TrailingShape: meta.trailing}
		offsets := make([]byte, 8, 8*(len(outs)+1))
		var data []byte
		if meta.dtype == loopsv1.Dtype_DTYPE_INT64 {
			bt.Dtype = publicv1.DType_DTYPE_INT64
		} else {
			bt.Dtype = publicv1.DType_DTYPE_FLOAT32
		}
		for _, o := range outs {
			t := o.GetOutputs()[k]
			if bt.Dtype == publicv1.DType_DTYPE_INT64 {
				data = appendInt64s(data, t.GetInt64Data())
			} else {
				data = appendFloat32s(data, t.GetFloat32Data())
			}
			offsets = binary.LittleEndian.AppendUint64(offsets, uint64(len(data)))
		}
		bt.Data, bt.Offsets = data, offsets
		rec.Fields[k] = bt
	}
	return rec
}

func appendFloat32s(b []byte, xs []float32) []byte {
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func appendInt64s(b []byte, xs []int64) []byte {
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

func appendInt32s(b []byte, xs []int32) []byte {
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

// jsonTensorOut is TensorData JSON in results.
type jsonTensorOut struct {
	Data  any     `json:"data"`
	Dtype string  `json:"dtype"`
	Shape []int64 `json:"shape"`
}

// legacyForwardBackward is the JSON result shape of SDKs ≤ 0.24.
type legacyForwardBackward struct {
	LossFnOutputType string                     `json:"loss_fn_output_type"`
	LossFnOutputs    []map[string]jsonTensorOut `json:"loss_fn_outputs"`
	Metrics          map[string]float64         `json:"metrics"`
}

func forwardBackwardToJSON(r *loopsv1.ForwardBackwardResult) (legacyForwardBackward, []string) {
	metrics, dropped := cleanMetrics(r.GetMetrics())
	out := legacyForwardBackward{LossFnOutputType: "ArrayRecord", Metrics: metrics, LossFnOutputs: []map[string]jsonTensorOut{}}
	for _, o := range r.GetOutputs() {
		m := map[string]jsonTensorOut{}
		for k, t := range o.GetOutputs() {
			shape := t.GetShape()
			if t.GetDtype() == loopsv1.Dtype_DTYPE_INT64 {
				if len(shape) == 0 {
					shape = []int64{int64(len(t.GetInt64Data()))}
				}
				m[k] = jsonTensorOut{Data: nonNil(t.GetInt64Data()), Dtype: "int64", Shape: shape}
			} else {
				if len(shape) == 0 {
					shape = []int64{int64(len(t.GetFloat32Data()))}
				}
				m[k] = jsonTensorOut{Data: jsonFloats(t.GetFloat32Data()), Dtype: "float32", Shape: shape}
			}
		}
		out.LossFnOutputs = append(out.LossFnOutputs, m)
	}
	return out, dropped
}

func nonNil[T any](xs []T) []T {
	if xs == nil {
		return []T{}
	}
	return xs
}

// jsonFloats converts float32s for JSON; NaN and ±Inf (which JSON cannot carry) become null.
func jsonFloats(xs []float32) []*float64 {
	out := make([]*float64, len(xs))
	for i, x := range xs {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			continue
		}
		v := float64(x)
		out[i] = &v
	}
	return out
}

// stopReasonProto maps the core stop reason onto the SDK's enum (STOP = 0, LENGTH = 1).
func stopReasonProto(r loopsv1.StopReason) publicv1.StopReason {
	if r == loopsv1.StopReason_STOP_REASON_LENGTH {
		return publicv1.StopReason_STOP_REASON_LENGTH
	}
	return publicv1.StopReason_STOP_REASON_STOP
}

func sampleToProto(r *loopsv1.SampleResult) *publicv1.SampleResponse {
	out := &publicv1.SampleResponse{}
	for _, s := range r.GetSequences() {
		out.Sequences = append(out.Sequences, &publicv1.SampledSequence{
			StopReason:          stopReasonProto(s.GetStopReason()),
			Tokens:              appendInt32s([]byte{}, s.GetTokens()),
			Logprobs:            appendFloat32s([]byte{}, s.GetLogprobs()),
			TopkSampledLogprobs: topkProto(s.GetTopLogprobs()),
		})
	}
	if len(r.GetPromptLogprobs()) > 0 {
		out.PromptLogprobs = appendFloat32s([]byte{}, r.GetPromptLogprobs())
	}
	out.TopkPromptLogprobs = topkProto(r.GetTopkPromptLogprobs())
	out.PromptCacheHitTokens = r.GetPromptCachedTokens()
	if t := r.GetTargetPromptLogprobs(); t != nil {
		out.TargetPromptLogprobs = targetPromptLogprobsProto(t)
	}
	if a := r.GetPromptAltTokens(); a != nil {
		out.PromptAltTokens = promptAltTokensProto(a)
	}
	return out
}

// legacySample is the JSON sample result of SDKs ≤ 0.24.
type legacySample struct {
	Type                 string           `json:"type"`
	Sequences            []legacySequence `json:"sequences"`
	PromptLogprobs       []*float64       `json:"prompt_logprobs,omitempty"`
	TopkPromptLogprobs   [][][2]any       `json:"topk_prompt_logprobs,omitempty"`
	PromptCacheHitTokens int              `json:"prompt_cache_hit_tokens"`
}

type legacySequence struct {
	StopReason string     `json:"stop_reason"`
	Tokens     []int32    `json:"tokens"`
	Logprobs   []*float64 `json:"logprobs,omitempty"`
}

func sampleToJSON(r *loopsv1.SampleResult) legacySample {
	out := legacySample{Type: "sample", Sequences: []legacySequence{}, PromptCacheHitTokens: int(r.GetPromptCachedTokens())}
	for _, s := range r.GetSequences() {
		reason := "stop"
		if s.GetStopReason() == loopsv1.StopReason_STOP_REASON_LENGTH {
			reason = "length"
		}
		ls := legacySequence{StopReason: reason, Tokens: nonNil(s.GetTokens())}
		if len(s.GetLogprobs()) > 0 {
			ls.Logprobs = jsonFloats(s.GetLogprobs())
		}
		out.Sequences = append(out.Sequences, ls)
	}
	if len(r.GetPromptLogprobs()) > 0 {
		out.PromptLogprobs = jsonFloats(r.GetPromptLogprobs())
	}
	if tk := r.GetTopkPromptLogprobs(); tk != nil && tk.GetK() > 0 && tk.GetLength() > 0 {
		k := int(tk.GetK())
		ids, lps := tk.GetTokenIds(), tk.GetLogprobs()
		rows := make([][][2]any, tk.GetLength())
		for i := range rows {
			var row [][2]any
			for j := 0; j < k; j++ {
				idx := i*k + j
				if idx >= len(ids) || idx >= len(lps) {
					break
				}
				if (ids[idx] == 0 && lps[idx] <= -99999) || math.IsNaN(float64(lps[idx])) || math.IsInf(float64(lps[idx]), 0) {
					continue
				}
				row = append(row, [2]any{ids[idx], float64(lps[idx])})
			}
			rows[i] = row
		}
		out.TopkPromptLogprobs = rows
	}
	return out
}
