package compat

import (
	"encoding/binary"
	"encoding/json"

	"math"
	"strconv"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
	"github.com/loops-dev/loops/internal/semantics"
)

// targetPromptTokens decodes a SampleRequest's target_prompt_logprobs: an int64 TensorData
// of token ids, [len(prompt) - 1, K], dense or sparse CSR (unlisted cells are -1, "no
// id"). The core checks the ids against the model; this checks the layout and bounds what
// it allocates (K at most semantics.MaxTopKPromptLogprobs, as a top-k width).
func targetPromptTokens(raw json.RawMessage, promptLen int) (*loopsv1.TargetPromptTokens, error) {
	if isNull(raw) {
		return nil, nil
	}
	var t jsonTensorData
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, badRequest("target_prompt_logprobs must be TensorData (data, dtype, shape): %v", err)
	}
	if t.Dtype != "int64" {
		return nil, badRequest("target_prompt_logprobs must be an int64 tensor of token ids, got dtype %q", t.Dtype)
	}
	if len(t.Shape) != 2 {
		return nil, badRequest("target_prompt_logprobs must be 2-D, [len(prompt) - 1, K], got shape %v", t.Shape)
	}
	rows, k := t.Shape[0], t.Shape[1]
	switch {
	case promptLen < 2:
		return nil, badRequest("target_prompt_logprobs needs a prompt of at least 2 tokens: position 0 has no preceding context")
	case rows != int64(promptLen-1):
		return nil, badRequest("target_prompt_logprobs has %d rows; a prompt of %d tokens needs %d (len(prompt) - 1)", rows, promptLen, promptLen-1)
	case k < 1 || k > semantics.MaxTopKPromptLogprobs:
		return nil, badRequest("target_prompt_logprobs has %d ids per position; Loops scores 1 to %d (the top-k width bound)", k, semantics.MaxTopKPromptLogprobs)
	}
	out := &loopsv1.TargetPromptTokens{K: int32(k), TokenIds: make([]int32, rows*k)}
	id := func(i int, n json.Number) (int32, error) {
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || v < math.MinInt32 || v > math.MaxInt32 {
			return 0, badRequest("target_prompt_logprobs data[%d] = %s is not a token id", i, n)
		}
		return int32(v), nil
	}
	if t.SparseCrowIndices == nil && t.SparseColIndices == nil {
		if int64(len(t.Data)) != rows*k {
			return nil, badRequest("target_prompt_logprobs has %d values for shape %v (%d)", len(t.Data), t.Shape, rows*k)
		}
		for i, n := range t.Data {
			v, err := id(i, n)
			if err != nil {
				return nil, err
			}
			out.TokenIds[i] = v
		}
		return out, nil
	}
	crow, col := t.SparseCrowIndices, t.SparseColIndices
	nnz := int64(len(t.Data))
	switch {
	case crow == nil || col == nil:
		return nil, badRequest("target_prompt_logprobs: sparse_crow_indices and sparse_col_indices must be sent together")
	case int64(len(crow)) != rows+1:
		return nil, badRequest("target_prompt_logprobs: sparse_crow_indices has %d entries; %d rows need %d", len(crow), rows, rows+1)
	case int64(len(col)) != nnz:
		return nil, badRequest("target_prompt_logprobs: sparse_col_indices has %d entries for %d values", len(col), nnz)
	case crow[0] != 0 || crow[rows] != nnz:
		return nil, badRequest("target_prompt_logprobs: sparse_crow_indices must start at 0 and end at the value count %d", nnz)
	}
	out.Sparse = true
	for i := range out.TokenIds {
		out.TokenIds[i] = -1
	}
	seen := make([]bool, rows*k)
	for r := int64(0); r < rows; r++ {
		lo, hi := crow[r], crow[r+1]
		if lo > hi || hi > nnz {
			return nil, badRequest("target_prompt_logprobs: sparse_crow_indices are not non-decreasing at row %d", r)
		}
		for e := lo; e < hi; e++ {
			c := col[e]
			if c < 0 || c >= k {
				return nil, badRequest("target_prompt_logprobs: sparse column %d of row %d is outside [0, %d)", c, r, k)
			}
			if seen[r*k+c] {
				return nil, badRequest("target_prompt_logprobs: row %d lists column %d twice", r, c)
			}
			seen[r*k+c] = true
			v, err := id(int(e), t.Data[e])
			if err != nil {
				return nil, err
			}
			out.TokenIds[r*k+c] = v
		}
	}
	return out, nil
}

// targetPromptLogprobsProto is SampleResponse.target_prompt_logprobs: float32 in the
// request's layout, [len(prompt) - 1, K]; dense with 0.0 where the id was -1, or sparse CSR
// listing the cells the request named.
func targetPromptLogprobsProto(t *loopsv1.TargetPromptLogprobs) *publicv1.Tensor {
	k := int(t.GetK())
	lps := t.GetLogprobs()
	if k < 1 || len(lps)%k != 0 {
		return nil
	}
	rows := len(lps) / k
	out := &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{int64(rows), int64(k)}}
	if !t.GetSparse() {
		dense := make([]byte, 0, 4*len(lps))
		for _, v := range lps {
			if math.IsNaN(float64(v)) {
				v = 0
			}
			dense = binary.LittleEndian.AppendUint32(dense, math.Float32bits(v))
		}
		out.Encoding = &publicv1.Tensor_Dense{Dense: dense}
		return out
	}
	csr := &publicv1.SparseCsr{CrowIndices: binary.LittleEndian.AppendUint64(nil, 0)}
	n := 0
	for r := range rows {
		for c := range k {
			if v := lps[r*k+c]; !math.IsNaN(float64(v)) {
				csr.Values = binary.LittleEndian.AppendUint32(csr.Values, math.Float32bits(v))
				csr.ColIndices = binary.LittleEndian.AppendUint64(csr.ColIndices, uint64(c))
				n++
			}
		}
		csr.CrowIndices = binary.LittleEndian.AppendUint64(csr.CrowIndices, uint64(n))
	}
	if csr.Values == nil {
		csr.Values, csr.ColIndices = []byte{}, []byte{}
	}
	out.Encoding = &publicv1.Tensor_SparseCsr{SparseCsr: csr}
	return out
}

// promptAltTokensProto is SampleResponse.prompt_alt_tokens: two dense [len(prompt) - 1, k]
// tensors, int64 token ids and float32 log-probs.
func promptAltTokensProto(a *loopsv1.PromptAltTokens) *publicv1.PromptAltTokens {
	k := int(a.GetK())
	ids, lps := a.GetTokenIds(), a.GetLogprobs()
	if k < 1 || len(ids)%k != 0 || len(lps) != len(ids) {
		return nil
	}
	shape := []int64{int64(len(ids) / k), int64(k)}
	wide := make([]int64, len(ids))
	for i, t := range ids {
		wide[i] = int64(t)
	}
	return &publicv1.PromptAltTokens{
		Tokens:   &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_INT64, Shape: shape, Encoding: &publicv1.Tensor_Dense{Dense: appendInt64s([]byte{}, wide)}},
		Logprobs: &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: append([]int64(nil), shape...), Encoding: &publicv1.Tensor_Dense{Dense: appendFloat32s([]byte{}, lps)}},
	}
}

// topkProto is a TopKLogprobs on the SDK's wire (nil when it holds nothing).
func topkProto(tk *loopsv1.TopKLogprobs) *publicv1.TopkLogprobs {
	if tk == nil || tk.GetK() <= 0 || tk.GetLength() <= 0 {
		return nil
	}
	return &publicv1.TopkLogprobs{
		TokenIds: appendInt32s(nil, tk.GetTokenIds()),
		Logprobs: appendFloat32s(nil, tk.GetLogprobs()),
		K:        uint32(tk.GetK()),
		Length:   uint32(tk.GetLength()),
	}
}
