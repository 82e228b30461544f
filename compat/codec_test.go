package compat

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"image"
	"image/png"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
	"github.com/loops-dev/loops/internal/vision"
)

var testLimits = limits{maxElements: 1 << 20}

func TestGoldenForwardBackwardRequestDecodes(t *testing.T) {
	got, err := decodeForwardBackwardProto(mustHex(t, goldenFBRequest), testLimits)
	require.NoError(t, err)
	want := &loopsv1.ForwardBackwardRequest{
		TrainingRunId: "sess:train:0", SeqId: 1, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{
			Tokens: []int32{1, 2, 3},
			LossFnInputs: map[string]*loopsv1.Tensor{
				"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{3}, Int64Data: []int64{2, 3, 4}},
				"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{3}, Float32Data: []float32{0, 1, 1}},
			},
		}},
	}
	require.Empty(t, cmp.Diff(want, got, protocmp.Transform()))
}

func TestGoldenForwardBackwardOutputEncodes(t *testing.T) {
	res := &loopsv1.ForwardBackwardResult{
		Outputs: []*loopsv1.DatumOutput{{Outputs: map[string]*loopsv1.Tensor{
			"logprobs": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{3}, Float32Data: []float32{-0.5, -1.25, -2}},
		}}},
		Metrics: map[string]float64{"loss:sum": 3.25, "bad_key": 1, "a:b:c": 2},
	}
	got, dropped := forwardBackwardToProto(res)
	require.ElementsMatch(t, []string{"bad_key", "a:b:c"}, dropped)
	var want publicv1.ForwardBackwardOutput
	require.NoError(t, proto.Unmarshal(mustHex(t, goldenFBOutput), &want))
	require.Empty(t, cmp.Diff(&want, got, protocmp.Transform()))
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(got)
	require.NoError(t, err)
	require.Equal(t, mustHex(t, goldenFBOutput), b)
}

func TestGoldenSampleResponseEncodes(t *testing.T) {
	nan := float32(math.NaN())
	res := &loopsv1.SampleResult{
		Sequences: []*loopsv1.SampledSequence{{Tokens: []int32{11, 12}, Logprobs: []float32{-0.1, -0.2},
			StopReason: loopsv1.StopReason_STOP_REASON_LENGTH}},
		PromptLogprobs: []float32{nan, -1.5, -0.25},
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(sampleToProto(res))
	require.NoError(t, err)
	require.Equal(t, mustHex(t, goldenSample), b)

	js := sampleToJSON(res)
	require.Equal(t, "length", js.Sequences[0].StopReason)
	require.Nil(t, js.PromptLogprobs[0])
	require.InDelta(t, -1.5, *js.PromptLogprobs[1], 1e-6)
}

func f32le(xs ...float32) []byte { return appendFloat32s(nil, xs) }

func TestTensorDecoding(t *testing.T) {
	bf := make([]byte, 4)
	binary.LittleEndian.PutUint16(bf, uint16(math.Float32bits(1.5)>>16))
	binary.LittleEndian.PutUint16(bf[2:], uint16(math.Float32bits(-2)>>16))
	i32 := appendInt32s(nil, []int32{-7, 9})
	cases := []struct {
		name string
		in   *publicv1.Tensor
		want *loopsv1.Tensor
		err  string
	}{
		{"bf16 widens", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_BFLOAT16, Encoding: &publicv1.Tensor_Dense{Dense: bf}},
			&loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: []float32{1.5, -2}}, ""},
		{"int32 widens", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_INT32, Shape: []int64{2, 1}, Encoding: &publicv1.Tensor_Dense{Dense: i32}},
			&loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{2, 1}, Int64Data: []int64{-7, 9}}, ""},
		{"csr to dense", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{2, 3},
			Encoding: &publicv1.Tensor_SparseCsr{SparseCsr: &publicv1.SparseCsr{Values: f32le(5, 6), CrowIndices: int64sLE([]int64{0, 1, 2}), ColIndices: int64sLE([]int64{2, 0})}}},
			&loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{2, 3}, Float32Data: []float32{0, 0, 5, 6, 0, 0}}, ""},
		{"ragged bytes", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Encoding: &publicv1.Tensor_Dense{Dense: []byte{1, 2, 3}}}, nil, "not a whole number"},
		{"no dtype", &publicv1.Tensor{Encoding: &publicv1.Tensor_Dense{Dense: []byte{1, 2, 3, 4}}}, nil, "unsupported dtype"},
		{"shape mismatch", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{4}, Encoding: &publicv1.Tensor_Dense{Dense: f32le(1)}}, nil, "needs 4 elements"},
		{"negative shape", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{-1}, Encoding: &publicv1.Tensor_Dense{Dense: f32le(1)}}, nil, "negative"},
		{"huge sparse", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{1 << 40, 1 << 40},
			Encoding: &publicv1.Tensor_SparseCsr{SparseCsr: &publicv1.SparseCsr{}}}, nil, "limit"},
		{"bad col", &publicv1.Tensor{Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{1, 2},
			Encoding: &publicv1.Tensor_SparseCsr{SparseCsr: &publicv1.SparseCsr{Values: f32le(1), CrowIndices: int64sLE([]int64{0, 1}), ColIndices: int64sLE([]int64{5})}}}, nil, "outside"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := tensorFromProto(c.in, testLimits)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Empty(t, cmp.Diff(c.want, got, protocmp.Transform()))
		})
	}
}

func TestForwardBackwardJSONDecodes(t *testing.T) {
	body := `{"forward_backward_input":{"data":[{"model_input":{"chunks":[{"tokens":[1,2],"type":"encoded_text"},{"tokens":[3],"type":"encoded_text"}]},
	  "loss_fn_inputs":{"target_tokens":{"data":[2,3,9223372036854775807],"dtype":"int64","shape":[3]},
	  "weights":{"data":[1],"dtype":"float32","shape":[1,3],"sparse_crow_indices":[0,1],"sparse_col_indices":[1]}}}],
	  "loss_fn":"ppo","loss_fn_config":{"clip_low_threshold":0.8}},"model_id":"run1","seq_id":4,"type":"forward_backward"}`
	got, err := decodeForwardBackwardJSON([]byte(body), false, testLimits, nil)
	require.NoError(t, err)
	want := &loopsv1.ForwardBackwardRequest{TrainingRunId: "run1", SeqId: 4, LossFn: "ppo", LossFnConfig: map[string]float64{"clip_low_threshold": 0.8},
		Data: []*loopsv1.Datum{{Tokens: []int32{1, 2, 3}, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{3}, Int64Data: []int64{2, 3, math.MaxInt64}},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{1, 3}, Float32Data: []float32{0, 1, 0}},
		}}}}
	require.Empty(t, cmp.Diff(want, got, protocmp.Transform()))

	fwd, err := decodeForwardBackwardJSON([]byte(`{"forward_input":{"data":[],"loss_fn":"cross_entropy"},"model_id":"m","seq_id":1}`), false, testLimits, nil)
	require.NoError(t, err)
	require.True(t, fwd.ForwardOnly)

	for _, bad := range []string{
		`{"forward_backward_input":{"data":[{"model_input":{"chunks":[{"type":"image","data":"AA==","format":"png"}]},"loss_fn_inputs":{}}],"loss_fn":"cross_entropy"}}`,
		`{"forward_backward_input":{"data":[{"model_input":{"chunks":[]},"loss_fn_inputs":{"w":{"data":[1.5],"dtype":"int64"}}}],"loss_fn":"cross_entropy"}}`,
		`{"forward_backward_input":{"data":[],"loss_fn":"cross_entropy","loss_fn_config":{"k":"text"}}}`,
		`{"forward_backward_input":{"data":[]}}`,
		`{"model_id":"m"}`,
		`{"forward_backward_input":`,
	} {
		_, err := decodeForwardBackwardJSON([]byte(bad), false, testLimits, nil)
		requireClientError(t, err)
	}
}

func requireClientError(t testing.TB, err error) {
	t.Helper()
	require.Error(t, err)
	status, _, detail := classify(err)
	require.GreaterOrEqual(t, status, 400, detail)
	require.Less(t, status, 500, detail)
	require.NotEmpty(t, detail)
}

func TestLossConfigV2Preferred(t *testing.T) {
	in := &publicv1.ForwardBackwardRequest{ModelId: "m", SeqId: 1, LossFn: "ppo",
		LossFnConfig:   map[string]float64{"clip_low_threshold": 0.5},
		LossFnConfigV2: map[string]*publicv1.LossConfigValue{"clip_low_threshold": {Value: &publicv1.LossConfigValue_Number{Number: 0.7}}}}
	b, _ := proto.Marshal(in)
	got, err := decodeForwardBackwardProto(b, testLimits)
	require.NoError(t, err)
	require.Equal(t, 0.7, got.LossFnConfig["clip_low_threshold"])

	in.LossFnConfigV2["mode"] = &publicv1.LossConfigValue{Value: &publicv1.LossConfigValue_Text{Text: "x"}}
	b, _ = proto.Marshal(in)
	_, err = decodeForwardBackwardProto(b, testLimits)
	requireClientError(t, err)

}

// testPNG is a w×h PNG.
func testPNG(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))))
	return b.Bytes()
}

// TestImageChunks: image chunks (protobuf and JSON) become Datum.images with placeholder
// tokens; a bad image, a missing expected_tokens, an asset pointer or a dmel chunk is a 400
// that says why. Whether the model takes images is the core's check (vision.Check).
func TestImageChunks(t *testing.T) {
	pic := testPNG(t, 48, 40)
	three := int32(3)
	in := &publicv1.ForwardBackwardRequest{ModelId: "m", LossFn: "cross_entropy", Data: []*publicv1.Datum{{ModelInput: []*publicv1.Chunk{
		{Chunk: &publicv1.Chunk_EncodedText{EncodedText: &publicv1.EncodedTextChunk{Tokens: []byte{7, 0, 0, 0}}}},
		{Chunk: &publicv1.Chunk_Image{Image: &publicv1.ImageChunk{Data: pic, Format: "png", ExpectedTokens: &three}}},
		{Chunk: &publicv1.Chunk_EncodedText{EncodedText: &publicv1.EncodedTextChunk{Tokens: []byte{8, 0, 0, 0}}}}}}}}
	b, _ := proto.Marshal(in)
	got, err := decodeForwardBackwardProto(b, testLimits)
	require.NoError(t, err)
	want := &loopsv1.Datum{Tokens: []int32{7, 0, 0, 0, 8}, Images: []*loopsv1.Image{{Data: pic, Format: "png", Offset: 1, Tokens: 3, Width: 48, Height: 40}}}
	require.Empty(t, cmp.Diff(want, got.GetData()[0], protocmp.Transform()))

	js := fmt.Sprintf(`{"forward_backward_input":{"data":[{"model_input":{"chunks":[{"type":"encoded_text","tokens":[7]},{"type":"image","data":%q,"format":"png","expected_tokens":3},{"type":"encoded_text","tokens":[8]}]},"loss_fn_inputs":{}}],"loss_fn":"cross_entropy"}}`,
		base64.StdEncoding.EncodeToString(pic))
	gotJ, err := decodeForwardBackwardJSON([]byte(js), false, testLimits, nil)
	require.NoError(t, err)
	require.Empty(t, cmp.Diff(want, gotJ.GetData()[0], protocmp.Transform()))

	in.Data[0].ModelInput[1] = &publicv1.Chunk{Chunk: &publicv1.Chunk_Image{Image: &publicv1.ImageChunk{Data: []byte{1}, Format: "png", ExpectedTokens: &three}}}
	b, _ = proto.Marshal(in)
	_, err = decodeForwardBackwardProto(b, testLimits)
	requireClientError(t, err)
	require.ErrorContains(t, err, "data[0].model_input[1]: the image is not a readable png")

	img := base64.StdEncoding.EncodeToString(pic)
	for chunk, why := range map[string]string{
		fmt.Sprintf(`{"type":"image","data":%q,"format":"png"}`, img):                                              "without expected_tokens",
		fmt.Sprintf(`{"type":"image","data":%q,"format":"jpeg","expected_tokens":3}`, img):                         `set format to "png"`,
		fmt.Sprintf(`{"type":"image","data":%q,"format":"png","expected_tokens":-1}`, img):                         "expected_tokens -1 is out of range",
		fmt.Sprintf(`{"type":"image","data":%q,"format":"png","expected_tokens":1e9}`, img):                        "",
		`{"type":"image_asset_pointer","location":"https://example.com/a.png","format":"png","expected_tokens":3}`: "this server fetches no images",
		`{"type":"image_asset_pointer","location":"https://example.com/a.png","format":"png"}`:                     "set expected_tokens",
		`{"type":"dmel","dmel":"AA=="}`: "dmel chunks are not served",
	} {
		_, err := decodeForwardBackwardJSON([]byte(`{"forward_backward_input":{"data":[{"model_input":{"chunks":[`+chunk+`]},"loss_fn_inputs":{}}],"loss_fn":"cross_entropy"}}`), false, testLimits, nil)
		requireClientError(t, err)
		require.ErrorContains(t, err, why, chunk)
	}
	many := strings.Repeat(fmt.Sprintf(`{"type":"image","data":%q,"format":"png","expected_tokens":1},`, img), vision.MaxImages)
	_, err = decodeForwardBackwardJSON([]byte(`{"forward_backward_input":{"data":[{"model_input":{"chunks":[`+many+`{"type":"encoded_text","tokens":[1]}]},"loss_fn_inputs":{}},{"model_input":{"chunks":[`+many[:len(many)-1]+`]},"loss_fn_inputs":{}}],"loss_fn":"cross_entropy"}}`), false, testLimits, nil)
	require.ErrorContains(t, err, "more than 16 images")
}

// An image_asset_pointer chunk's image is fetched (the fetcher the operator configured) and
// placed as an image chunk with the fetched bytes; a fetch that fails, or fetched bytes that
// are not the image the chunk says, are a 400 naming the chunk; nothing is fetched for a
// chunk whose format or expected_tokens is wrong, or past the request's image limit.
func TestImageAssetPointers(t *testing.T) {
	pic := testPNG(t, 48, 40)
	var asked []string
	fetch := func(loc string) ([]byte, error) {
		asked = append(asked, loc)
		switch loc {
		case "https://img.example/a.png":
			return pic, nil
		case "https://img.example/text":
			return []byte("not an image"), nil
		}
		return nil, errString(`host "elsewhere" is not one this server fetches images from (img.example)`)
	}
	images := 0
	toks, ims, err := chunksToInput([]jsonChunk{{Type: "encoded_text", Tokens: []int64{3}},
		{Type: "image_asset_pointer", Location: "https://img.example/a.png", Format: "png", ExpectedTokens: ptr(int64(4))}}, &images, fetch)
	require.NoError(t, err)
	require.Equal(t, []int32{3, 0, 0, 0, 0}, toks)
	require.Len(t, ims, 1)
	require.Equal(t, pic, ims[0].GetData())
	require.Equal(t, [4]int32{1, 4, 48, 40}, [4]int32{ims[0].GetOffset(), ims[0].GetTokens(), ims[0].GetWidth(), ims[0].GetHeight()})

	asked = nil
	for _, tc := range []struct {
		c    jsonChunk
		want string
	}{
		{jsonChunk{Type: "image_asset_pointer", Location: "https://elsewhere/a.png", Format: "png", ExpectedTokens: ptr(int64(4))}, `host "elsewhere" is not one this server fetches images from`},
		{jsonChunk{Type: "image_asset_pointer", Location: "https://img.example/text", Format: "png", ExpectedTokens: ptr(int64(4))}, "the image is not a readable png"},
		{jsonChunk{Type: "image_asset_pointer", Location: "https://img.example/a.png", Format: "gif", ExpectedTokens: ptr(int64(4))}, `format "gif" is not served`},
		{jsonChunk{Type: "image_asset_pointer", Location: "https://img.example/a.png", Format: "png"}, "set expected_tokens"},
	} {
		images := 0
		_, _, err := chunksToInput([]jsonChunk{tc.c}, &images, fetch)
		require.ErrorContains(t, err, "chunk 0 (image_asset_pointer): "+tc.want)
	}
	require.Equal(t, []string{"https://elsewhere/a.png", "https://img.example/text"}, asked, "a chunk refused from its fields is never fetched")

	asked, images = nil, vision.MaxImages
	_, _, err = chunksToInput([]jsonChunk{{Type: "image_asset_pointer", Location: "https://img.example/a.png", Format: "png", ExpectedTokens: ptr(int64(4))}}, &images, fetch)
	require.ErrorContains(t, err, "more than 16 images")
	require.Empty(t, asked)
}

// FuzzImageChunk: any image chunk in a sample prompt decodes to a 4xx or to a prompt whose
// images passed vision.Header and whose placeholders are where Datum.images says.
func FuzzImageChunk(f *testing.F) {
	f.Add(testPNG(f, 48, 40), "png", int64(6))
	f.Add([]byte("\x89PNG\r\n\x1a\n"), "png", int64(1))
	f.Add([]byte{0xff, 0xd8, 0xff}, "jpeg", int64(0))
	f.Fuzz(func(t *testing.T, data []byte, format string, expected int64) {
		images := 0
		toks, ims, err := chunksToInput([]jsonChunk{{Type: "encoded_text", Tokens: []int64{3}}, {Type: "image", Data: data, Format: format, ExpectedTokens: &expected}}, &images, nil)
		if err != nil {
			requireClientError(t, badRequest("%v", err))
			return
		}
		require.Len(t, ims, 1)
		w, h, err := vision.Header(ims[0].GetData(), ims[0].GetFormat())
		require.NoError(t, err)
		require.Equal(t, [2]int32{int32(w), int32(h)}, [2]int32{ims[0].GetWidth(), ims[0].GetHeight()})
		require.Len(t, toks, 1+int(expected))
		require.LessOrEqual(t, expected, int64(vision.MaxTokens))
	})
}

type errString string

func (e errString) Error() string { return string(e) }

func ptr[T any](v T) *T { return &v }
