// Package benchdata builds the inputs the benchmarks share, so each measures the same work,
// and runs the `loops serve` process that the process-level benchmarks measure.
package benchdata

import loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"

// Datum is a cross_entropy datum of n tokens over the letters A–Z (token ids 65–90, inside
// every built-in vocabulary), each position targeting the next letter, all weights 1.
func Datum(n int) *loopsv1.Datum {
	d := &loopsv1.Datum{LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32},
	}}
	for i := range n {
		d.Tokens = append(d.Tokens, int32(65+i%26))
		d.LossFnInputs["target_tokens"].Int64Data = append(d.LossFnInputs["target_tokens"].Int64Data, int64(65+(i+1)%26))
		d.LossFnInputs["weights"].Float32Data = append(d.LossFnInputs["weights"].Float32Data, 1)
	}
	return d
}
