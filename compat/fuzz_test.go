package compat

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

var fuzzLimits = limits{maxElements: 1 << 16}

func requireFuzzClientError(t *testing.T, err error) {
	t.Helper()
	status, _, detail := classify(err)
	if status < 400 || status >= 500 || detail == "" {
		t.Fatalf("decoder error is not a client error: status %d detail %q (%v)", status, detail, err)
	}
}

func seedFB(f *testing.F) {
	f.Add(mustHex(f, goldenFBRequest))
	sparse := &publicv1.ForwardBackwardRequest{ModelId: "m", SeqId: 2, LossFn: "ppo",
		LossFnConfigV2: map[string]*publicv1.LossConfigValue{"clip_low_threshold": {Value: &publicv1.LossConfigValue_Number{Number: 0.8}}},
		Data: []*publicv1.Datum{{
			ModelInput: []*publicv1.Chunk{{Chunk: &publicv1.Chunk_EncodedText{EncodedText: &publicv1.EncodedTextChunk{Tokens: appendInt32s(nil, []int32{1, 2})}}}},
			LossFnInputs: map[string]*publicv1.Tensor{"weights": {Dtype: publicv1.DType_DTYPE_BFLOAT16, Shape: []int64{2, 2},
				Encoding: &publicv1.Tensor_SparseCsr{SparseCsr: &publicv1.SparseCsr{Values: []byte{0x80, 0x3f}, CrowIndices: int64sLE([]int64{0, 1, 1}), ColIndices: int64sLE([]int64{1})}}}},
		}}}
	b, _ := proto.Marshal(sparse)
	f.Add(b)
	f.Add([]byte{})
}

// FuzzDecodeForwardBackward checks the protobuf forward_backward decoder never panics and
// only fails with client errors.
func FuzzDecodeForwardBackward(f *testing.F) {
	seedFB(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := decodeForwardBackwardProto(b, fuzzLimits); err != nil {
			requireFuzzClientError(t, err)
		}
	})
}

// FuzzDecodeForwardBackwardJSON does the same for the JSON-era body.
func FuzzDecodeForwardBackwardJSON(f *testing.F) {
	f.Add([]byte(`{"forward_backward_input":{"data":[{"model_input":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},
	  "loss_fn_inputs":{"target_tokens":{"data":[2,3,4],"dtype":"int64","shape":[3]},"weights":{"data":[1],"dtype":"float32","shape":[1,3],"sparse_crow_indices":[0,1],"sparse_col_indices":[2]}}}],
	  "loss_fn":"cross_entropy","loss_fn_config":{"beta":0.1}},"model_id":"m","seq_id":1}`))
	f.Add([]byte(`{"forward_input":{"data":[],"loss_fn":"cross_entropy"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := decodeForwardBackwardJSON(b, false, fuzzLimits, nil); err != nil {
			requireFuzzClientError(t, err)
		}
	})
}

// FuzzDecompressZstd checks the bounded zstd decoder.
func FuzzDecompressZstd(f *testing.F) {
	enc, _ := zstd.NewWriter(nil)
	f.Add(enc.EncodeAll(mustHex(f, goldenFBRequest), nil))
	f.Add(enc.EncodeAll(make([]byte, 1<<20), nil))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := decompressZstd(t.Context(), b, 256<<10, nil)
		if err != nil {
			requireFuzzClientError(t, err)
			return
		}
		if len(out) > 256<<10 {
			t.Fatalf("decoded %d bytes past the limit", len(out))
		}
	})
}

// FuzzJSONRoutes posts arbitrary bodies to the JSON routes (against the fake core) and
// requires that no answer is a 5xx.
func FuzzJSONRoutes(f *testing.F) {
	core := newFakeCore()
	h := NewHandler(core.services(), Options{MaxBodyBytes: 1 << 20, MaxDecompressedBytes: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	sess, _ := core.CreateSession(f.Context(), &loopsv1.CreateSessionRequest{})
	smp, _ := core.CreateSampler(f.Context(), &loopsv1.CreateSamplerRequest{})
	routes := []string{"asample", "create_model", "optim_step", "save_weights", "save_weights_for_sampler",
		"load_weights", "create_sampling_session", "create_session", "session_heartbeat", "get_info", "weights_info",
		"retrieve_future", "forward_backward", "telemetry", "client/config", "copy_weights", "join_sampling_session",
		"create_custom_loss"}
	f.Add(uint8(0), []byte(`{"num_samples":2,"prompt":{"chunks":[{"tokens":[1,2],"type":"encoded_text"}]},"sampling_params":{"max_tokens":4,"seed":7,"stop":["x"],"temperature":1,"top_k":-1,"top_p":1},"sampling_session_id":"`+smp.GetId()+`","seq_id":0}`))
	f.Add(uint8(0), []byte(`{"prompt":{"chunks":[{"tokens":[1,2,3]}]},"sampling_params":{},"sampling_session_id":"`+smp.GetId()+`","prompt_logprobs":true,"topk_sample_logprobs":3,"prompt_alt_tokens_k":2,"prompt_logprobs_last_n":1,"target_prompt_logprobs":{"data":[9],"dtype":"int64","shape":[2,2],"sparse_crow_indices":[0,1,1],"sparse_col_indices":[1]}}`))
	f.Add(uint8(1), []byte(`{"session_id":"`+sess.GetId()+`","model_seq_id":0,"base_model":"b","lora_config":{"rank":4,"seed":1}}`))
	f.Add(uint8(2), []byte(`{"adam_params":{"learning_rate":0.1},"model_id":"run1","seq_id":1}`))
	f.Add(uint8(6), []byte(`{"session_id":"s","sampling_session_seq_id":0,"base_model":"b"}`))
	f.Add(uint8(12), []byte(`{"forward_backward_input":{"data":[],"loss_fn":"cross_entropy"},"model_id":"m"}`))
	f.Add(uint8(15), []byte(`{"source_path":"tinker://r/weights/c","destination_project_id":"p","ttl_seconds":3600,"weights_access_token":"t"}`))
	f.Add(uint8(16), []byte(`{"sampling_session_id":"`+smp.GetId()+`","type":"join_sampling_session"}`))
	f.Add(uint8(17), []byte(`{"session_id":"s","custom_loss_seq_id":0,"name":"l","inputs":[],"graph":{"format":1,"nodes":[]}}`))
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		path := "/api/v1/" + routes[int(route)%len(routes)]
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s answered %d: %s", path, rec.Code, rec.Body.String())
		}
	})
}

// FuzzRetrieveFutures checks that any retrieve_futures body is answered 200 or a 4xx with
// a detail, never a 5xx or a panic.
func FuzzRetrieveFutures(f *testing.F) {
	f.Add([]byte(`{"target":{"type":"sampling_session","sampling_session_id":"smp","cloned_sampler_id":0},"prev_cursor":0,"timeout":0,"retrieved_request_ids":["op-1"]}`))
	f.Add([]byte(`{"target":{"sampling_session_id":"smp","cloned_sampler_id":9223372036854775807},"prev_cursor":1e30,"timeout":-0.0}`))
	f.Add([]byte(`{"target":{"sampling_session_id":"smp"},"timeout":1e308}`))
	f.Add([]byte(`{"target":null,"prev_cursor":"x"}`))
	f.Add([]byte(`[]`))
	core := newFakeCore()
	core.samplers["smp"] = &loopsv1.Sampler{Id: "smp"}
	op := core.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp", 1)
	core.finish(op.GetId(), func(*loopsv1.Operation) {})
	h := NewHandler(core.services(), Options{LongPoll: time.Millisecond, MaxBodyBytes: 1 << 16, MaxDecompressedBytes: 1 << 16,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	f.Fuzz(func(t *testing.T, b []byte) {
		req := httptest.NewRequest(http.MethodPost, "/api/v1/retrieve_futures", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", "tml-fuzz")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 || (w.Code != http.StatusOK && !bytes.Contains(w.Body.Bytes(), []byte("detail"))) {
			t.Fatalf("answered %d: %s", w.Code, w.Body.String())
		}
	})
}
