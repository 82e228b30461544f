package compat

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
	"github.com/loops-dev/loops/internal/imagefetch"
	"github.com/loops-dev/loops/internal/shape"
	"github.com/loops-dev/loops/internal/vision"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// noDmel is the message for the model input chunks Loops does not take.
const (
	noDmel = "dmel chunks are not served: send encoded_text and image chunks"
)

// inputBuilder turns a model input's chunks into a token list and its images (Datum.images):
// an image chunk's expected_tokens positions hold the placeholder 0. Every image's bytes,
// format and pixel size are checked (vision.Header) as it is added; images counts a whole
// request's, against vision.MaxImages.
type inputBuilder struct {
	tokens []int32
	images []*loopsv1.Image
	count  *int
}

// image adds an image chunk. expected is its expected_tokens (nil: not given).
func (b *inputBuilder) image(data []byte, format string, expected *int64) error {
	if *b.count++; *b.count > vision.MaxImages {
		return fmt.Errorf("the request has more than %d images, the limit: split it", vision.MaxImages)
	}
	w, h, err := vision.Header(data, format)
	if err != nil {
		return err
	}
	switch {
	case expected == nil:
		return fmt.Errorf("image chunk without expected_tokens: set it to the number of tokens the model makes of the image (the server checks it; ModelInput.length needs it too)")
	case *expected < 1 || *expected > vision.MaxTokens:
		return fmt.Errorf("expected_tokens %d is out of range [1, %d]", *expected, vision.MaxTokens)
	}
	n := int(*expected)
	b.images = append(b.images, &loopsv1.Image{Data: data, Format: format, Offset: int32(len(b.tokens)), Tokens: int32(n), Width: int32(w), Height: int32(h)})
	b.tokens = append(b.tokens, make([]int32, n)...)
	return nil
}

// assetPointer adds an image_asset_pointer chunk: its format and expected_tokens are
// checked first, then its location against the allowed hosts, then it is fetched and
// added as an image chunk with the fetched bytes.
func (b *inputBuilder) assetPointer(c jsonChunk, fetch fetchImage) error {
	if !slices.Contains(vision.Formats, c.Format) {
		return fmt.Errorf("format %q is not served: send %q or %q", c.Format, "png", "jpeg")
	}
	if c.ExpectedTokens == nil || *c.ExpectedTokens < 1 || *c.ExpectedTokens > vision.MaxTokens {
		return fmt.Errorf("set expected_tokens to the number of tokens the model makes of the image, from 1 to %d", vision.MaxTokens)
	}
	if *b.count >= vision.MaxImages {
		return fmt.Errorf("the request has more than %d images, the limit: split it", vision.MaxImages)
	}
	if fetch == nil {
		var none *imagefetch.Fetcher
		_, err := none.Allowed(c.Location)
		return err
	}
	data, err := fetch(c.Location)
	if err != nil {
		return err
	}
	return b.image(data, c.Format, c.ExpectedTokens)
}

// limits bounds what a decoder may allocate.
type limits struct {
	// maxElements caps the element count of one dense tensor built by compat.
	maxElements int64
}

func (s *server) limits() limits {
	return limits{maxElements: s.opt.MaxDecompressedBytes / 4}
}

// ---------------------------------------------------------------------------------------
// forward_backward request: protobuf (SDK ≥ 0.19) and JSON (SDK ≤ 0.24).

// decodeForwardBackwardProto decodes a tinker.public.v1.ForwardBackwardRequest body into
// the core request. The model id is not resolved here.
func decodeForwardBackwardProto(b []byte, lim limits) (*loopsv1.ForwardBackwardRequest, error) {
	var in publicv1.ForwardBackwardRequest
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &in); err != nil {
		return nil, badRequest("the forward_backward body is not a valid tinker ForwardBackwardRequest protobuf: %v", err)
	}
	out := &loopsv1.ForwardBackwardRequest{
		TrainingRunId: in.GetModelId(),
		SeqId:         int64(in.GetSeqId()),
		LossFn:        in.GetLossFn(),
		ForwardOnly:   in.GetForwardOnly(),
	}
	if out.LossFn == "" {
		return nil, badRequest("loss_fn is required (e.g. \"cross_entropy\")")
	}
	if len(in.GetLossFnConfigV2()) > 0 {
		out.LossFnConfig = make(map[string]float64, len(in.GetLossFnConfigV2()))
		for k, v := range in.GetLossFnConfigV2() {
			switch x := v.GetValue().(type) {
			case *publicv1.LossConfigValue_Number:
				out.LossFnConfig[k] = x.Number
			case *publicv1.LossConfigValue_Text:
				return nil, badRequest("loss_fn_config[%q] is a string (%q); Loops supports only numeric loss_fn_config values", k, x.Text)
			default:
				return nil, badRequest("loss_fn_config[%q] has no value", k)
			}
		}
	} else if len(in.GetLossFnConfig()) > 0 {
		out.LossFnConfig = make(map[string]float64, len(in.GetLossFnConfig()))
		for k, v := range in.GetLossFnConfig() {
			out.LossFnConfig[k] = v
		}
	}
	var total int64
	images := 0
	for i, d := range in.GetData() {
		od := &loopsv1.Datum{}
		b := inputBuilder{count: &images}
		for j, c := range d.GetModelInput() {
			switch x := c.GetChunk().(type) {
			case *publicv1.Chunk_EncodedText:
				toks, err := decodeInt32LE(x.EncodedText.GetTokens())
				if err != nil {
					return nil, badRequest("data[%d].model_input[%d].tokens: %v", i, j, err)
				}
				b.tokens = append(b.tokens, toks...)
			case *publicv1.Chunk_Image:
				var exp *int64
				if x.Image.ExpectedTokens != nil {
					e := int64(x.Image.GetExpectedTokens())
					exp = &e
				}
				if x.Image.GetOverrideDimensions() != nil {
					return nil, badRequest("data[%d].model_input[%d]: override_dimensions is not served: resize the image before sending it", i, j)
				}
				if err := b.image(x.Image.GetData(), x.Image.GetFormat(), exp); err != nil {
					return nil, badRequest("data[%d].model_input[%d]: %v", i, j, err)
				}
			case *publicv1.Chunk_Dmel:
				return nil, badRequest("data[%d].model_input[%d]: %s", i, j, noDmel)
			default:
				return nil, badRequest("data[%d].model_input[%d] is an empty chunk; send an encoded_text chunk", i, j)
			}
		}
		od.Tokens, od.Images = b.tokens, b.images
		if len(d.GetLossFnInputs()) > 0 {
			od.LossFnInputs = make(map[string]*loopsv1.Tensor, len(d.GetLossFnInputs()))
			for _, k := range sortedKeys(d.GetLossFnInputs()) {
				t, err := tensorFromProto(d.GetLossFnInputs()[k], lim)
				if err != nil {
					return nil, badRequest("data[%d].loss_fn_inputs[%q]: %v", i, k, err)
				}
				total += tensorLen(t)
				if total > lim.maxElements {
					return nil, tooLarge("the request's tensors hold more than %d elements; send smaller forward_backward chunks", lim.maxElements)
				}
				od.LossFnInputs[k] = t
			}
		}
		out.Data = append(out.Data, od)
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func tensorLen(t *loopsv1.Tensor) int64 {
	return int64(len(t.GetFloat32Data()) + len(t.GetInt64Data()))
}

// decodeInt32LE decodes little-endian int32s.
func decodeInt32LE(b []byte) ([]int32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of int32 little-endian values", len(b))
	}
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

// elemSize is the byte width of a tinker dtype, 0 if unknown.
func elemSize(dt publicv1.DType) int {
	switch dt {
	case publicv1.DType_DTYPE_FLOAT32, publicv1.DType_DTYPE_INT32:
		return 4
	case publicv1.DType_DTYPE_INT64:
		return 8
	case publicv1.DType_DTYPE_BFLOAT16:
		return 2
	}
	return 0
}

func isFloat(dt publicv1.DType) bool {
	return dt == publicv1.DType_DTYPE_FLOAT32 || dt == publicv1.DType_DTYPE_BFLOAT16
}

// tensorValues decodes raw bytes of dtype dt, widening int32 to int64 and bfloat16 to
// float32. Exactly one of the results is non-nil (or both empty).
func tensorValues(b []byte, dt publicv1.DType) ([]float32, []int64, error) {
	sz := elemSize(dt)
	if sz == 0 {
		return nil, nil, fmt.Errorf("unsupported dtype %v; use FLOAT32, INT64, INT32 or BFLOAT16", dt)
	}
	if len(b)%sz != 0 {
		return nil, nil, fmt.Errorf("%d bytes is not a whole number of %v values (%d bytes each)", len(b), dt, sz)
	}
	n := len(b) / sz
	switch dt {
	case publicv1.DType_DTYPE_FLOAT32:
		f := make([]float32, n)
		for i := range f {
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return f, nil, nil
	case publicv1.DType_DTYPE_BFLOAT16:
		f := make([]float32, n)
		for i := range f {
			f[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
		return f, nil, nil
	case publicv1.DType_DTYPE_INT32:
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return nil, v, nil
	default: // INT64
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		return nil, v, nil
	}
}

// shapeElements checks a shape and returns its element count.
func shapeElements(dims []int64, lim limits) (int64, error) {
	return shape.Elements(dims, lim.maxElements)
}

// tensorFromProto converts a tinker Tensor (dense or CSR) into a dense loops Tensor.
func tensorFromProto(t *publicv1.Tensor, lim limits) (*loopsv1.Tensor, error) {
	if t == nil {
		return nil, fmt.Errorf("missing tensor")
	}
	dt := t.GetDtype()
	if elemSize(dt) == 0 {
		return nil, fmt.Errorf("unsupported dtype %v; use FLOAT32, INT64, INT32 or BFLOAT16", dt)
	}
	switch enc := t.GetEncoding().(type) {
	case *publicv1.Tensor_SparseCsr:
		return sparseToDense(dt, t.GetShape(), enc.SparseCsr.GetValues(), enc.SparseCsr.GetCrowIndices(), enc.SparseCsr.GetColIndices(), lim)
	default: // dense, or no encoding (empty tensor)
		f, v, err := tensorValues(t.GetDense(), dt)
		if err != nil {
			return nil, err
		}
		return denseTensor(dt, t.GetShape(), f, v, lim)
	}
}

// denseTensor builds a loops Tensor and checks the shape against the element count.
func denseTensor(dt publicv1.DType, shape []int64, f []float32, v []int64, lim limits) (*loopsv1.Tensor, error) {
	n := int64(len(f) + len(v))
	if n > lim.maxElements {
		return nil, fmt.Errorf("%d elements is more than the server's limit of %d", n, lim.maxElements)
	}
	out := &loopsv1.Tensor{}
	if len(shape) > 0 {
		want, err := shapeElements(shape, lim)
		if err != nil {
			return nil, err
		}
		if want != n {
			return nil, fmt.Errorf("shape %v needs %d elements but the data has %d", shape, want, n)
		}
		out.Shape = append([]int64(nil), shape...)
	}
	if isFloat(dt) {
		out.Dtype = loopsv1.Dtype_DTYPE_FLOAT32
		out.Float32Data = f
	} else {
		out.Dtype = loopsv1.Dtype_DTYPE_INT64
		out.Int64Data = v
	}
	return out, nil
}

// sparseToDense expands a 2-D CSR tensor (implicit entries 0) into a dense one.
func sparseToDense(dt publicv1.DType, shape []int64, values, crowB, colB []byte, lim limits) (*loopsv1.Tensor, error) {
	if len(shape) != 2 {
		return nil, fmt.Errorf("a sparse CSR tensor needs a 2-D shape [rows, cols], got %v", shape)
	}
	total, err := shapeElements(shape, lim)
	if err != nil {
		return nil, err
	}
	rows, cols := shape[0], shape[1]
	f, v, err := tensorValues(values, dt)
	if err != nil {
		return nil, fmt.Errorf("sparse values: %w", err)
	}
	nnz := int64(len(f) + len(v))
	if len(crowB)%8 != 0 || len(colB)%8 != 0 {
		return nil, fmt.Errorf("sparse crow_indices and col_indices must be int64 little-endian")
	}
	if int64(len(crowB)/8) != rows+1 {
		return nil, fmt.Errorf("sparse crow_indices has %d entries; shape %v needs %d", len(crowB)/8, shape, rows+1)
	}
	if int64(len(colB)/8) != nnz {
		return nil, fmt.Errorf("sparse col_indices has %d entries for %d values", len(colB)/8, nnz)
	}
	crow := func(i int64) int64 { return int64(binary.LittleEndian.Uint64(crowB[8*i:])) }
	if crow(0) != 0 || crow(rows) != nnz {
		return nil, fmt.Errorf("sparse crow_indices must start at 0 and end at the value count %d", nnz)
	}
	var df []float32
	var dv []int64
	if isFloat(dt) {
		df = make([]float32, total)
	} else {
		dv = make([]int64, total)
	}
	for r := int64(0); r < rows; r++ {
		lo, hi := crow(r), crow(r+1)
		if lo > hi || hi > nnz {
			return nil, fmt.Errorf("sparse crow_indices are not non-decreasing at row %d", r)
		}
		for k := lo; k < hi; k++ {
			c := int64(binary.LittleEndian.Uint64(colB[8*k:]))
			if c < 0 || c >= cols {
				return nil, fmt.Errorf("sparse col_indices[%d] = %d is outside [0, %d)", k, c, cols)
			}
			if df != nil {
				df[r*cols+c] = f[k]
			} else {
				dv[r*cols+c] = v[k]
			}
		}
	}
	out := &loopsv1.Tensor{Shape: []int64{rows, cols}}
	if isFloat(dt) {
		out.Dtype, out.Float32Data = loopsv1.Dtype_DTYPE_FLOAT32, df
	} else {
		out.Dtype, out.Int64Data = loopsv1.Dtype_DTYPE_INT64, dv
	}
	return out, nil
}

// jsonForwardBackward is the JSON body of forward_backward / forward in SDKs ≤ 0.24.
type jsonForwardBackward struct {
	ForwardBackwardInput *jsonFBInput `json:"forward_backward_input"`
	ForwardInput         *jsonFBInput `json:"forward_input"`
	ModelID              string       `json:"model_id"`
	SeqID                *int64       `json:"seq_id"`
}

type jsonFBInput struct {
	Data         []jsonDatum                `json:"data"`
	LossFn       string                     `json:"loss_fn"`
	LossFnConfig map[string]json.RawMessage `json:"loss_fn_config"`
}

type jsonDatum struct {
	ModelInput   jsonModelInput             `json:"model_input"`
	LossFnInputs map[string]*jsonTensorData `json:"loss_fn_inputs"`
}

type jsonModelInput struct {
	Chunks []jsonChunk `json:"chunks"`
}

type jsonChunk struct {
	Type   string  `json:"type"`
	Tokens []int64 `json:"tokens"`
	// image chunks: the encoded image (base64 in JSON), "png" or "jpeg", and its token count
	Data           []byte `json:"data"`
	Format         string `json:"format"`
	ExpectedTokens *int64 `json:"expected_tokens"`
	// image_asset_pointer chunks: the image's URL (fetched from the hosts the operator
	// allows: internal/imagefetch), with format and expected_tokens as above
	Location string `json:"location"`
}

// jsonTensorData is the SDK's TensorData JSON.
type jsonTensorData struct {
	Data              []json.Number `json:"data"`
	Dtype             string        `json:"dtype"`
	Shape             []int64       `json:"shape"`
	SparseCrowIndices []int64       `json:"sparse_crow_indices"`
	SparseColIndices  []int64       `json:"sparse_col_indices"`
}

// decodeForwardBackwardJSON decodes the JSON-era body. forwardOnly is set for /forward
// and for a body that carries forward_input.
func decodeForwardBackwardJSON(b []byte, forwardOnly bool, lim limits, fetch fetchImage) (*loopsv1.ForwardBackwardRequest, error) {
	var in jsonForwardBackward
	if err := decodeJSON(b, &in); err != nil {
		return nil, err
	}
	fb := in.ForwardBackwardInput
	if fb == nil {
		fb = in.ForwardInput
		forwardOnly = true
	}
	if fb == nil {
		return nil, badRequest("the JSON body needs forward_backward_input (or forward_input)")
	}
	if fb.LossFn == "" {
		return nil, badRequest("loss_fn is required (e.g. \"cross_entropy\")")
	}
	out := &loopsv1.ForwardBackwardRequest{TrainingRunId: in.ModelID, LossFn: fb.LossFn, ForwardOnly: forwardOnly}
	if in.SeqID != nil {
		out.SeqId = *in.SeqID
	}
	cfg, err := numericConfig(fb.LossFnConfig)
	if err != nil {
		return nil, err
	}
	out.LossFnConfig = cfg
	var total int64
	images := 0
	for i, d := range fb.Data {
		od := &loopsv1.Datum{}
		toks, ims, err := chunksToInput(d.ModelInput.Chunks, &images, fetch)
		if err != nil {
			return nil, badRequest("data[%d].model_input: %v", i, err)
		}
		od.Tokens, od.Images = toks, ims
		if len(d.LossFnInputs) > 0 {
			od.LossFnInputs = make(map[string]*loopsv1.Tensor, len(d.LossFnInputs))
			for _, k := range sortedKeys(d.LossFnInputs) {
				t, err := tensorFromJSON(d.LossFnInputs[k], lim)
				if err != nil {
					return nil, badRequest("data[%d].loss_fn_inputs[%q]: %v", i, k, err)
				}
				total += tensorLen(t)
				if total > lim.maxElements {
					return nil, tooLarge("the request's tensors hold more than %d elements; send smaller forward_backward chunks", lim.maxElements)
				}
				od.LossFnInputs[k] = t
			}
		}
		out.Data = append(out.Data, od)
	}
	return out, nil
}

// numericConfig decodes a loss_fn_config JSON object whose values must be numbers.
func numericConfig(m map[string]json.RawMessage) (map[string]float64, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]float64, len(m))
	for k, raw := range m {
		var f float64
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, badRequest("loss_fn_config[%q] = %s: Loops supports only numeric loss_fn_config values", k, string(raw))
		}
		out[k] = f
	}
	return out, nil
}

// fetchImage returns the bytes of the image at an image_asset_pointer chunk's location
// (imagefetch.Fetcher.ForRequest); nil: the server fetches no images.
type fetchImage func(location string) ([]byte, error)

// chunksToInput concatenates encoded_text chunks and places image chunks (inputBuilder);
// images counts the request's images. An image_asset_pointer chunk's image is fetched
// (fetch) from its location. Other chunk types are refused.
func chunksToInput(chunks []jsonChunk, images *int, fetch fetchImage) ([]int32, []*loopsv1.Image, error) {
	b := inputBuilder{count: images}
	for j, c := range chunks {
		switch c.Type {
		case "", "encoded_text":
			for _, t := range c.Tokens {
				if t < math.MinInt32 || t > math.MaxInt32 {
					return nil, nil, fmt.Errorf("chunk %d: token id %d does not fit in int32", j, t)
				}
				b.tokens = append(b.tokens, int32(t))
			}
		case "image":
			if err := b.image(c.Data, c.Format, c.ExpectedTokens); err != nil {
				return nil, nil, fmt.Errorf("chunk %d: %v", j, err)
			}
		case "image_asset_pointer":
			if err := b.assetPointer(c, fetch); err != nil {
				return nil, nil, fmt.Errorf("chunk %d (image_asset_pointer): %v", j, err)
			}
		case "dmel":
			return nil, nil, fmt.Errorf("chunk %d: %s", j, noDmel)
		default:
			return nil, nil, fmt.Errorf("chunk %d has type %q: send encoded_text or image chunks", j, c.Type)
		}
	}
	return b.tokens, b.images, nil
}

// tensorFromJSON converts TensorData JSON into a dense loops Tensor.
func tensorFromJSON(t *jsonTensorData, lim limits) (*loopsv1.Tensor, error) {
	if t == nil {
		return nil, fmt.Errorf("missing tensor")
	}
	var dt publicv1.DType
	switch t.Dtype {
	case "float32":
		dt = publicv1.DType_DTYPE_FLOAT32
	case "int64":
		dt = publicv1.DType_DTYPE_INT64
	default:
		return nil, fmt.Errorf("unsupported dtype %q; use \"float32\" or \"int64\"", t.Dtype)
	}
	if int64(len(t.Data)) > lim.maxElements {
		return nil, fmt.Errorf("%d elements is more than the server's limit of %d", len(t.Data), lim.maxElements)
	}
	var f []float32
	var v []int64
	if dt == publicv1.DType_DTYPE_FLOAT32 {
		f = make([]float32, len(t.Data))
		for i, n := range t.Data {
			x, err := strconv.ParseFloat(string(n), 64)
			if err != nil {
				return nil, fmt.Errorf("data[%d] = %s is not a number", i, n)
			}
			f[i] = float32(x)
		}
	} else {
		v = make([]int64, len(t.Data))
		for i, n := range t.Data {
			x, err := strconv.ParseInt(string(n), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("data[%d] = %s is not an int64", i, n)
			}
			v[i] = x
		}
	}
	if t.SparseCrowIndices != nil || t.SparseColIndices != nil {
		if t.SparseCrowIndices == nil || t.SparseColIndices == nil {
			return nil, fmt.Errorf("sparse_crow_indices and sparse_col_indices must be sent together")
		}
		var vals []byte
		if f != nil {
			vals = make([]byte, 4*len(f))
			for i, x := range f {
				binary.LittleEndian.PutUint32(vals[4*i:], math.Float32bits(x))
			}
		} else {
			vals = make([]byte, 8*len(v))
			for i, x := range v {
				binary.LittleEndian.PutUint64(vals[8*i:], uint64(x))
			}
		}
		return sparseToDense(dt, t.Shape, vals, int64sLE(t.SparseCrowIndices), int64sLE(t.SparseColIndices), lim)
	}
	return denseTensor(dt, t.Shape, f, v, lim)
}

func int64sLE(xs []int64) []byte {
	b := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}
