package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

// Content types of the Tinker surface.
const (
	ContentTypeJSON  = "application/json"
	ContentTypeProto = "application/x-protobuf"
)

// HTTPResult is one answered Tinker HTTP request.
type HTTPResult struct {
	Status      int
	ContentType string
	Body        []byte
	// Doc is the body as JSON (nil when it is not JSON).
	Doc any
}

// Message is the error text of a non-2xx answer: its "detail" (Tinker), "message" (REST)
// or the body itself.
func (h *HTTPResult) Message() string {
	if m, ok := h.Doc.(map[string]any); ok {
		for _, k := range []string{"detail", "message", "error"} {
			if s, ok := m[k].(string); ok && s != "" {
				return s
			}
		}
	}
	return strings.TrimSpace(string(h.Body))
}

// TinkerClient sends requests the way the tinker SDK does: X-API-Key, JSON bodies, and
// protobuf where the SDK uses it.
type TinkerClient struct {
	// BaseURL is the server root, without /api/v1.
	BaseURL string
	// APIKey goes in X-API-Key when not empty.
	APIKey string
	// HTTP is the client to use.
	HTTP *http.Client
}

// Do sends one request. body is nil, []byte (sent as contentType) or any other value
// (encoded as JSON).
func (c *TinkerClient) Do(ctx context.Context, method, path string, body any, contentType string, headers map[string]string) (*HTTPResult, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd, contentType = bytes.NewReader(j), ContentTypeJSON
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, rd)
	if err != nil {
		return nil, err
	}
	if rd != nil && contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", ContentTypeJSON)
	req.Header.Set("User-Agent", "loops-conformance")
	if c.APIKey != "" {
		req.Header.Set("X-API-Key", c.APIKey)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := &HTTPResult{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: b}
	if mt, _, _ := mime.ParseMediaType(out.ContentType); mt == ContentTypeJSON || (mt == "" && len(b) > 0 && (b[0] == '{' || b[0] == '[')) {
		out.Doc, _ = decodeDoc(b)
	}
	return out, nil
}

// FutureResult is how a Tinker future ended.
type FutureResult struct {
	// Failed is true when the answer carried "error".
	Failed bool
	// Error and Category are the failure ("user", "server", …).
	Error, Category string
	// Doc is the result as JSON; protobuf results are rendered in the SDK's JSON shape.
	Doc any
	// Proto is set when the server answered protobuf.
	Proto proto.Message
	// Polls is how many retrieve_future requests it took.
	Polls int
}

// ResultType is the protobuf type of a future's result, by the route that created it:
// ForwardBackwardOutput for forward and forward_backward, SampleResponse for asample, nil
// (JSON) otherwise.
func ResultType(route string) proto.Message {
	switch {
	case strings.HasSuffix(route, "/forward_backward"), strings.HasSuffix(route, "/forward"):
		return &publicv1.ForwardBackwardOutput{}
	case strings.HasSuffix(route, "/asample"):
		return &publicv1.SampleResponse{}
	}
	return nil
}

// Retrieve long-polls retrieve_future until the future is done or ctx ends, asking for
// protobuf when result is a protobuf type, as the SDK does.
func (c *TinkerClient) Retrieve(ctx context.Context, requestID string, result proto.Message) (*FutureResult, error) {
	accept := ContentTypeJSON
	if result != nil {
		accept = ContentTypeProto + ", " + ContentTypeJSON
	}
	out := &FutureResult{}
	for {
		out.Polls++
		res, err := c.Do(ctx, http.MethodPost, "/api/v1/retrieve_future",
			map[string]any{"request_id": requestID, "allow_metadata_only": false}, "", map[string]string{"Accept": accept})
		if err != nil {
			return nil, fmt.Errorf("retrieve_future: %w", err)
		}
		switch {
		case res.Status == http.StatusRequestTimeout || res.Status >= 500:
			// The SDK re-polls these.
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				return nil, fmt.Errorf("retrieve_future %s: still answering %d when time ran out", requestID, res.Status)
			}
			continue
		case res.Status/100 != 2:
			return nil, fmt.Errorf("retrieve_future answered %d: %s", res.Status, res.Message())
		}
		if strings.Contains(res.ContentType, ContentTypeProto) {
			if result == nil {
				return nil, fmt.Errorf("retrieve_future answered protobuf for a JSON result")
			}
			m := result.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(res.Body, m); err != nil {
				return nil, fmt.Errorf("retrieve_future: the protobuf result is not a valid %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
			}
			doc, err := ProtoResultDoc(m)
			if err != nil {
				return nil, err
			}
			out.Proto, out.Doc = m, doc
			return out, nil
		}
		m, ok := res.Doc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("retrieve_future answered neither JSON nor protobuf (%s): %.200s", res.ContentType, res.Body)
		}
		if m["type"] == "try_again" {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("retrieve_future %s: still try_again when time ran out", requestID)
			}
			continue
		}
		if e, ok := m["error"]; ok {
			out.Failed, out.Error = true, valueText(e)
			out.Category, _ = m["category"].(string)
			out.Doc = m
			return out, nil
		}
		out.Doc = m
		return out, nil
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ProtoResultDoc renders a Tinker protobuf result as the JSON the SDK's pydantic types
// would hold: tensors and token lists decoded from their little-endian bytes.
func ProtoResultDoc(m proto.Message) (any, error) {
	var v any
	switch x := m.(type) {
	case *publicv1.SampleResponse:
		d, err := sampleDoc(x)
		if err != nil {
			return nil, err
		}
		v = d
	case *publicv1.ForwardBackwardOutput:
		d, err := forwardBackwardDoc(x)
		if err != nil {
			return nil, err
		}
		v = d
	default:
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		return decodeDoc(b)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return decodeDoc(b)
}

// Float32s decodes little-endian float32 bytes; NaN becomes nil (JSON null).
func Float32s(b []byte) ([]any, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of float32s", len(b))
	}
	out := make([]any, len(b)/4)
	for i := range out {
		f := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			out[i] = nil
		} else {
			out[i] = float64(f)
		}
	}
	return out, nil
}

// Int32s decodes little-endian int32 bytes.
func Int32s(b []byte) ([]int64, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of int32s", len(b))
	}
	out := make([]int64, len(b)/4)
	for i := range out {
		out[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out, nil
}

func sampleDoc(r *publicv1.SampleResponse) (map[string]any, error) {
	seqs := []any{}
	for i, s := range r.GetSequences() {
		toks, err := Int32s(s.GetTokens())
		if err != nil {
			return nil, fmt.Errorf("sequences[%d].tokens: %w", i, err)
		}
		seq := map[string]any{"tokens": toks, "stop_reason": "stop"}
		if s.GetStopReason() == publicv1.StopReason_STOP_REASON_LENGTH {
			seq["stop_reason"] = "length"
		}
		if s.Logprobs != nil {
			lp, err := Float32s(s.GetLogprobs())
			if err != nil {
				return nil, fmt.Errorf("sequences[%d].logprobs: %w", i, err)
			}
			seq["logprobs"] = lp
		}
		if tk := s.GetTopkSampledLogprobs(); tk != nil {
			rows, err := topkRows(tk)
			if err != nil {
				return nil, fmt.Errorf("sequences[%d].topk_sampled_logprobs: %w", i, err)
			}
			seq["topk_logprobs"] = rows
		}
		seqs = append(seqs, seq)
	}
	out := map[string]any{"type": "sample", "sequences": seqs}
	if r.PromptLogprobs != nil {
		lp, err := Float32s(r.GetPromptLogprobs())
		if err != nil {
			return nil, fmt.Errorf("prompt_logprobs: %w", err)
		}
		out["prompt_logprobs"] = lp
	}
	if tk := r.GetTopkPromptLogprobs(); tk != nil {
		rows, err := topkRows(tk)
		if err != nil {
			return nil, fmt.Errorf("topk_prompt_logprobs: %w", err)
		}
		out["topk_prompt_logprobs"] = rows
	}
	if t := r.GetTargetPromptLogprobs(); t != nil {
		d, err := tensorDoc(t)
		if err != nil {
			return nil, fmt.Errorf("target_prompt_logprobs: %w", err)
		}
		out["target_prompt_logprobs"] = d
	}
	if a := r.GetPromptAltTokens(); a != nil {
		toks, err := tensorDoc(a.GetTokens())
		if err != nil {
			return nil, fmt.Errorf("prompt_alt_tokens.tokens: %w", err)
		}
		lps, err := tensorDoc(a.GetLogprobs())
		if err != nil {
			return nil, fmt.Errorf("prompt_alt_tokens.logprobs: %w", err)
		}
		out["prompt_alt_tokens"] = map[string]any{"tokens": toks, "logprobs": lps}
	}
	return out, nil
}

// topkRows is a TopkLogprobs as the SDK's topk_to_lists gives it: per position a list of
// [token, logprob] pairs, the sentinel cells (token 0, logprob -99999) left off the end,
// and null for a position that has only sentinels.
func topkRows(tk *publicv1.TopkLogprobs) ([]any, error) {
	ids, err := Int32s(tk.GetTokenIds())
	if err != nil {
		return nil, err
	}
	lps, err := Float32s(tk.GetLogprobs())
	if err != nil {
		return nil, err
	}
	n, k := int(tk.GetLength()), int(tk.GetK())
	if len(ids) != n*k || len(lps) != n*k {
		return nil, fmt.Errorf("%d ids and %d logprobs for %d x %d", len(ids), len(lps), n, k)
	}
	sentinel := func(c int) bool { return ids[c] == 0 && lps[c] == float64(-99999) }
	rows := make([]any, n)
	for r := range n {
		end := (r + 1) * k
		for end > r*k && sentinel(end-1) {
			end--
		}
		if end == r*k {
			continue // null
		}
		row := []any{}
		for c := r * k; c < end; c++ {
			row = append(row, []any{ids[c], lps[c]})
		}
		rows[r] = row
	}
	return rows, nil
}

// tensorDoc is a public Tensor as TensorData JSON: data, dtype and shape, with
// sparse_crow_indices and sparse_col_indices for a sparse CSR one.
func tensorDoc(t *publicv1.Tensor) (map[string]any, error) {
	values := t.GetDense()
	out := map[string]any{"shape": t.GetShape()}
	if csr := t.GetSparseCsr(); csr != nil {
		values = csr.GetValues()
		out["sparse_crow_indices"] = int64sLE(csr.GetCrowIndices())
		out["sparse_col_indices"] = int64sLE(csr.GetColIndices())
	}
	switch t.GetDtype() {
	case publicv1.DType_DTYPE_FLOAT32:
		d, err := Float32s(values)
		if err != nil {
			return nil, err
		}
		out["data"], out["dtype"] = d, "float32"
	case publicv1.DType_DTYPE_INT64:
		out["data"], out["dtype"] = int64sLE(values), "int64"
	default:
		return nil, fmt.Errorf("dtype %v", t.GetDtype())
	}
	return out, nil
}

// int64sLE decodes little-endian int64 bytes (a trailing partial value is dropped).
func int64sLE(b []byte) []int64 {
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func forwardBackwardDoc(r *publicv1.ForwardBackwardOutput) (map[string]any, error) {
	outs := []any{}
	for ri, rec := range r.GetLossFnOutputs() {
		per := make([]map[string]any, rec.GetNumDatums())
		for i := range per {
			per[i] = map[string]any{}
		}
		for name, bt := range rec.GetFields() {
			offs := bt.GetOffsets()
			if len(offs) != 8*(len(per)+1) {
				return nil, fmt.Errorf("loss_fn_outputs[%d].%s: %d offset bytes for %d datums", ri, name, len(offs), len(per))
			}
			for i := range per {
				lo, hi := binary.LittleEndian.Uint64(offs[8*i:]), binary.LittleEndian.Uint64(offs[8*i+8:])
				if lo > hi || hi > uint64(len(bt.GetData())) {
					return nil, fmt.Errorf("loss_fn_outputs[%d].%s: offsets out of range", ri, name)
				}
				chunk := bt.GetData()[lo:hi]
				t := map[string]any{}
				switch bt.GetDtype() {
				case publicv1.DType_DTYPE_FLOAT32:
					d, err := Float32s(chunk)
					if err != nil {
						return nil, err
					}
					t["data"], t["dtype"] = d, "float32"
				case publicv1.DType_DTYPE_INT64:
					d := make([]int64, len(chunk)/8)
					for j := range d {
						d[j] = int64(binary.LittleEndian.Uint64(chunk[8*j:]))
					}
					t["data"], t["dtype"] = d, "int64"
				default:
					return nil, fmt.Errorf("loss_fn_outputs[%d].%s: dtype %v", ri, name, bt.GetDtype())
				}
				per[i][name] = t
			}
		}
		for _, p := range per {
			outs = append(outs, p)
		}
	}
	metrics := map[string]any{}
	for k, v := range r.GetMetrics() {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			metrics[k] = nil
		} else {
			metrics[k] = v
		}
	}
	return map[string]any{"loss_fn_output_type": r.GetLossFnOutputType(), "loss_fn_outputs": outs, "metrics": metrics}, nil
}

// tinkerBody encodes a case's Tinker body and its content type.
func (r *runner) tinkerBody(sc *scope, tc tinkerForm) ([]byte, string, error) {
	switch {
	case tc.GetJson() != nil:
		v, err := sc.expandValue(tc.GetJson())
		if err != nil {
			return nil, "", err
		}
		b, err := protojson.Marshal(v)
		return b, ContentTypeJSON, err
	case tc.GetRaw() != "":
		s, err := sc.expand(tc.GetRaw())
		return []byte(s), ContentTypeJSON, err
	case tc.GetProtoHex() != "":
		b, err := hex.DecodeString(strings.Join(strings.Fields(tc.GetProtoHex()), ""))
		return b, ContentTypeProto, err
	case tc.GetProto() != nil:
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(tc.GetProto().GetType()))
		if err != nil {
			return nil, "", err
		}
		st, err := sc.expandStruct(tc.GetProto().GetMessage())
		if err != nil {
			return nil, "", err
		}
		j, err := protojson.Marshal(st)
		if err != nil {
			return nil, "", err
		}
		m := mt.New().Interface()
		if err := protojson.Unmarshal(j, m); err != nil {
			return nil, "", fmt.Errorf("tinker proto body: %w", err)
		}
		b, err := proto.Marshal(m)
		return b, ContentTypeProto, err
	case tc.GetOverLimit():
		return overLimitJSON(r.opts.MaxBodyBytes), ContentTypeJSON, nil
	}
	return nil, "", nil
}
