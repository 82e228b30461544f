package blackbox

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/conformance/protocol"
	conformancev1 "github.com/loops-dev/loops/gen/go/loops/conformance/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

// Config says which server to check and how.
type Config struct {
	// Target is the server root, e.g. "http://127.0.0.1:8080" or a hosted Tinker base URL
	// (the part before /api/v1).
	Target string
	// APIKey is sent as X-API-Key.
	APIKey string
	// OtherAPIKey, when set, is a key of another workspace; isolation cases need it.
	OtherAPIKey string
	// OperatorAPIKey, when set, is an operator key; the API-key cases (keys.yaml) need it.
	OperatorAPIKey string
	// BaseModel is the model to train and sample (default "loops/tiny").
	BaseModel string
	// MaxBodyBytes is the server's request body limit, when known (over-limit cases need it).
	MaxBodyBytes int64
	// OpenMode says the server accepts any well-formed key by design (`loops serve` with no
	// keys configured); the unknown-key case is skipped.
	OpenMode bool
	// KnownFailing lists checks and cases expected to fail ("sdk/<check>",
	// "<file>/<case>/tinker").
	KnownFailing *protocol.KnownFailing
	// Timeout bounds each SDK check and each protocol case (default 5 minutes: a hosted
	// server may queue work).
	Timeout time.Duration
	// SkipProtocol runs only the SDK checks.
	SkipProtocol bool
	// Wire is how the SDK checks send forward_backward: WireProto (default), as tinker ≥
	// 0.25 always does, or WireJSON, the JSON body of tinker ≤ 0.24 (a server that has not
	// caught up with the protobuf wire can still be checked on everything else).
	Wire string
	// HTTPClient is used for every request (default: 10-minute timeout).
	HTTPClient *http.Client
	// Logger receives progress at debug level (default slog.Default()).
	Logger *slog.Logger
}

// The forward_backward wires of Config.Wire.
const (
	WireProto = "proto"
	WireJSON  = "json"
)

// Report is the outcome of a run, SDK checks first, then protocol cases.
type Report struct {
	Target  string            `json:"target"`
	Results []protocol.Result `json:"results"`
	Passed  int               `json:"passed"`
	Failed  int               `json:"failed"`
	Skipped int               `json:"skipped"`
	// KnownFailing counts results that failed as listed in the known-failing file.
	KnownFailing int `json:"known_failing"`
}

// OK reports whether nothing failed (known failures do not count).
func (r *Report) OK() bool { return r.Failed == 0 }

// Run runs the SDK checks and the Tinker-surface protocol cases against cfg.Target.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Target == "" {
		return nil, errors.New("blackbox: Target is required")
	}
	if cfg.APIKey == "" {
		return nil, errors.New("blackbox: APIKey is required (the tinker SDK refuses to run without one)")
	}
	if cfg.BaseModel == "" {
		cfg.BaseModel = "loops/tiny"
	}
	switch cfg.Wire {
	case "":
		cfg.Wire = WireProto
	case WireProto, WireJSON:
	default:
		return nil, fmt.Errorf("blackbox: Wire %q is not %q or %q", cfg.Wire, WireProto, WireJSON)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Minute}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Target = strings.TrimSuffix(cfg.Target, "/")
	rep := &Report{Target: cfg.Target}
	rep.Results = append(rep.Results, runSDKChecks(ctx, cfg)...)
	if !cfg.SkipProtocol {
		res, err := protocol.Execute(ctx, cfg.Target, protocol.Options{
			APIKey:         cfg.APIKey,
			OtherAPIKey:    cfg.OtherAPIKey,
			OperatorAPIKey: cfg.OperatorAPIKey,
			BaseModel:      cfg.BaseModel,
			Surfaces:       []conformancev1.Surface{conformancev1.Surface_SURFACE_TINKER},
			MaxBodyBytes:   cfg.MaxBodyBytes,
			OpenMode:       cfg.OpenMode,
			KnownFailing:   cfg.KnownFailing,
			HTTPClient:     cfg.HTTPClient,
			CaseTimeout:    cfg.Timeout,
			Parallel:       4,
			Logger:         cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, res...)
	}
	for _, r := range rep.Results {
		switch r.Status {
		case protocol.StatusPass:
			rep.Passed++
		case protocol.StatusSkip:
			rep.Skipped++
		case protocol.StatusKnownFailing:
			rep.KnownFailing++
		default:
			rep.Failed++
		}
	}
	return rep, nil
}

// sdkState is what the SDK checks pass along, as the SDK's clients would hold it.
type sdkState struct {
	sessionID   string
	modelID     string
	samplerPath string
	samplerID   string
	seq         int32
}

// sdkCheck is one SDK-level check: what it needs from earlier checks, and what it does.
type sdkCheck struct {
	name  string
	needs func(*sdkState) string
	run   func(context.Context, *protocol.TinkerClient, *sdkState, Config) error
}

func needSession(s *sdkState) string {
	if s.sessionID == "" {
		return "create_session"
	}
	return ""
}

func needModel(s *sdkState) string {
	if s.modelID == "" {
		return "create_model"
	}
	return ""
}

func needSampler(s *sdkState) string {
	if s.samplerID == "" {
		return "create_sampling_session"
	}
	return ""
}

// sdkChecks are the calls the tinker SDK (0.38) makes for a short SFT-then-sample script, in
// its order, done with plain HTTP.
var sdkChecks = []sdkCheck{
	{name: "client_config", run: checkClientConfig},
	{name: "create_session", run: checkCreateSession},
	{name: "session_heartbeat", needs: needSession, run: checkHeartbeat},
	{name: "create_model", needs: needSession, run: checkCreateModel},
	{name: "get_info", needs: needModel, run: checkGetInfo},
	{name: "forward_backward", needs: needModel, run: checkForwardBackward},
	{name: "optim_step", needs: needModel, run: checkOptimStep},
	{name: "save_weights_for_sampler", needs: needModel, run: checkSaveForSampler},
	{name: "create_sampling_session", needs: func(s *sdkState) string {
		if s.samplerPath == "" {
			return "save_weights_for_sampler"
		}
		return needSession(s)
	}, run: checkCreateSampler},
	{name: "asample", needs: needSampler, run: checkSample},
	{name: "training_runs", needs: needModel, run: checkTrainingRuns},
	{name: "checkpoints", needs: func(s *sdkState) string {
		if s.samplerPath == "" {
			return "save_weights_for_sampler"
		}
		return ""
	}, run: checkCheckpoints},
	{name: "finish_session", needs: needSession, run: checkFinish},
}

// SDKCheckNames lists the SDK checks in the order they run.
func SDKCheckNames() []string {
	out := make([]string, len(sdkChecks))
	for i, c := range sdkChecks {
		out[i] = "sdk/" + c.name
	}
	return out
}

func runSDKChecks(ctx context.Context, cfg Config) []protocol.Result {
	cl := &protocol.TinkerClient{BaseURL: cfg.Target, APIKey: cfg.APIKey, HTTP: cfg.HTTPClient}
	st := &sdkState{}
	var out []protocol.Result
	for _, c := range sdkChecks {
		res := protocol.Result{Name: "sdk/" + c.name, Surface: "tinker"}
		if c.needs != nil {
			if dep := c.needs(st); dep != "" {
				res.Status, res.Reason = protocol.StatusSkip, "needs sdk/"+dep+", which failed"
				out = append(out, res)
				continue
			}
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		err := c.run(cctx, cl, st, cfg)
		cancel()
		res.Duration = time.Since(start)
		reason, known := cfg.KnownFailing.Match(res.Name)
		switch {
		case err == nil && known:
			res.Status, res.Reason = protocol.StatusUnexpectedPass, "passes but is listed as known-failing ("+reason+"): remove the entry"
		case err == nil:
			res.Status = protocol.StatusPass
		case known:
			res.Status, res.Reason = protocol.StatusKnownFailing, reason+": "+err.Error()
		default:
			res.Status, res.Reason = protocol.StatusFail, err.Error()
		}
		cfg.Logger.Debug("conformance check done", slog.String("check", res.Name), slog.String("status", string(res.Status)))
		out = append(out, res)
	}
	return out
}

// post sends a JSON body and requires a 2xx JSON object answer.
func post(ctx context.Context, cl *protocol.TinkerClient, path string, body any) (map[string]any, error) {
	res, err := cl.Do(ctx, http.MethodPost, path, body, "", nil)
	if err != nil {
		return nil, err
	}
	return object(res, "POST "+path)
}

func get(ctx context.Context, cl *protocol.TinkerClient, path string) (map[string]any, error) {
	res, err := cl.Do(ctx, http.MethodGet, path, nil, "", nil)
	if err != nil {
		return nil, err
	}
	return object(res, "GET "+path)
}

func object(res *protocol.HTTPResult, what string) (map[string]any, error) {
	if res.Status/100 != 2 {
		return nil, fmt.Errorf("%s answered %d: %.300s", what, res.Status, res.Message())
	}
	m, ok := res.Doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s answered %s, not a JSON object: %.200s", what, res.ContentType, res.Body)
	}
	return m, nil
}

// str reads a required string field.
func str(m map[string]any, key, what string) (string, error) {
	s, ok := m[key].(string)
	if !ok || s == "" {
		b, _ := json.Marshal(m)
		return "", fmt.Errorf("%s: no %q in %.300s", what, key, b)
	}
	return s, nil
}

// submitAndWait posts a future-returning request and long-polls its result, as the SDK's
// APIFuture does.
func submitAndWait(ctx context.Context, cl *protocol.TinkerClient, path string, body any, contentType string) (map[string]any, *protocol.FutureResult, error) {
	res, err := cl.Do(ctx, http.MethodPost, path, body, contentType, nil)
	if err != nil {
		return nil, nil, err
	}
	fut, err := object(res, "POST "+path)
	if err != nil {
		return nil, nil, err
	}
	rid, err := str(fut, "request_id", path+" future")
	if err != nil {
		return nil, nil, err
	}
	fr, err := cl.Retrieve(ctx, rid, protocol.ResultType(path))
	if err != nil {
		return nil, nil, err
	}
	if fr.Failed {
		return nil, nil, fmt.Errorf("%s failed (category %q): %s", path, fr.Category, fr.Error)
	}
	return fut, fr, nil
}

func docObject(fr *protocol.FutureResult, what string) (map[string]any, error) {
	m, ok := fr.Doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: the result is not a JSON object", what)
	}
	return m, nil
}

func checkClientConfig(ctx context.Context, cl *protocol.TinkerClient, _ *sdkState, _ Config) error {
	m, err := post(ctx, cl, "/api/v1/client/config", map[string]any{"sdk_version": "0.38.0"})
	if err != nil {
		return err
	}
	// The SDK reads these flags; a server that turns on flows it cannot serve breaks it.
	for _, k := range []string{"pjwt_auth_enabled", "proto_compress_fwdbwd"} {
		if v, ok := m[k]; ok {
			if _, isBool := v.(bool); !isBool {
				return fmt.Errorf("client/config %q is %v, not a boolean", k, v)
			}
		}
	}
	return nil
}

func checkCreateSession(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	m, err := post(ctx, cl, "/api/v1/create_session", map[string]any{
		"tags": []string{"loops-conformance"}, "user_metadata": map[string]any{}, "sdk_version": "0.38.0", "type": "create_session",
	})
	if err != nil {
		return err
	}
	st.sessionID, err = str(m, "session_id", "create_session")
	return err
}

func checkHeartbeat(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	_, err := post(ctx, cl, "/api/v1/session_heartbeat", map[string]any{"session_id": st.sessionID, "type": "session_heartbeat"})
	return err
}

func checkCreateModel(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, cfg Config) error {
	_, fr, err := submitAndWait(ctx, cl, "/api/v1/create_model", map[string]any{
		"session_id": st.sessionID, "model_seq_id": 0, "base_model": cfg.BaseModel,
		"lora_config":      map[string]any{"rank": 8, "seed": 1234, "train_unembed": true, "train_mlp": true, "train_attn": true},
		"optimizer_config": map[string]any{"type": "adamw"}, "type": "create_model",
	}, "")
	if err != nil {
		return err
	}
	m, err := docObject(fr, "create_model")
	if err != nil {
		return err
	}
	st.modelID, err = str(m, "model_id", "create_model result")
	return err
}

func checkGetInfo(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, cfg Config) error {
	m, err := post(ctx, cl, "/api/v1/get_info", map[string]any{"model_id": st.modelID, "type": "get_info"})
	if err != nil {
		return err
	}
	md, _ := m["model_data"].(map[string]any)
	if md == nil || md["model_name"] != cfg.BaseModel {
		return fmt.Errorf("get_info model_data.model_name is %v, want %q", md["model_name"], cfg.BaseModel)
	}
	return nil
}

// sftTokens is a short sequence every tokenizer's vocabulary holds (ids below 256).
var sftTokens = []int32{72, 101, 108, 108, 111, 44, 32, 119}

func le32(xs []int32) []byte {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

func checkForwardBackward(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, cfg Config) error {
	if cfg.Wire == WireJSON {
		return checkForwardBackwardJSON(ctx, cl, st)
	}
	n := len(sftTokens) - 1
	targets := make([]byte, 0, 8*n)
	weights := make([]byte, 0, 4*n)
	for i := range n {
		targets = binary.LittleEndian.AppendUint64(targets, uint64(sftTokens[i+1]))
		weights = binary.LittleEndian.AppendUint32(weights, math.Float32bits(1))
	}
	st.seq++
	req := &publicv1.ForwardBackwardRequest{
		ModelId: st.modelID, SeqId: st.seq, LossFn: "cross_entropy",
		Data: []*publicv1.Datum{{
			ModelInput: []*publicv1.Chunk{{Chunk: &publicv1.Chunk_EncodedText{EncodedText: &publicv1.EncodedTextChunk{Tokens: le32(sftTokens[:n])}}}},
			LossFnInputs: map[string]*publicv1.Tensor{
				"target_tokens": {Encoding: &publicv1.Tensor_Dense{Dense: targets}, Dtype: publicv1.DType_DTYPE_INT64, Shape: []int64{int64(n)}},
				"weights":       {Encoding: &publicv1.Tensor_Dense{Dense: weights}, Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{int64(n)}},
			},
		}},
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	_, fr, err := submitAndWait(ctx, cl, "/api/v1/forward_backward", body, protocol.ContentTypeProto)
	if err != nil {
		return err
	}
	if fr.Proto == nil {
		return errors.New("forward_backward result is JSON; the tinker SDK (≥ 0.25) accepts only a protobuf ForwardBackwardOutput")
	}
	out := fr.Proto.(*publicv1.ForwardBackwardOutput)
	m, _ := docObject(fr, "forward_backward")
	return checkForwardBackwardResult(out.GetMetrics(), m, len(sftTokens)-1)
}

// checkForwardBackwardJSON sends the JSON forward_backward body of tinker ≤ 0.24
// (docs/tinker-compat.md §9.2) and checks the result as checkForwardBackward does.
func checkForwardBackwardJSON(ctx context.Context, cl *protocol.TinkerClient, st *sdkState) error {
	n := len(sftTokens) - 1
	targets := make([]int32, n)
	weights := make([]float32, n)
	for i := range n {
		targets[i], weights[i] = sftTokens[i+1], 1
	}
	st.seq++
	_, fr, err := submitAndWait(ctx, cl, "/api/v1/forward_backward", map[string]any{
		"model_id": st.modelID, "seq_id": st.seq,
		"forward_backward_input": map[string]any{
			"loss_fn": "cross_entropy",
			"data": []any{map[string]any{
				"model_input": map[string]any{"chunks": []any{map[string]any{"type": "encoded_text", "tokens": sftTokens[:n]}}},
				"loss_fn_inputs": map[string]any{
					"target_tokens": map[string]any{"data": targets, "dtype": "int64", "shape": []int{n}},
					"weights":       map[string]any{"data": weights, "dtype": "float32", "shape": []int{n}},
				},
			}},
		},
	}, "")
	if err != nil {
		return err
	}
	m, err := docObject(fr, "forward_backward")
	if err != nil {
		return err
	}
	metrics := map[string]float64{}
	raw, _ := m["metrics"].(map[string]any)
	for k, v := range raw {
		num, ok := v.(json.Number)
		f, err := num.Float64()
		if !ok || err != nil {
			return fmt.Errorf("metric %q is %v, not a number", k, v)
		}
		metrics[k] = f
	}
	return checkForwardBackwardResult(metrics, m, n)
}

// checkForwardBackwardResult checks what the SDK needs of a forward_backward result: a
// finite loss:sum, name:reduction metric keys, and one logprob per input token.
func checkForwardBackwardResult(metrics map[string]float64, m map[string]any, n int) error {
	loss, ok := metrics["loss:sum"]
	if !ok || math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fmt.Errorf("metrics lack a finite loss:sum (the SDK requires it): %v", metrics)
	}
	for k := range metrics {
		if strings.Count(k, ":") != 1 {
			return fmt.Errorf("metric key %q is not name:reduction", k)
		}
	}
	outs, _ := m["loss_fn_outputs"].([]any)
	if len(outs) != 1 {
		return fmt.Errorf("%d loss_fn_outputs for 1 datum", len(outs))
	}
	lp, _ := outs[0].(map[string]any)["logprobs"].(map[string]any)
	data, _ := lp["data"].([]any)
	if len(data) != n {
		return fmt.Errorf("logprobs has %d values for %d input tokens", len(data), n)
	}
	return nil
}

func checkOptimStep(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	st.seq++
	_, fr, err := submitAndWait(ctx, cl, "/api/v1/optim_step", map[string]any{
		"model_id": st.modelID, "seq_id": st.seq, "type": "optim_step",
		"adam_params": map[string]any{"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "grad_clip_norm": 0.0},
	}, "")
	if err != nil {
		return err
	}
	m, err := docObject(fr, "optim_step")
	if err != nil {
		return err
	}
	if v, ok := m["metrics"]; ok && v != nil {
		if _, ok := v.(map[string]any); !ok {
			return fmt.Errorf("optim_step metrics is %T, not an object", v)
		}
	}
	return nil
}

func checkSaveForSampler(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	st.seq++
	name := fmt.Sprintf("conformance-%d", time.Now().UnixNano())
	_, fr, err := submitAndWait(ctx, cl, "/api/v1/save_weights_for_sampler", map[string]any{
		"model_id": st.modelID, "path": name, "kind": "snapshot", "seq_id": st.seq, "type": "save_weights_for_sampler",
	}, "")
	if err != nil {
		return err
	}
	m, err := docObject(fr, "save_weights_for_sampler")
	if err != nil {
		return err
	}
	p, err := str(m, "path", "save_weights_for_sampler result")
	if err != nil {
		return err
	}
	if !strings.HasPrefix(p, "tinker://") || !strings.HasSuffix(p, "/sampler_weights/"+name) {
		return fmt.Errorf("path %q is not tinker://<run>/sampler_weights/%s", p, name)
	}
	st.samplerPath = p
	return nil
}

func checkCreateSampler(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, cfg Config) error {
	m, err := post(ctx, cl, "/api/v1/create_sampling_session", map[string]any{
		"session_id": st.sessionID, "sampling_session_seq_id": 0, "model_path": st.samplerPath, "type": "create_sampling_session",
	})
	if err != nil {
		return err
	}
	id, err := str(m, "sampling_session_id", "create_sampling_session")
	if err != nil {
		return err
	}
	// SamplingClient creation from a path reads the sampler's base model.
	g, err := get(ctx, cl, "/api/v1/samplers/"+id)
	if err != nil {
		return err
	}
	if g["base_model"] != cfg.BaseModel {
		return fmt.Errorf("samplers/%s base_model is %v, want %q", id, g["base_model"], cfg.BaseModel)
	}
	st.samplerID = id
	return nil
}

func checkSample(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	const numSamples = 2
	fut, fr, err := submitAndWait(ctx, cl, "/api/v1/asample", map[string]any{
		"num_samples": numSamples,
		"prompt":      map[string]any{"chunks": []any{map[string]any{"tokens": sftTokens[:4], "type": "encoded_text"}}},
		"sampling_params": map[string]any{
			"max_tokens": 4, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "seed": 7,
		},
		"sampling_session_id": st.samplerID, "seq_id": 0, "prompt_logprobs": false,
		"topk_prompt_logprobs": 0, "topk_sample_logprobs": 0, "prompt_alt_tokens_k": 0,
		"record_stability_info": false, "type": "sample",
	}, "")
	if err != nil {
		return err
	}
	ids, _ := fut["sample_sequence_ids"].([]any)
	if len(ids) != numSamples {
		return fmt.Errorf("the asample future has %d sample_sequence_ids, want %d (tinker 0.38 asserts it)", len(ids), numSamples)
	}
	if fr.Proto == nil {
		return errors.New("asample result is JSON; the tinker SDK (≥ 0.25) accepts only a protobuf SampleResponse")
	}
	resp := fr.Proto.(*publicv1.SampleResponse)
	if len(resp.GetSequences()) != numSamples {
		return fmt.Errorf("%d sequences, want %d", len(resp.GetSequences()), numSamples)
	}
	for i, s := range resp.GetSequences() {
		toks, err := protocol.Int32s(s.GetTokens())
		if err != nil {
			return fmt.Errorf("sequence %d tokens: %w", i, err)
		}
		if len(toks) == 0 || len(toks) > 4 {
			return fmt.Errorf("sequence %d has %d tokens for max_tokens 4", i, len(toks))
		}
		lps, err := protocol.Float32s(s.GetLogprobs())
		if err != nil {
			return fmt.Errorf("sequence %d logprobs: %w", i, err)
		}
		if len(lps) != len(toks) || slices.Contains(lps, nil) {
			return fmt.Errorf("sequence %d has %d finite logprobs for %d tokens", i, len(lps), len(toks))
		}
	}
	return nil
}

func checkTrainingRuns(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	m, err := get(ctx, cl, "/api/v1/training_runs?limit=100&offset=0&access_scope=owned")
	if err != nil {
		return err
	}
	if _, ok := m["cursor"].(map[string]any); !ok {
		return errors.New("training_runs has no cursor (the SDK requires it)")
	}
	runs, _ := m["training_runs"].([]any)
	for _, r := range runs {
		if o, _ := r.(map[string]any); o != nil && o["training_run_id"] == st.modelID {
			return nil
		}
	}
	// Newest first, so the run just created is on the first page; fall back to the run route.
	if _, err := get(ctx, cl, "/api/v1/training_runs/"+st.modelID); err != nil {
		return fmt.Errorf("the new run is not on the first page of training_runs, and: %w", err)
	}
	return nil
}

func checkCheckpoints(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	run := strings.SplitN(strings.TrimPrefix(st.samplerPath, "tinker://"), "/", 2)[0]
	m, err := get(ctx, cl, "/api/v1/training_runs/"+run+"/checkpoints")
	if err != nil {
		return err
	}
	if !hasCheckpoint(m, st.samplerPath) {
		return fmt.Errorf("training_runs/%s/checkpoints does not list %s", run, st.samplerPath)
	}
	u, err := get(ctx, cl, "/api/v1/checkpoints?limit=100&offset=0")
	if err != nil {
		return err
	}
	if _, ok := u["checkpoints"].([]any); !ok {
		return errors.New("checkpoints (the user listing) has no checkpoints array")
	}
	return nil
}

func hasCheckpoint(m map[string]any, path string) bool {
	cks, _ := m["checkpoints"].([]any)
	for _, c := range cks {
		if o, _ := c.(map[string]any); o != nil && o["tinker_path"] == path {
			return o["checkpoint_type"] == "sampler"
		}
	}
	return false
}

func checkFinish(ctx context.Context, cl *protocol.TinkerClient, st *sdkState, _ Config) error {
	_, err := post(ctx, cl, "/api/v1/sessions/"+st.sessionID+"/finish", map[string]any{"reason": map[string]any{"type": "success"}, "detail": nil})
	return err
}
