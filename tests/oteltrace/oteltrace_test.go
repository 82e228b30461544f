package oteltrace

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/otlptest"
	"github.com/loops-dev/loops/internal/telemetry"
)

// goWorkerEnv, set to 1, makes the test binary the Go worker (serve.Main): the pool's
// worker_command is the test binary itself.
const goWorkerEnv = "LOOPS_TEST_GO_WORKER"

func init() {
	if os.Getenv(goWorkerEnv) == "1" {
		os.Exit(serve.Main(os.Args[1:]))
	}
}

const (
	key = "tml-otel-trace-test-key-0123456789"
	// The client's trace: every span of the forward_backward below is in it.
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
	// prompt is the OpenAI request's text, which no span may carry.
	prompt = "the secret prompt text about zebras"
)

// client calls the gateway's HTTP routes as the tinker SDK does (JSON bodies).
type client struct {
	t   *testing.T
	url string
}

func (c client) post(path string, body any, header map[string]string) (int, map[string]any) {
	c.t.Helper()
	b, err := json.Marshal(body)
	require.NoError(c.t, err)
	req, err := http.NewRequestWithContext(c.t.Context(), http.MethodPost, c.url+path, bytes.NewReader(b))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", key)
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	var out map[string]any
	require.NoError(c.t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, out
}

// future posts a Tinker request that answers a future and retrieves its result.
func (c client) future(path string, body any, header map[string]string) map[string]any {
	c.t.Helper()
	code, out := c.post(path, body, header)
	require.Equal(c.t, http.StatusOK, code, out)
	id, _ := out["request_id"].(string)
	require.NotEmpty(c.t, id, out)
	for range 100 {
		code, res := c.post("/api/v1/retrieve_future", map[string]any{"request_id": id}, nil)
		require.Equal(c.t, http.StatusOK, code, res)
		if res["type"] != "try_again" {
			return res
		}
	}
	c.t.Fatalf("%s: no result", path)
	return nil
}

// TestForwardBackwardTrace: a tinker forward_backward sent with a traceparent, against a
// gateway whose backend is a local pool of a Go worker process, is one trace at the OTLP
// receiver: the client's span → the gateway's HTTP span → the operation → its queue wait,
// its batch, the loops.backend.v1 call → the worker's span, and the persist; the
// retrieve_future that read it links to the operation. A chat completion carries the
// GenAI attributes. No span anywhere carries the key, the prompt or token ids.
func TestForwardBackwardTrace(t *testing.T) {
	recv := otlptest.Start(t)
	dir := t.TempDir()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.HTTPEndpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv(goWorkerEnv, "1") // the workers inherit it (and the OTEL_* above); this process is past init
	t.Setenv("HF_HUB_CACHE", filepath.Join(dir, "hub"))
	t.Setenv(serve.LogLevelEnv, "WARN")
	shutdown, err := telemetry.Setup(t.Context(), "")
	require.NoError(t, err)
	require.True(t, telemetry.Enabled())
	t.Cleanup(func() { _ = shutdown(context.Background()) })

	keys, err := auth.ParseKeys([]string{key})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dir, Backend: worker.Name, Keys: keys,
		BackendConfig: backends.Config{Models: []string{tiny.Name}, Options: map[string]string{
			"provider": "local", "replicas": "1", "worker_command": os.Args[0],
			"args": "--data-dir " + dir + " --threads 1", "health_interval": "200ms", "start_timeout": "60s"}}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	c := client{t: t, url: "http://" + ln.Addr().String()}

	_, sess := c.post("/api/v1/create_session", map[string]any{"tags": []string{}, "user_metadata": map[string]any{}, "sdk_version": "0.38.0", "type": "create_session"}, nil)
	model := c.future("/api/v1/create_model", map[string]any{"session_id": sess["session_id"], "model_seq_id": 0, "base_model": tiny.Name,
		"lora_config": map[string]any{"rank": 4, "train_attn": true}, "type": "create_model"}, nil)
	runID, _ := model["model_id"].(string)
	require.NotEmpty(t, runID, model)

	const n = 12
	in, tgt, w := make([]int32, n), make([]int64, n), make([]float32, n)
	for i := range n {
		in[i], tgt[i], w[i] = int32(65+i), int64(66+i), 1
	}
	datum := map[string]any{
		"model_input": map[string]any{"chunks": []any{map[string]any{"type": "encoded_text", "tokens": in}}},
		"loss_fn_inputs": map[string]any{
			"target_tokens": map[string]any{"data": tgt, "dtype": "int64", "shape": []int{n}},
			"weights":       map[string]any{"data": w, "dtype": "float32", "shape": []int{n}},
		},
	}
	traced := map[string]string{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01", "baggage": "team=otel",
		"X-API-Key": "", "Authorization": "Bearer " + key}
	res := c.future("/api/v1/forward_backward", map[string]any{"model_id": runID, "seq_id": 1, "type": "forward_backward",
		"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{datum}}}, traced)
	require.Contains(t, res, "loss_fn_outputs", res)

	// Every other surface continues its client's trace too: each call below has a trace
	// of its own, in which the surface's span is found.
	surfaces := map[string]string{} // trace id → the span that must be in it
	parent := func(span string) string {
		tid := fmt.Sprintf("%032x", len(surfaces)+1)
		surfaces[tid] = span
		return "00-" + tid + "-" + clientSpan + "-01"
	}
	code, chat := c.post("/oai/api/v1/chat/completions", map[string]any{"model": tiny.Name, "max_tokens": 4, "seed": 1,
		"messages": []any{map[string]any{"role": "user", "content": prompt}}},
		map[string]string{"Authorization": "Bearer " + key, "traceparent": parent("operation sample")})
	require.Equal(t, http.StatusOK, code, chat)
	code, msg := c.post("/anthropic/api/v1/messages", map[string]any{"model": tiny.Name, "max_tokens": 4,
		"messages": []any{map[string]any{"role": "user", "content": prompt}}},
		map[string]string{"traceparent": parent("operation sample")})
	require.Equal(t, http.StatusOK, code, msg)
	code, rest := c.post("/v1/sessions", map[string]any{"sdk_version": "rest"},
		map[string]string{"traceparent": parent("loops.v1.SessionService/CreateSession")})
	require.Equal(t, http.StatusOK, code, rest)
	for _, opt := range []connect.ClientOption{connect.WithProtoJSON(), connect.WithGRPC(), connect.WithGRPCWeb()} {
		tp := parent("loops.v1.SessionService/CreateSession")
		headers := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("X-API-Key", key)
				req.Header().Set("traceparent", tp)
				return next(ctx, req)
			}
		}))
		sessions := loopsv1connect.NewSessionServiceClient(http2Client(), c.url, opt, headers)
		_, err := sessions.CreateSession(t.Context(), &loopsv1.CreateSessionRequest{})
		require.NoError(t, err)
	}

	// The worker's span arrives from its own process; the gateway's once flushed.
	workerSpan := "loops.backend.v1.TrainerService/ForwardBackward"
	spans := recv.Wait(t, 30*time.Second, func(spans []otlptest.Span) bool {
		worker, persisted, sampled := false, false, true
		for _, s := range spans {
			worker = worker || (s.TraceID() == clientTrace && s.Service == serve.ServiceName && s.GetName() == workerSpan)
			persisted = persisted || (s.TraceID() == clientTrace && s.GetName() == "operation forward_backward")
		}
		for tid, name := range surfaces {
			found := false
			for _, s := range spans {
				found = found || (s.TraceID() == tid && s.GetName() == name)
			}
			sampled = sampled && found
		}
		return worker && persisted && sampled
	})

	trace := recv.Trace(clientTrace)
	byID := map[string]otlptest.Span{}
	for _, s := range trace {
		byID[s.ID()] = s
	}
	find := func(name, service string) otlptest.Span {
		t.Helper()
		for _, s := range trace {
			if s.GetName() == name && s.Service == service {
				return s
			}
		}
		require.FailNowf(t, "span missing", "no span %q of %s in the client's trace; it has %v", name, service, names(trace))
		return otlptest.Span{}
	}
	// Walk up from the worker's span to the client's: every step is a parent in this trace.
	var chain []string
	for s := find(workerSpan, serve.ServiceName); ; {
		chain = append(chain, s.Service+":"+s.GetName())
		if s.Parent() == clientSpan {
			break
		}
		p, ok := byID[s.Parent()]
		require.True(t, ok, "span %q's parent %s is not in the trace (chain so far %v)", s.GetName(), s.Parent(), chain)
		s = p
	}
	require.Equal(t, []string{
		"loops-worker:" + workerSpan,          // the worker's server span
		"loops:" + workerSpan,                 // the gateway's client call to it
		"loops:batch",                         // the batch it went in
		"loops:operation forward_backward",    // the operation
		"loops:POST /api/v1/forward_backward", // the request, continuing the client's span
	}, chain)

	for _, s := range spans {
		if s.Service == serve.ServiceName {
			require.NotEmpty(t, s.Parent(), "a worker span (%s) is always some operation's child: background calls start no traces", s.GetName())
		}
	}

	op := find("operation forward_backward", "loops")
	require.Equal(t, runID, op.Attr("loops.training_run.id"))
	require.Equal(t, "succeeded", op.Attr("loops.operation.state"))
	require.Equal(t, "1", find("batch", "loops").Attr("loops.batch.items"))
	for _, name := range []string{"queue", "persist"} {
		require.Equal(t, op.ID(), find(name, "loops").Parent(), "%s is the operation's child", name)
	}

	// The retrieve_future that read the outcome is in a trace of its own, linked to it.
	linked := false
	for _, s := range spans {
		for _, l := range s.GetLinks() {
			if s.TraceID() != clientTrace && otlptest.Hex(l.GetTraceId()) == clientTrace && otlptest.Hex(l.GetSpanId()) == op.ID() {
				linked = true
			}
		}
	}
	require.True(t, linked, "a retrieval links to the operation's span")

	// The chat completion's and the message's operations carry the GenAI semantic conventions.
	for _, s := range spans {
		if s.GetName() != "operation sample" {
			continue
		}
		require.NotEqual(t, clientSpan, s.Parent(), "under the surface's HTTP span")
		require.Equal(t, tiny.Name, s.Attr("gen_ai.request.model"))
		require.NotEmpty(t, s.Attr("gen_ai.usage.input_tokens"))
		out, err := strconv.Atoi(s.Attr("gen_ai.usage.output_tokens"))
		require.NoError(t, err)
		require.True(t, out >= 1 && out <= 4, "output tokens %d of max_tokens 4", out) // a stop may end it early
	}

	// The operation's duration, scraped as OpenMetrics, points at its trace.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, c.url+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, resp.Header.Get("Content-Type"), "application/openmetrics-text")
	exemplar := false
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, `loops_operation_duration_seconds_bucket{kind="forward_backward"`) &&
			strings.Contains(line, `# {trace_id="`+clientTrace+`"}`) {
			exemplar = true
		}
	}
	require.True(t, exemplar, "the forward_backward's duration has its trace id as an exemplar:\n%s", page)

	// No span carries a credential, the prompt, or token ids.
	tokenRun := "65,66,67"
	for _, s := range spans {
		b, err := protojson.Marshal(s.Span)
		require.NoError(t, err)
		text := strings.ReplaceAll(string(b), " ", "")
		require.NotContains(t, text, key, "span %q carries the API key", s.GetName())
		require.NotContains(t, strings.ToLower(text), "bearer", "span %q carries a bearer token", s.GetName())
		require.NotContains(t, text, "zebras", "span %q carries prompt text", s.GetName())
		require.NotContains(t, text, tokenRun, "span %q carries token ids", s.GetName())
		for _, kv := range s.GetAttributes() {
			for _, v := range kv.GetValue().GetArrayValue().GetValues() {
				_, isInt := v.GetValue().(*commonpb.AnyValue_IntValue)
				require.False(t, isInt, "span %q attribute %s is a list of numbers", s.GetName(), kv.GetKey())
			}
		}
	}
}

func names(spans []otlptest.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Service+":"+s.GetName())
	}
	return out
}

// http2Client speaks HTTP/2 without TLS (h2c), which gRPC needs.
func http2Client() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}
