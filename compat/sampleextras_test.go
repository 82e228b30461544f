package compat

import (
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

// TestSamplePromptExtras: topk_sample_logprobs, target_prompt_logprobs (dense and sparse
// CSR), prompt_alt_tokens_k and prompt_logprobs_last_n reach the core as loops.v1 fields,
// and their results come back on the SDK's protobuf wire in the request's layout.
func TestSamplePromptExtras(t *testing.T) {
	e := newEnv(t)
	sid := e.postJSON("/api/v1/create_session", `{}`).json(t)["session_id"].(string)
	smp := e.postJSON("/api/v1/create_sampling_session", fmt.Sprintf(`{"session_id":%q,"base_model":"Qwen/Qwen3-8B"}`, sid)).json(t)["sampling_session_id"].(string)
	ask := func(extra string) *loopsv1.SampleRequest {
		t.Helper()
		r := e.postJSON("/api/v1/asample", fmt.Sprintf(`{"num_samples":1,"prompt":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},
			"sampling_params":{"max_tokens":2},"sampling_session_id":%q,"seq_id":7,"prompt_logprobs":true%s}`, smp, extra))
		require.Equal(t, 200, r.status, string(r.body))
		return e.core.lastReq("Sample").(*loopsv1.SampleRequest)
	}
	got := ask(`,"topk_sample_logprobs":3,"prompt_alt_tokens_k":2,"prompt_logprobs_last_n":1,
		"target_prompt_logprobs":{"data":[5,-1,7,8],"dtype":"int64","shape":[2,2]}`)
	require.Empty(t, cmp.Diff(&loopsv1.TargetPromptTokens{K: 2, TokenIds: []int32{5, -1, 7, 8}}, got.GetTargetPromptTokens(), protocmp.Transform()))
	require.Equal(t, int32(3), got.GetParams().GetTopLogprobs())
	require.Equal(t, int32(2), got.GetPromptAltTokensK())
	require.Equal(t, int32(1), got.GetPromptLogprobsLastN())

	// sparse: row 0 names column 1, row 1 names nothing; unlisted cells are -1
	got = ask(`,"target_prompt_logprobs":{"data":[9],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,1,1],"sparse_col_indices":[1]}`)
	require.Empty(t, cmp.Diff(&loopsv1.TargetPromptTokens{K: 2, TokenIds: []int32{-1, 9, -1, -1}, Sparse: true}, got.GetTargetPromptTokens(), protocmp.Transform()))

	nan := float32(math.NaN())
	res := &loopsv1.SampleResult{
		Sequences: []*loopsv1.SampledSequence{{Tokens: []int32{5, 6}, Logprobs: []float32{-1, -2}, StopReason: loopsv1.StopReason_STOP_REASON_LENGTH,
			TopLogprobs: &loopsv1.TopKLogprobs{K: 2, Length: 2, TokenIds: []int32{5, 4, 3, 6}, Logprobs: []float32{-1, -1.5, -0.5, -2}}}},
		TargetPromptLogprobs: &loopsv1.TargetPromptLogprobs{K: 2, Logprobs: []float32{nan, -3, nan, nan}, Sparse: true},
		PromptAltTokens:      &loopsv1.PromptAltTokens{K: 2, TokenIds: []int32{4, 4, 1, 2}, Logprobs: []float32{-0.1, -0.1, -2, -3}},
	}
	sr := sampleToProto(res)
	require.Equal(t, &publicv1.TopkLogprobs{K: 2, Length: 2, TokenIds: appendInt32s(nil, []int32{5, 4, 3, 6}), Logprobs: appendFloat32s(nil, []float32{-1, -1.5, -0.5, -2})},
		sr.Sequences[0].GetTopkSampledLogprobs())
	tp := sr.GetTargetPromptLogprobs()
	require.Equal(t, []int64{2, 2}, tp.GetShape())
	require.Equal(t, publicv1.DType_DTYPE_FLOAT32, tp.GetDtype())
	require.Equal(t, appendFloat32s(nil, []float32{-3}), tp.GetSparseCsr().GetValues())
	require.Equal(t, appendInt64s(nil, []int64{0, 1, 1}), tp.GetSparseCsr().GetCrowIndices())
	require.Equal(t, appendInt64s(nil, []int64{1}), tp.GetSparseCsr().GetColIndices())
	res.TargetPromptLogprobs.Sparse = false
	tp = sampleToProto(res).GetTargetPromptLogprobs()
	require.Equal(t, appendFloat32s(nil, []float32{0, -3, 0, 0}), tp.GetDense(), "dense: 0.0 where the id was -1")
	alt := sr.GetPromptAltTokens()
	require.Equal(t, []int64{2, 2}, alt.GetTokens().GetShape())
	require.Equal(t, publicv1.DType_DTYPE_INT64, alt.GetTokens().GetDtype())
	require.Equal(t, appendInt64s(nil, []int64{4, 4, 1, 2}), alt.GetTokens().GetDense())
	require.Equal(t, appendFloat32s(nil, []float32{-0.1, -0.1, -2, -3}), alt.GetLogprobs().GetDense())
	b, err := proto.Marshal(sr)
	require.NoError(t, err)
	require.NotEmpty(t, b)

	for _, bad := range []struct{ extra, want string }{
		{`,"topk_sample_logprobs":21`, "topk_sample_logprobs = 21 is out of range"},
		{`,"topk_sample_logprobs":-1`, "topk_sample_logprobs = -1 is out of range"},
		{`,"prompt_alt_tokens_k":101`, "prompt_alt_tokens_k = 101 is out of range"},
		{`,"prompt_logprobs_last_n":0`, "prompt_logprobs_last_n = 0 is out of range"},
		{`,"target_prompt_logprobs":{"data":[1.5,1,1,1],"dtype":"float32","shape":[2,2]}`, "must be an int64 tensor"},
		{`,"target_prompt_logprobs":{"data":[1,1],"dtype":"int64","shape":[2]}`, "must be 2-D"},
		{`,"target_prompt_logprobs":{"data":[1,1,1],"dtype":"int64","shape":[3,1]}`, "a prompt of 3 tokens needs 2"},
		{`,"target_prompt_logprobs":{"data":[1,1,1],"dtype":"int64","shape":[2,2]}`, "3 values for shape"},
		{`,"target_prompt_logprobs":{"data":[],"dtype":"int64","shape":[2,0]}`, "Loops scores 1 to 100"},
		{`,"target_prompt_logprobs":{"data":[1],"dtype":"int64","shape":[2,101],"sparse_crow_indices":[0,1,1],"sparse_col_indices":[0]}`, "Loops scores 1 to 100"},
		{`,"target_prompt_logprobs":{"data":[1,2],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,2,2],"sparse_col_indices":[1,1]}`, "lists column 1 twice"},
		{`,"target_prompt_logprobs":{"data":[1],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,1,1],"sparse_col_indices":[2]}`, "outside [0, 2)"},
		{`,"target_prompt_logprobs":{"data":[1],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,1],"sparse_col_indices":[0]}`, "2 rows need 3"},
		{`,"target_prompt_logprobs":{"data":[4294967296,1,1,1],"dtype":"int64","shape":[2,2]}`, "is not a token id"},
		{`,"target_prompt_logprobs":"x"`, "must be TensorData"},
	} {
		r := e.postJSON("/api/v1/asample", fmt.Sprintf(`{"prompt":{"chunks":[{"tokens":[1,2,3]}]},"sampling_params":{},"sampling_session_id":%q,"prompt_logprobs":true%s}`, smp, bad.extra))
		require.Equal(t, 400, r.status, bad.extra)
		require.Contains(t, string(r.body), bad.want, bad.extra)
	}
}

// FuzzTargetPromptTokens decodes arbitrary target_prompt_logprobs JSON: it never panics,
// a decoded tensor has the layout it says ([promptLen - 1, K], ids ≥ -1 or anything an
// int32 holds, K bounded), and its answer, encoded as the SDK reads it, lists in a sparse
// request exactly the cells the request listed with an id other than -1.
func FuzzTargetPromptTokens(f *testing.F) {
	f.Add([]byte(`{"data":[5,-1,7,8],"dtype":"int64","shape":[2,2]}`), uint8(3))
	f.Add([]byte(`{"data":[9],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,1,1],"sparse_col_indices":[1]}`), uint8(3))
	f.Add([]byte(`{"data":[1,2],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,2,2],"sparse_col_indices":[1,1]}`), uint8(3))
	f.Add([]byte(`{"data":[1],"dtype":"int64","shape":[1,1]}`), uint8(2))
	f.Add([]byte(`null`), uint8(5))
	f.Fuzz(func(t *testing.T, raw []byte, n uint8) {
		promptLen := int(n)
		tp, err := targetPromptTokens(raw, promptLen)
		if err != nil || tp == nil {
			return
		}
		k := int(tp.GetK())
		if k < 1 || k > 100 || len(tp.GetTokenIds()) != (promptLen-1)*k {
			t.Fatalf("decoded k %d with %d ids for a prompt of %d", k, len(tp.GetTokenIds()), promptLen)
		}
		lps := make([]float32, len(tp.GetTokenIds()))
		named := 0
		for i, id := range tp.GetTokenIds() {
			if id == -1 {
				lps[i] = float32(math.NaN())
			} else {
				lps[i] = -1
				named++
			}
		}
		out := targetPromptLogprobsProto(&loopsv1.TargetPromptLogprobs{K: tp.GetK(), Logprobs: lps, Sparse: tp.GetSparse()})
		if out == nil {
			t.Fatal("no answer for a decoded request")
		}
		if tp.GetSparse() {
			if got := len(out.GetSparseCsr().GetValues()) / 4; got != named {
				t.Fatalf("the sparse answer lists %d cells, the request named %d", got, named)
			}
		} else if len(out.GetDense()) != 4*len(lps) {
			t.Fatalf("dense answer of %d bytes for %d cells", len(out.GetDense()), len(lps))
		}
	})
}
