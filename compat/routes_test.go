package compat

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
	"github.com/loops-dev/loops/internal/errs"
)

func TestBootstrapRoutes(t *testing.T) {
	e := newEnv(t)
	r := e.postJSON("/api/v1/client/config", `{"sdk_version":"0.38.0"}`)
	require.Equal(t, 200, r.status)
	cfg := r.json(t)
	require.Equal(t, false, cfg["pjwt_auth_enabled"])
	require.Equal(t, false, cfg["use_pyqwest_transport"])
	require.Equal(t, false, cfg["create_model_via_load_weights"])
	require.Equal(t, true, cfg["parallel_fwdbwd_chunks"])
	require.Equal(t, true, cfg["proto_compress_fwdbwd"])
	require.Equal(t, false, cfg["sample_use_retrieve_futures"])

	r = e.postJSON("/api/v1/client/dynamic_config", `{"sdk_version":"0.38.0"}`)
	require.Equal(t, 200, r.status)
	require.Equal(t, true, r.json(t)["sample_cancel_enabled"], "cancel_future is served")

	r = e.postJSON("/api/v1/create_session", `{"tags":["a"],"user_metadata":{"k":"v","n":3},"sdk_version":"0.38.0","project_id":"p","display_name":"d","type":"create_session"}`)
	require.Equal(t, 200, r.status)
	sid := r.json(t)["session_id"].(string)
	require.Equal(t, "create_session", r.json(t)["type"])
	require.Empty(t, cmp.Diff(&loopsv1.CreateSessionRequest{Tags: []string{"a"}, UserMetadata: map[string]string{"k": "v", "n": "3"}, SdkVersion: "0.38.0", ProjectId: "p", DisplayName: "d"},
		e.core.lastReq("CreateSession"), protocmp.Transform()))

	r = e.postJSON("/api/v1/session_heartbeat", fmt.Sprintf(`{"session_id":%q,"type":"session_heartbeat"}`, sid))
	require.Equal(t, 200, r.status)
	r = e.postJSON("/api/v1/session_heartbeat", `{"session_id":"nope","type":"session_heartbeat"}`)
	require.Equal(t, 404, r.status)
	require.Contains(t, r.json(t)["detail"], "nope")
	e.core.sessions[sid].Expired = true
	require.Equal(t, 410, e.postJSON("/api/v1/session_heartbeat", fmt.Sprintf(`{"session_id":%q}`, sid)).status)

	r = e.postJSON("/api/v1/telemetry", `{"events":[{"event":"SESSION_START"}],"session_id":"x"}`)
	require.Equal(t, 200, r.status)
	require.Equal(t, "accepted", r.json(t)["status"])
	require.Equal(t, "ok", e.get("/api/v1/healthz").json(t)["status"])

	r = e.get("/api/v1/get_server_capabilities")
	require.Equal(t, 200, r.status)
	require.JSONEq(t, `{"supported_models":[{"model_name":"Qwen/Qwen3-8B","max_context_length":32768,"max_sequence_length":32768,"trainable":true,"sampleable":true}]}`, string(r.body))
	e.core.models = append(e.core.models, &loopsv1.ModelInfo{Name: "/m/moe", MaxSequenceLength: 256, Family: "qwen3_moe",
		Publisher: "Qwen", Renderer: "qwen3", LoraTargets: []string{"q_proj", "gate_up_proj"}, Modalities: []string{"text", "image"},
		MaxLoraRank: 32, Trainable: false, Sampleable: true, Availability: []string{"serverless", "dedicated"}, Backend: "torch"})
	r = e.get("/api/v1/get_server_capabilities")
	require.JSONEq(t, `{"supported_models":[{"model_name":"Qwen/Qwen3-8B","max_context_length":32768,"max_sequence_length":32768,"trainable":true,"sampleable":true},`+
		`{"model_name":"/m/moe","max_context_length":256,"max_sequence_length":256,"trainable":false,"sampleable":true,"family":"qwen3_moe","publisher":"Qwen",`+
		`"renderer_name":"qwen3","lora_targets":["q_proj","gate_up_proj"],"modalities":["text","image"],"max_lora_rank":32,`+
		`"availability":["serverless","dedicated"],"backend":"torch"}]}`, string(r.body))
	e.core.models = e.core.models[:1]

	require.Equal(t, 200, e.postJSON("/api/v1/sessions/"+sid+"/finish", `{"reason":{"type":"success"},"detail":null}`).status)
	require.Equal(t, 404, e.postJSON("/api/v1/sessions/zzz/finish", `{"reason":{"type":"success"}}`).status)
	require.Equal(t, "finished: success", e.core.sessions[sid].GetEndReason())

	// Unserved routes are a 404 the SDK fails on at once (it retries a 5xx for minutes):
	// the key exchange of a server without keys.
	unserved := e.postJSON("/api/v1/auth/token", `{}`)
	require.Equal(t, 404, unserved.status)
	require.Contains(t, unserved.json(t)["detail"], "not supported by Loops")
	// A server-side custom loss is refused with the reason (the SDK does not retry a 400).
	custom := e.postJSON("/api/v1/create_custom_loss", `{}`)
	require.Equal(t, 400, custom.status)
	require.Equal(t, "CUSTOM_LOSS_CLIENT_SIDE", custom.json(t)["reason"])
	require.Equal(t, 404, e.get("/api/v1/no_such_route").status)
	require.Equal(t, 400, e.postJSON("/api/v1/create_session", `{"tags":`).status)
}

// newRun creates a session and a training run through the routes and returns their ids.
func (e *testEnv) newRun() (string, string) {
	t := e.t
	sid := e.postJSON("/api/v1/create_session", `{"tags":[],"user_metadata":{},"sdk_version":"0.38.0"}`).json(t)["session_id"].(string)
	// The headers tinker 0.38 sends name the client (the run's receipt).
	r := e.do(http.MethodPost, "/api/v1/create_model", fmt.Appendf(nil, `{"session_id":%q,"model_seq_id":0,"base_model":"Qwen/Qwen3-8B",
		"lora_config":{"rank":16,"seed":18446744073709551615,"train_unembed":false,"train_mlp":true,"train_attn":true},
		"user_metadata":{"a":"b"},"optimizer_config":{"type":"adamw"},"type":"create_model"}`, sid),
		map[string]string{"Content-Type": "application/json", "User-Agent": "AsyncTinker/Python 0.38.0",
			"X-Stainless-Package-Version": "0.38.0", "X-Stainless-Runtime": "CPython", "X-Stainless-Runtime-Version": "3.12.3"})
	require.Equal(t, 200, r.status, string(r.body))
	return sid, r.json(t)["model_id"].(string)
}

func TestTrainingRoutes(t *testing.T) {
	e := newEnv(t)
	sid, run := e.newRun()
	seq := int64(0)
	require.Empty(t, cmp.Diff(&loopsv1.CreateTrainingRunRequest{SessionId: sid, ClientSeqId: &seq, BaseModel: "Qwen/Qwen3-8B",
		Lora:         &loopsv1.LoraConfig{Rank: 16, Seed: 18446744073709551615, TrainMlp: true, TrainAttn: true},
		UserMetadata: map[string]string{"a": "b"},
		Client:       &loopsv1.ClientInfo{Name: "tinker", Version: "0.38.0", Runtime: "CPython 3.12.3", UserAgent: "AsyncTinker/Python 0.38.0"},
	}, e.core.lastReq("CreateTrainingRun"), protocmp.Transform()))

	r := e.postJSON("/api/v1/create_model", `{"session_id":"s","model_seq_id":1,"base_model":"m","lora_config":{"rank":8},"optimizer_config":{"type":"dimuon","version":1}}`)
	require.Equal(t, 400, r.status)
	require.Contains(t, string(r.body), `optimizer_config type \"dimuon\" is not supported; Loops trains with \"adamw\" only`)
	require.Contains(t, string(r.body), "will not train it with Adam instead")
	require.Equal(t, 400, e.postJSON("/api/v1/create_model", `{"session_id":"s","model_seq_id":1,"base_model":"m"}`).status)

	r = e.postJSON("/api/v1/get_info", fmt.Sprintf(`{"model_id":%q,"type":"get_info"}`, run))
	require.Equal(t, 200, r.status)
	require.JSONEq(t, fmt.Sprintf(`{"type":"get_info","model_id":%q,"model_data":{"arch":"qwen3","model_name":"Qwen/Qwen3-8B","tokenizer_id":"/models/qwen3/tokenizer"},
		"is_lora":true,"lora_rank":16,"model_name":"Qwen/Qwen3-8B","optimizer_config":{"type":"adamw"}}`, run), string(r.body))
	require.Equal(t, 404, e.postJSON("/api/v1/get_info", `{"model_id":"nope"}`).status)

	r = e.postJSON("/api/v1/optim_step", fmt.Sprintf(`{"adam_params":{"learning_rate":0.001,"beta1":0.8,"beta2":0.9,"eps":1e-8,"weight_decay":0.1,"grad_clip_norm":1},"model_id":%q,"seq_id":5,"type":"optim_step"}`, run))
	require.Equal(t, 200, r.status)
	require.NotEmpty(t, r.json(t)["request_id"])
	require.Empty(t, cmp.Diff(&loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 5, Adam: &loopsv1.AdamParams{LearningRate: 0.001, Beta1: 0.8, Beta2: 0.9, Eps: 1e-8, WeightDecay: 0.1, GradClipNorm: 1}},
		e.core.lastReq("OptimStep"), protocmp.Transform()))
	require.Equal(t, 400, e.postJSON("/api/v1/optim_step", fmt.Sprintf(`{"optimizer_params":{"type":"dimuon","learning_rate":1},"model_id":%q,"seq_id":6}`, run)).status)

	ttl := int64(3600)
	require.Equal(t, 200, e.postJSON("/api/v1/save_weights", fmt.Sprintf(`{"model_id":%q,"path":"ckpt-1","seq_id":6,"ttl_seconds":3600,"overwrite":true}`, run)).status)
	require.Empty(t, cmp.Diff(&loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 6, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "ckpt-1", TtlSeconds: &ttl, Overwrite: true},
		e.core.lastReq("SaveWeights"), protocmp.Transform()))
	require.Equal(t, 400, e.postJSON("/api/v1/save_weights", fmt.Sprintf(`{"model_id":%q,"path":"a/b","seq_id":7}`, run)).status)

	require.Equal(t, 200, e.postJSON("/api/v1/save_weights_external", fmt.Sprintf(`{"model_id":%q,"path":"download","seq_id":7,"ttl_seconds":3600,"type":"save_weights_external"}`, run)).status)
	require.Empty(t, cmp.Diff(&loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 7, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL, Name: "download", TtlSeconds: &ttl},
		e.core.lastReq("SaveWeights"), protocmp.Transform()))
	enc := e.postJSON("/api/v1/save_weights_external", fmt.Sprintf(`{"model_id":%q,"path":"x","seq_id":7,"age_encryption_recipients":["age1xyz"]}`, run))
	require.Equal(t, 400, enc.status)
	require.Contains(t, enc.json(t)["detail"], "age_encryption_recipients is not supported")

	require.Equal(t, 200, e.postJSON("/api/v1/save_weights_for_sampler", fmt.Sprintf(`{"model_id":%q,"path":"s1","kind":"snapshot","seq_id":7}`, run)).status)
	require.Empty(t, cmp.Diff(&loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 7, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "s1"},
		e.core.lastReq("SaveWeights"), protocmp.Transform()))
	ss := int64(3)
	require.Equal(t, 200, e.postJSON("/api/v1/save_weights_for_sampler", fmt.Sprintf(`{"model_id":%q,"sampling_session_seq_id":3,"kind":"inflight","seq_id":8}`, run)).status)
	require.Empty(t, cmp.Diff(&loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 8, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, SamplerSeqId: &ss, Inflight: true},
		e.core.lastReq("SaveWeights"), protocmp.Transform()))
	r = e.postJSON("/api/v1/save_weights_for_sampler", fmt.Sprintf(`{"model_id":%q,"path":"s2","kind":"inflight","seq_id":9}`, run))
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "applies to unnamed saves")

	require.Equal(t, 200, e.postJSON("/api/v1/load_weights", fmt.Sprintf(`{"model_id":%q,"path":"tinker://%s/weights/ckpt-1","seq_id":9,"optimizer":true}`, run, run)).status)
	require.Empty(t, cmp.Diff(&loopsv1.LoadWeightsRequest{TrainingRunId: run, SeqId: 9, Path: "tinker://" + run + "/weights/ckpt-1", WithOptimizer: true},
		e.core.lastReq("LoadWeights"), protocmp.Transform()))

	r = e.postJSON("/api/v1/unload_model", fmt.Sprintf(`{"model_id":%q,"type":"unload_model"}`, run))
	require.Equal(t, 200, r.status)
}

// SDK 0.38 create_training_client_from_state: session-addressed load_weights, then the
// "<session>:train:<n>" alias everywhere.
func TestCreateViaLoadAlias(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprint("lazy=", lazy), func(t *testing.T) {
			e := newEnv(t)
			e.core.lazyRunID = lazy
			sid := e.postJSON("/api/v1/create_session", `{"tags":[],"user_metadata":{}}`).json(t)["session_id"].(string)
			r := e.postJSON("/api/v1/load_weights", fmt.Sprintf(`{"session_id":%q,"model_seq_id":2,"path":"tinker://r0/weights/c","optimizer":true,"type":"load_weights"}`, sid))
			require.Equal(t, 200, r.status, string(r.body))
			seq := int64(2)
			require.Empty(t, cmp.Diff(&loopsv1.CreateTrainingRunRequest{SessionId: sid, ClientSeqId: &seq, FromCheckpoint: "tinker://r0/weights/c", WithOptimizer: true,
				Client: &loopsv1.ClientInfo{Name: "Go-http-client", Version: "1.1", UserAgent: "Go-http-client/1.1"}},
				e.core.lastReq("CreateTrainingRun"), protocmp.Transform()))
			// compat passes the alias to the core, which knows runs by it.
			alias := sid + ":train:2"
			r = e.postJSON("/api/v1/get_info", fmt.Sprintf(`{"model_id":%q}`, alias))
			require.Equal(t, 200, r.status, string(r.body))
			require.Equal(t, alias, r.json(t)["model_id"])
			require.Equal(t, alias, e.core.lastReq("GetTrainingRun").(*loopsv1.GetTrainingRunRequest).Id)

			fb := &publicv1.ForwardBackwardRequest{ModelId: alias, SeqId: 1, LossFn: "cross_entropy"}
			b, _ := proto.Marshal(fb)
			r = e.do("POST", "/api/v1/forward_backward", b, map[string]string{"Content-Type": contentTypeProto})
			require.Equal(t, 200, r.status, string(r.body))
			require.Equal(t, alias, e.core.lastReq("ForwardBackward").(*loopsv1.ForwardBackwardRequest).TrainingRunId)
		})
	}
}

func fbProtoBody(t *testing.T, model string) []byte {
	b := mustHex(t, goldenFBRequest)
	var m publicv1.ForwardBackwardRequest
	require.NoError(t, proto.Unmarshal(b, &m))
	m.ModelId = model
	out, err := proto.Marshal(&m)
	require.NoError(t, err)
	return out
}

func TestForwardBackwardBodies(t *testing.T) {
	e := newEnv(t)
	_, run := e.newRun()
	wantData := []*loopsv1.Datum{{Tokens: []int32{1, 2, 3}, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{3}, Int64Data: []int64{2, 3, 4}},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{3}, Float32Data: []float32{0, 1, 1}},
	}}}
	check := func(forwardOnly bool) {
		t.Helper()
		require.Empty(t, cmp.Diff(&loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: 1, LossFn: "cross_entropy", Data: wantData, ForwardOnly: forwardOnly},
			e.core.lastReq("ForwardBackward"), protocmp.Transform()))
	}
	body := fbProtoBody(t, run)

	r := e.do("POST", "/api/v1/forward_backward", body, map[string]string{"Content-Type": contentTypeProto})
	require.Equal(t, 200, r.status, string(r.body))
	require.NotEmpty(t, r.json(t)["request_id"])
	check(false)

	enc, _ := zstd.NewWriter(nil)
	r = e.do("POST", "/api/v1/forward_backward", enc.EncodeAll(body, nil), map[string]string{"Content-Type": contentTypeProto, "Content-Encoding": "zstd"})
	require.Equal(t, 200, r.status, string(r.body))
	check(false)

	js := fmt.Sprintf(`{"forward_backward_input":{"data":[{"model_input":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},
		"loss_fn_inputs":{"target_tokens":{"data":[2,3,4],"dtype":"int64","shape":[3]},"weights":{"data":[0,1,1],"dtype":"float32","shape":[3]}}}],
		"loss_fn":"cross_entropy"},"model_id":%q,"seq_id":1,"type":"forward_backward"}`, run)
	r = e.postJSON("/api/v1/forward_backward", js)
	require.Equal(t, 200, r.status, string(r.body))
	check(false)
	r = e.postJSON("/api/v1/forward", string(bytes.Replace([]byte(js), []byte("forward_backward_input"), []byte("forward_input"), 1)))
	require.Equal(t, 200, r.status, string(r.body))
	check(true)

	// Client mistakes.
	r = e.do("POST", "/api/v1/forward_backward", []byte{0xff, 0xff, 0xff}, map[string]string{"Content-Type": contentTypeProto})
	require.Equal(t, 400, r.status)
	r = e.do("POST", "/api/v1/forward_backward", []byte("not zstd"), map[string]string{"Content-Type": contentTypeProto, "Content-Encoding": "zstd"})
	require.Equal(t, 400, r.status)
	r = e.do("POST", "/api/v1/forward_backward", body, map[string]string{"Content-Type": contentTypeProto, "Content-Encoding": "br"})
	require.Equal(t, 415, r.status)
	r = e.do("POST", "/api/v1/forward_backward", fbProtoBody(t, "missing"), map[string]string{"Content-Type": contentTypeProto})
	require.Equal(t, 404, r.status)

	// Oversize body (limit 1 MiB in tests) and a zip bomb (4 MiB decompressed limit).
	r = e.do("POST", "/api/v1/forward_backward", make([]byte, 2<<20), map[string]string{"Content-Type": contentTypeProto})
	require.Equal(t, 413, r.status)
	bomb := enc.EncodeAll(make([]byte, 64<<20), nil)
	require.Less(t, len(bomb), 1<<20)
	r = e.do("POST", "/api/v1/forward_backward", bomb, map[string]string{"Content-Type": contentTypeProto, "Content-Encoding": "zstd"})
	require.Equal(t, 413, r.status, string(r.body))
}

func TestZstdStreamingBomb(t *testing.T) {
	// A frame without a declared content size, decoded in a stream.
	var buf bytes.Buffer
	w, _ := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest))
	zeros := make([]byte, 1<<20)
	for i := 0; i < 32; i++ {
		_, _ = w.Write(zeros)
	}
	require.NoError(t, w.Close())
	_, err := decompressZstd(t.Context(), buf.Bytes(), 4<<20, nil)
	require.Error(t, err)
	status, _, _ := classify(err)
	require.Equal(t, 413, status)

	out, err := decompressZstd(t.Context(), buf.Bytes(), 64<<20, nil)
	require.NoError(t, err)
	require.Len(t, out, 32<<20)
}

func TestRetrieveFuture(t *testing.T) {
	e := newEnv(t)
	_, run := e.newRun()
	post := func(id string, accept string) resp {
		h := map[string]string{"Content-Type": "application/json"}
		if accept != "" {
			h["Accept"] = accept
		}
		return e.do("POST", "/api/v1/retrieve_future", []byte(fmt.Sprintf(`{"request_id":%q,"allow_metadata_only":true}`, id)), h)
	}
	fbReq := fbProtoBody(t, run)
	id := e.do("POST", "/api/v1/forward_backward", fbReq, map[string]string{"Content-Type": contentTypeProto}).json(t)["request_id"].(string)

	// Pending → try_again.
	r := post(id, contentTypeProto)
	require.Equal(t, 200, r.status)
	require.JSONEq(t, fmt.Sprintf(`{"type":"try_again","request_id":%q,"queue_state":"active"}`, id), string(r.body))
	require.Equal(t, "25s", (&Options{}).withDefaults().LongPoll.String())
	// The scheduler's queue state and reason reach the SDK (issue 25 item 3).
	e.core.mu.Lock()
	e.core.ops[id].Queue = &loopsv1.QueueStatus{State: loopsv1.QueueState_QUEUE_STATE_PAUSED_CAPACITY, Reason: "all 2 batches of m are running"}
	e.core.mu.Unlock()
	r = post(id, contentTypeProto)
	require.JSONEq(t, fmt.Sprintf(`{"type":"try_again","request_id":%q,"queue_state":"paused_capacity","queue_state_reason":"all 2 batches of m are running"}`, id), string(r.body))
	e.core.mu.Lock()
	e.core.ops[id].Queue = &loopsv1.QueueStatus{State: loopsv1.QueueState_QUEUE_STATE_PAUSED_RATE_LIMIT, Reason: "sampling_concurrency"}
	e.core.mu.Unlock()
	require.Equal(t, "paused_rate_limit", post(id, contentTypeProto).json(t)["queue_state"])
	e.core.mu.Lock()
	e.core.ops[id].Queue = nil
	e.core.mu.Unlock()

	// Success as proto and as legacy JSON.
	e.core.finish(id, func(op *loopsv1.Operation) {
		op.Result = &loopsv1.Operation_ForwardBackward{ForwardBackward: &loopsv1.ForwardBackwardResult{
			Outputs: []*loopsv1.DatumOutput{{Outputs: map[string]*loopsv1.Tensor{"logprobs": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{3}, Float32Data: []float32{-0.5, -1.25, -2}}}}},
			Metrics: map[string]float64{"loss:sum": 3.25}}}
	})
	r = post(id, contentTypeProto)
	require.Equal(t, 200, r.status)
	require.Contains(t, r.header.Get("Content-Type"), contentTypeProto)
	var got, want publicv1.ForwardBackwardOutput
	require.NoError(t, proto.Unmarshal(r.body, &got))
	require.NoError(t, proto.Unmarshal(mustHex(t, goldenFBOutput), &want))
	require.Empty(t, cmp.Diff(&want, &got, protocmp.Transform()))
	r = post(id, "application/json")
	require.JSONEq(t, `{"loss_fn_output_type":"ArrayRecord","loss_fn_outputs":[{"logprobs":{"data":[-0.5,-1.25,-2],"dtype":"float32","shape":[3]}}],"metrics":{"loss:sum":3.25}}`, string(r.body))

	// Failure.
	id2 := e.postJSON("/api/v1/optim_step", fmt.Sprintf(`{"adam_params":{},"model_id":%q,"seq_id":2}`, run)).json(t)["request_id"].(string)
	e.core.mu.Lock()
	e.core.ops[id2].State = loopsv1.OperationState_OPERATION_STATE_FAILED
	e.core.ops[id2].Error = &loopsv1.OperationError{Code: int32(connect.CodeInvalidArgument), Message: "target_tokens has 2 values; the input has 3"}
	e.core.mu.Unlock()
	r = post(id2, "")
	require.JSONEq(t, `{"error":"target_tokens has 2 values; the input has 3","category":"user"}`, string(r.body))

	// Optim step success with a bad metric key dropped.
	id3 := e.postJSON("/api/v1/optim_step", fmt.Sprintf(`{"adam_params":{},"model_id":%q,"seq_id":3}`, run)).json(t)["request_id"].(string)
	e.core.finish(id3, func(op *loopsv1.Operation) {
		op.Result = &loopsv1.Operation_OptimStep{OptimStep: &loopsv1.OptimStepResult{Metrics: map[string]float64{"grad_norm:mean": 1.5, "lr": 1}}}
	})
	require.JSONEq(t, `{"metrics":{"grad_norm:mean":1.5}}`, string(post(id3, "").body))

	// Saves.
	id4 := e.postJSON("/api/v1/save_weights_for_sampler", fmt.Sprintf(`{"model_id":%q,"sampling_session_seq_id":0,"seq_id":4}`, run)).json(t)["request_id"].(string)
	e.core.finish(id4, func(op *loopsv1.Operation) {
		op.Result = &loopsv1.Operation_SaveWeights{SaveWeights: &loopsv1.SaveWeightsResult{Path: "tinker://r/sampler_weights/eph", SamplerId: "smp9"}}
	})
	// An unnamed sampler save answers with the sampler only (tinker 0.18 asserts no path).
	require.JSONEq(t, `{"sampling_session_id":"smp9"}`, string(post(id4, "").body))

	// Create model result.
	sid := e.postJSON("/api/v1/create_session", `{}`).json(t)["session_id"].(string)
	r = e.postJSON("/api/v1/create_model", fmt.Sprintf(`{"session_id":%q,"model_seq_id":0,"base_model":"Qwen/Qwen3-8B","lora_config":{"rank":4}}`, sid))
	cid, mid := r.json(t)["request_id"].(string), r.json(t)["model_id"].(string)
	e.core.finish(cid, func(*loopsv1.Operation) {})
	require.JSONEq(t, fmt.Sprintf(`{"model_id":%q}`, mid), string(post(cid, "").body))

	// Unknown request (never recorded: a restart lost it) and an expired result are gone:
	// 410, which the SDK turns into a re-submit for samples and an error for training.
	r = post("nope", "")
	require.Equal(t, 410, r.status)
	require.Contains(t, r.json(t)["detail"], "resubmit")
	e.core.setErr("WaitOperation", errs.New(connect.CodeFailedPrecondition, errs.ReasonResultExpired, errString("result expired: rerun the step")))
	r = post(id, "")
	require.Equal(t, 410, r.status)
	require.Equal(t, errs.ReasonResultExpired, r.json(t)["reason"])
	require.Equal(t, "result expired: rerun the step", r.json(t)["detail"])
	e.core.setErr("WaitOperation", connect.NewError(connect.CodeDeadlineExceeded, errString("slow")))
	require.Equal(t, "try_again", post(id, "").json(t)["type"])
	e.core.setErr("WaitOperation", connect.NewError(connect.CodeUnavailable, errString("draining")))
	require.Equal(t, 503, post(id, "").status)
}

func TestSamplingRoutes(t *testing.T) {
	e := newEnv(t)
	sid := e.postJSON("/api/v1/create_session", `{}`).json(t)["session_id"].(string)
	r := e.postJSON("/api/v1/create_sampling_session", fmt.Sprintf(`{"session_id":%q,"sampling_session_seq_id":3,"model_path":"tinker://r/sampler_weights/x","type":"create_sampling_session"}`, sid))
	require.Equal(t, 200, r.status)
	smp := r.json(t)["sampling_session_id"].(string)
	seq3 := int64(3)
	require.Empty(t, cmp.Diff(&loopsv1.CreateSamplerRequest{SessionId: sid, ClientSeqId: &seq3, ModelPath: "tinker://r/sampler_weights/x"},
		e.core.lastReq("CreateSampler"), protocmp.Transform()))

	r = e.get("/api/v1/samplers/" + smp)
	require.JSONEq(t, fmt.Sprintf(`{"sampler_id":%q,"base_model":"Qwen/Qwen3-8B","model_path":"tinker://r/sampler_weights/x"}`, smp), string(r.body))
	require.Equal(t, 404, e.get("/api/v1/samplers/none").status)

	body := fmt.Sprintf(`{"num_samples":2,"prompt":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},
		"sampling_params":{"max_tokens":16,"seed":18446744073709551615,"stop":["\n"],"temperature":0.7,"top_k":-1,"top_p":1.0},
		"sampling_session_id":%q,"seq_id":1000000000000000000,"prompt_logprobs":true,"topk_prompt_logprobs":2,"topk_sample_logprobs":0,
		"prompt_alt_tokens_k":0,"record_stability_info":false,"type":"sample"}`, smp)
	r = e.postJSON("/api/v1/asample", body)
	require.Equal(t, 200, r.status, string(r.body))
	fut := r.json(t)
	id := fut["request_id"].(string)
	require.Len(t, fut["sample_sequence_ids"], 2)
	seed, seq := uint64(18446744073709551615), int64(1000000000000000000)
	require.Empty(t, cmp.Diff(&loopsv1.SampleRequest{SamplerId: smp, SeqId: &seq, Prompt: []int32{1, 2, 3}, NumSamples: 2,
		Params:         &loopsv1.SamplingParams{MaxTokens: 16, Temperature: 0.7, TopK: -1, TopP: 1, Seed: &seed, StopStrings: []string{"\n"}},
		PromptLogprobs: true, TopkPromptLogprobs: 2}, e.core.lastReq("Sample"), protocmp.Transform()))

	e.core.finish(id, func(op *loopsv1.Operation) {
		op.Result = &loopsv1.Operation_Sample{Sample: &loopsv1.SampleResult{
			Sequences: []*loopsv1.SampledSequence{{Tokens: []int32{5}, Logprobs: []float32{-1}, StopReason: loopsv1.StopReason_STOP_REASON_STOP},
				{Tokens: []int32{6, 7}, Logprobs: []float32{-1, -2}, StopReason: loopsv1.StopReason_STOP_REASON_LENGTH}},
			TopkPromptLogprobs: &loopsv1.TopKLogprobs{K: 1, Length: 2, TokenIds: []int32{0, 4}, Logprobs: []float32{-99999, -0.5}},
			PromptCachedTokens: 2,
		}}
	})
	r = e.do("POST", "/api/v1/retrieve_future", []byte(fmt.Sprintf(`{"request_id":%q}`, id)), map[string]string{"Accept": contentTypeProto})
	require.Contains(t, r.header.Get("Content-Type"), contentTypeProto)
	var sr publicv1.SampleResponse
	require.NoError(t, proto.Unmarshal(r.body, &sr))
	require.Len(t, sr.Sequences, 2)
	require.Equal(t, publicv1.StopReason_STOP_REASON_LENGTH, sr.Sequences[1].StopReason)
	require.Equal(t, uint32(2), sr.TopkPromptLogprobs.GetLength())
	require.Equal(t, int32(2), sr.GetPromptCacheHitTokens(), "the prompt tokens served from the prefix cache")
	r = e.do("POST", "/api/v1/retrieve_future", []byte(fmt.Sprintf(`{"request_id":%q}`, id)), map[string]string{"Accept": "application/json"})
	require.JSONEq(t, `{"type":"sample","sequences":[{"stop_reason":"stop","tokens":[5],"logprobs":[-1]},{"stop_reason":"length","tokens":[6,7],"logprobs":[-1,-2]}],
		"topk_prompt_logprobs":[null,[[4,-0.5]]],"prompt_cache_hit_tokens":2}`, string(r.body))

	// Unsupported or malformed requests are 400 on the POST.
	for _, bad := range []string{
		`"sampling_params":{"stop":[]}`, `"sampling_params":{"seed":1.5}`, `"sampling_params":{"top_p":0}`,
		`"prompt":{"chunks":[{"type":"image","data":"AA==","format":"png"}]}`, `"num_samples":0`,
	} {
		r := e.postJSON("/api/v1/asample", fmt.Sprintf(`{"prompt":{"chunks":[]},"sampling_params":{},"sampling_session_id":%q,%s}`, smp, bad))
		require.Equal(t, 400, r.status, bad)
	}
}

func TestRESTRoutes(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Owner = func(ctxAny) string { return "ws-1" } })
	sid, run := e.newRun()
	path := "tinker://" + run + "/weights/c1"
	e.core.ckpts[path] = &loopsv1.Checkpoint{Id: "weights/c1", TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "c1",
		TinkerPath: path, SizeBytes: 42, BaseModel: "Qwen/Qwen3-8B", Lora: &loopsv1.LoraConfig{Rank: 16, TrainAttn: true}}

	r := e.get("/api/v1/training_runs?limit=5&offset=0&access_scope=owned")
	require.Equal(t, 200, r.status)
	require.JSONEq(t, fmt.Sprintf(`{"training_runs":[{"training_run_id":%q,"base_model":"Qwen/Qwen3-8B","model_owner":"ws-1","is_lora":true,"corrupted":false,
		"lora_rank":16,"last_request_time":"2026-01-02T03:04:05Z","last_checkpoint":null,"last_sampler_checkpoint":null,"user_metadata":{"a":"b"}}],
		"cursor":{"offset":0,"limit":5,"total_count":1}}`, run), string(r.body))
	require.Equal(t, 400, e.get("/api/v1/training_runs?limit=-1").status)
	require.Equal(t, 200, e.get("/api/v1/training_runs/"+run).status)
	require.Equal(t, 404, e.get("/api/v1/training_runs/none").status)

	r = e.get("/api/v1/training_runs/" + run + "/checkpoints")
	require.JSONEq(t, fmt.Sprintf(`{"checkpoints":[{"checkpoint_id":"weights/c1","checkpoint_type":"training","time":"1970-01-01T00:00:00Z","tinker_path":%q,"size_bytes":42,"public":false}],"cursor":null}`, path), string(r.body))
	r = e.get("/api/v1/checkpoints?limit=10&offset=0")
	require.Equal(t, float64(1), r.json(t)["cursor"].(map[string]any)["total_count"])

	r = e.postJSON("/api/v1/weights_info", fmt.Sprintf(`{"tinker_path":%q}`, path))
	require.JSONEq(t, `{"base_model":"Qwen/Qwen3-8B","is_lora":true,"lora_rank":16,"train_unembed":false,"train_mlp":false,"train_attn":true,"optimizer_config":{"type":"adamw"}}`, string(r.body))

	base := "/api/v1/training_runs/" + run + "/checkpoints/weights/c1"
	require.Equal(t, 200, e.do("POST", base+"/publish", nil, map[string]string{"Content-Type": "application/json"}).status)
	require.True(t, e.core.ckpts[path].Public)
	require.Equal(t, 200, e.do("DELETE", base+"/publish", nil, nil).status)
	require.False(t, e.core.ckpts[path].Public)
	require.Equal(t, 200, e.do("PUT", base+"/ttl", []byte(`{"ttl_seconds":7200}`), map[string]string{"Content-Type": "application/json"}).status)
	require.Equal(t, int64(7200), *e.core.lastReq("SetCheckpointTTL").(*loopsv1.SetCheckpointTTLRequest).TtlSeconds)
	require.Equal(t, 200, e.do("PUT", base+"/ttl", []byte(`{"ttl_seconds":null}`), nil).status)
	require.Nil(t, e.core.lastReq("SetCheckpointTTL").(*loopsv1.SetCheckpointTTLRequest).TtlSeconds)
	require.Equal(t, 400, e.do("PUT", base+"/ttl", []byte(`{"ttl_seconds":0}`), nil).status)

	r = e.get(base + "/external_weights_urls")
	require.Equal(t, 200, r.status)
	require.Equal(t, map[string]any{"adapter_config.json": e.srv.URL + "/files/tok/adapter_config.json"}, r.json(t)["urls"])
	require.Equal(t, "2030-01-01T00:15:00Z", r.json(t)["expires"])

	r = e.get(base + "/archive")
	require.Equal(t, 302, r.status)
	require.Equal(t, e.srv.URL+"/archive/abc.tar?sig=1", r.header.Get("Location"))
	require.Equal(t, "Tue, 01 Jan 2030 00:15:00 GMT", r.header.Get("Expires"))
	require.Equal(t, e.srv.URL+"/archive/abc.tar?sig=1", r.json(t)["url"])
	require.Equal(t, "2030-01-01T00:15:00Z", r.json(t)["expires"])

	require.Equal(t, 400, e.do("DELETE", "/api/v1/training_runs/"+run+"/checkpoints/other/c1", nil, nil).status)
	require.Equal(t, 200, e.do("DELETE", base, nil, nil).status)
	require.Equal(t, 404, e.do("DELETE", base, nil, nil).status)

	r = e.get("/api/v1/sessions?limit=20&offset=0")
	require.Equal(t, []any{sid}, r.json(t)["sessions"])
	r = e.get("/api/v1/sessions/" + sid)
	require.JSONEq(t, fmt.Sprintf(`{"training_run_ids":[%q],"sampler_ids":[]}`, run), string(r.body))

	e.core.setErr("ListSessions", connect.NewError(connect.CodePermissionDenied, errString("not yours")))
	r = e.get("/api/v1/sessions")
	require.Equal(t, 403, r.status)
	require.JSONEq(t, `{"detail":"not yours","code":"permission_denied","reason":"PERMISSION_DENIED"}`, string(r.body))
}

func TestPanicIsRecovered(t *testing.T) {
	e := newEnv(t)
	h := ErrorSurface("compat", e.srvLogger()).Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := newRecorder()
	h.ServeHTTP(rec, httpRequest("GET", "/api/v1/x"))
	require.Equal(t, 500, rec.Code)
	require.Contains(t, rec.Body.String(), "internal error")
}

func TestBillingUsageEvents(t *testing.T) {
	e := newEnv(t)
	sid := e.postJSON("/api/v1/create_session", `{"tags":[],"user_metadata":{"team":"x"},"sdk_version":"0.38.0","project_id":"vis"}`).json(t)["session_id"].(string)
	h0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	bucket := func(h int, kind loopsv1.UsageKind, session string, amount int64) *loopsv1.UsageBucket {
		start := h0.Add(time.Duration(h) * time.Hour)
		return &loopsv1.UsageBucket{StartTime: timestamppb.New(start), EndTime: timestamppb.New(start.Add(time.Hour)),
			BaseModel: "Qwen/Qwen3-8B", SessionId: session, Kind: kind, Amount: amount}
	}
	e.core.usage = []*loopsv1.UsageBucket{
		bucket(0, loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, sid, 100),
		bucket(0, loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS, sid, 40),
		bucket(0, loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS, sid, 32),
		bucket(0, loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, sid, 400),
		bucket(1, loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS, sid, 2),
		bucket(1, loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, "gone", 5),
	}

	r := e.get("/api/v1/billing/usage/events?starting_on=2025-03-01T12%3A00%3A00%2B00%3A00&ending_before=2025-03-01T14:00:00Z")
	require.Equal(t, 200, r.status, string(r.body))
	require.JSONEq(t, `{"data":[
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":"`+sid+`","project_id":"vis",
		 "event_info":{"type":"sampling_sample","token_count":400}},
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":"`+sid+`","project_id":"vis",
		 "event_info":{"type":"training","token_count":100}},
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":"`+sid+`","project_id":"vis",
		 "event_info":{"type":"sampling_prefill","cached":false,"token_count":40}},
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":"`+sid+`","project_id":"vis",
		 "event_info":{"type":"sampling_prefill","cached":true,"token_count":32}},
		{"bucket_start":"2025-03-01T13:00:00Z","bucket_end":"2025-03-01T14:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":"gone","project_id":null,
		 "event_info":{"type":"training","token_count":5}},
		{"bucket_start":"2025-03-01T13:00:00Z","bucket_end":"2025-03-01T14:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":"`+sid+`","project_id":"vis",
		 "event_info":{"type":"checkpoint","count":2}}
	],"sessions":{"`+sid+`":{"user_metadata":{"team":"x"}}}}`, string(r.body))
	require.Empty(t, cmp.Diff(&loopsv1.GetUsageRequest{
		StartTime: timestamppb.New(h0), EndTime: timestamppb.New(h0.Add(2 * time.Hour)),
	}, e.core.lastReq("GetUsage"), protocmp.Transform()))

	// Priced buckets carry their exact cost and rate; a partly priced one (a sheet loaded
	// within the hour) and a checkpoint count carry none.
	priced := bucket(0, loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, "", 3)
	priced.CostUsd, priced.PricedAmount = "0.0000018", 3
	partly := bucket(0, loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, "", 10)
	partly.CostUsd, partly.PricedAmount = "0.000002", 5
	ck := bucket(0, loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS, "", 1)
	ck.CostUsd, ck.PricedAmount = "0.01", 1
	e.core.usage = []*loopsv1.UsageBucket{priced, partly, ck}
	r = e.get("/api/v1/billing/usage/events")
	require.Equal(t, 200, r.status, string(r.body))
	require.JSONEq(t, `{"data":[
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":null,"project_id":null,
		 "event_info":{"type":"training","token_count":10}},
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":null,"project_id":null,
		 "estimated_cost_usd":0.0000018,"effective_rate_usd_per_million_tokens":0.6,"event_info":{"type":"sampling_sample","token_count":3}},
		{"bucket_start":"2025-03-01T12:00:00Z","bucket_end":"2025-03-01T13:00:00Z","base_model":"Qwen/Qwen3-8B","session_id":null,"project_id":null,
		 "event_info":{"type":"checkpoint","count":1}}
	],"sessions":{}}`, string(r.body))

	// Naive times are UTC; a '+' sent unescaped (decoded to a space) still parses; bounds may
	// be left to the core's defaults.
	require.Equal(t, 200, e.get("/api/v1/billing/usage/events?starting_on=2025-03-01T12:00:00&ending_before=2025-03-01T14:00:00+00:00").status)
	require.Empty(t, cmp.Diff(&loopsv1.GetUsageRequest{
		StartTime: timestamppb.New(h0), EndTime: timestamppb.New(h0.Add(2 * time.Hour)),
	}, e.core.lastReq("GetUsage"), protocmp.Transform()))
	require.Equal(t, 200, e.get("/api/v1/billing/usage/events").status)
	require.Empty(t, cmp.Diff(&loopsv1.GetUsageRequest{}, e.core.lastReq("GetUsage"), protocmp.Transform()))

	// Bad times are the caller's error; the core's refusals pass through.
	r = e.get("/api/v1/billing/usage/events?starting_on=yesterday")
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "starting_on")
	e.core.setErr("GetUsage", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("end_time is before start_time")))
	require.Equal(t, 400, e.get("/api/v1/billing/usage/events").status)

	// An empty range answers an empty list, not null.
	e.core.setErr("GetUsage", nil)
	e.core.usage = nil
	require.JSONEq(t, `{"data":[],"sessions":{}}`, string(e.get("/api/v1/billing/usage/events").body))
}
