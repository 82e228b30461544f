package gateway_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// startServerWith starts a keyed server (keyA, keyB) after edit changes its config, and
// returns its host:port.
func startServerWith(t *testing.T, edit func(*gateway.Config)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b"})
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: t.TempDir(), Keys: keys}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := gateway.New(t.Context(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return ln.Addr().String()
}

// stallBody sends a request's headers and the first bytes of a 1,000-byte body over
// HTTP/1.1, then stalls.
func stallBody(t *testing.T, addr, key string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /api/v1/forward_backward HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\n"+
		"Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n0123456789", addr, key)
	require.NoError(t, err)
	return conn
}

func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

// TestStalledBodyIsCutOff: a client that stops sending its body no longer holds the
// request (and its key's slot) forever: it is answered when the body read timeout passes,
// over HTTP/1.1 and over HTTP/2 (h2c) streams alike.
func TestStalledBodyIsCutOff(t *testing.T) {
	const timeout = 300 * time.Millisecond
	addr := startServerWith(t, func(c *gateway.Config) { c.Limits.BodyReadTimeout = timeout })

	start := time.Now()
	conn := stallBody(t, addr, keyA)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "HTTP/1.1: the stalled request was not answered")
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
	require.Contains(t, string(b), "body read timeout")
	require.GreaterOrEqual(t, time.Since(start), timeout)
	t.Logf("HTTP/1.1: %d after %s", resp.StatusCode, time.Since(start))

	for _, path := range []string{"/api/v1/forward_backward", "/loops.v1.ModelService/ListModels"} {
		pr, pw := io.Pipe()
		go func() { _, _ = pw.Write([]byte("0123456789")) }() // and nothing more
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, pr)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", keyA)
		req.Header.Set("Content-Type", map[bool]string{true: "application/x-protobuf", false: "application/proto"}[strings.HasPrefix(path, "/api/")])
		start := time.Now()
		resp, err := h2cClient().Do(req)
		require.NoError(t, err, "h2c %s: the stalled request was not answered", path)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 2, resp.ProtoMajor)
		require.GreaterOrEqual(t, resp.StatusCode, 400, string(b))
		if strings.HasPrefix(path, "/api/") {
			require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
		}
		require.Less(t, time.Since(start), 5*time.Second)
		t.Logf("h2c %s: %d after %s", path, resp.StatusCode, time.Since(start))
		cancel()
		_ = pw.Close()
	}
}

// TestBodyDeadlineSparesLongPolls: once a body has been read, the request may take longer
// than the body read timeout (here a WaitOperation long-poll over HTTP/1.1).
func TestBodyDeadlineSparesLongPolls(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { c.Limits.BodyReadTimeout = 200 * time.Millisecond })
	url := "http://" + addr
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	created := must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainMlp: true}}))
	created = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: created.GetId(), Timeout: durationpb.New(20 * time.Second)}))
	run := created.GetTrainingRun().GetId()
	require.NotEmpty(t, run, created.GetError().GetMessage())
	// seq_id 7 waits for 1..6, which never come (until the gap timeout, 10 s).
	in, tgt, w := tokens(8)
	op := must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: 7, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}}))
	start := time.Now()
	got, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Second)})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "the long-poll did not wait: %v", got.GetState())
}

// TestRequestsPerKeyCapOverHTTP: requests held open by one key (stalled bodies here) count
// against its cap; one more from that key is a 429 with the reason, another key is served.
func TestRequestsPerKeyCapOverHTTP(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { c.Limits.MaxRequestsPerKey = 2 })
	get := func(key string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/api/v1/get_server_capabilities", nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Three stalled requests for a cap of two: two hold the key's slots (the third is refused)
	// even when one connection is served late on a loaded machine (seen once in CI).
	a1, a2 := stallBody(t, addr, keyA), stallBody(t, addr, keyA)
	stallBody(t, addr, keyA)
	require.Eventually(t, func() bool { code, _ := get(keyA); return code == http.StatusTooManyRequests }, 5*time.Second, 10*time.Millisecond)
	code, body := get(keyA)
	require.Equal(t, http.StatusTooManyRequests, code)
	var eb map[string]string
	require.NoError(t, json.Unmarshal([]byte(body), &eb))
	require.Contains(t, eb["detail"], "already has 2 requests in flight")
	code, body = get(keyB)
	require.Equal(t, http.StatusOK, code, body)

	_ = a1.Close()
	_ = a2.Close()
	require.Eventually(t, func() bool { code, _ := get(keyA); return code == http.StatusOK }, 5*time.Second, 10*time.Millisecond)
}

// TestOpenModeRefusesForeignHosts: with no keys, a request addressed to a name other than
// loopback (a DNS-rebinding page's) is a 403 that says why and how to fix it.
func TestOpenModeRefusesForeignHosts(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { c.Keys = nil })
	get := func(host string) (int, map[string]string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/api/v1/get_server_capabilities", nil)
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("X-API-Key", "tml-readme-example")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	code, body := get("evil.example")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body["detail"], "not a loopback name")
	require.Contains(t, body["detail"], "--api-key")
	code, _ = get("localhost:1234")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(addr)
	require.Equal(t, http.StatusOK, code)
}

// TestConnectGzipBombIsRefusedCheaply is the regression test for a 300 KB gzip body that
// inflates to 300 MB on loops.v1: connect-go's own decompressor buffered it into a
// doubling buffer up to the 64 MiB read limit (~200 MB allocated), then inflated the rest
// to report its size. Now it is counted first and refused before anything is buffered.
func TestConnectGzipBombIsRefusedCheaply(t *testing.T) {
	addr := startServerWith(t, nil)
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(t, err)
	zeros := make([]byte, 1<<20)
	for range 300 {
		_, err := zw.Write(zeros)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	bomb := buf.Bytes()
	require.Less(t, len(bomb), 1<<20)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/loops.v1.TrainingService/GetTrainingRun", bytes.NewReader(bomb))
	require.NoError(t, err)
	req.Header.Set("X-API-Key", keyA)
	req.Header.Set("Content-Type", "application/proto")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, string(b)) // ResourceExhausted
	allocated := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("refusing a %d-byte gzip bomb allocated %d bytes (client and server)", len(bomb), allocated)
	require.LessOrEqual(t, allocated, int64(16<<20), "refusing the bomb allocated %d bytes", allocated)
	require.Contains(t, string(b), "decompresses to more than")

	// Honest gzip requests still work, over Connect and gRPC.
	connectClient := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, "http://"+addr, withKey(keyA), connect.WithSendGzip())
	_, err = connectClient.GetTrainingRun(t.Context(), &loopsv1.GetTrainingRunRequest{Id: strings.Repeat("run-nope", 100)})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "%v", err)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	gctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", keyA)
	_, err = loopsv1.NewTrainingServiceClient(conn).GetTrainingRun(gctx, &loopsv1.GetTrainingRunRequest{Id: strings.Repeat("run-nope", 100)}, grpc.UseCompressor(grpcgzip.Name))
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
}

// TestRefusalsInForeignShapes: the key check's refusals of OpenAI- and Anthropic-compatible
// requests come in those protocols' error shapes (their clients read nothing else), 429s
// with Retry-After, while the Tinker routes keep theirs.
func TestRefusalsInForeignShapes(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { c.Limits.MaxRequestsPerKey = 2 })
	do := func(method, path, key string) (int, http.Header, map[string]any) {
		req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addr+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, resp.Header, body
	}
	openaiErr := func(body map[string]any) map[string]any {
		e, ok := body["error"].(map[string]any)
		require.True(t, ok, "OpenAI's shape has an error object: %v", body)
		return e
	}
	anthropicErr := func(body map[string]any) map[string]any {
		require.Equal(t, "error", body["type"], "Anthropic's shape: %v", body)
		e, ok := body["error"].(map[string]any)
		require.True(t, ok, "Anthropic's shape has an error object: %v", body)
		return e
	}

	code, _, body := do(http.MethodGet, "/oai/api/v1/models", "")
	require.Equal(t, http.StatusUnauthorized, code)
	e := openaiErr(body)
	require.Equal(t, "authentication_error", e["type"])
	require.Contains(t, e["message"], "missing API key")
	code, _, body = do(http.MethodPost, "/anthropic/api/v1/messages", "tml-not-a-configured-key")
	require.Equal(t, http.StatusUnauthorized, code)
	e = anthropicErr(body)
	require.Equal(t, "authentication_error", e["type"])
	require.Contains(t, e["message"], "unknown API key")

	stallBody(t, addr, keyA)
	stallBody(t, addr, keyA)
	stallBody(t, addr, keyA)
	require.Eventually(t, func() bool {
		code, _, _ := do(http.MethodGet, "/oai/api/v1/models", keyA)
		return code == http.StatusTooManyRequests
	}, 5*time.Second, 10*time.Millisecond)
	code, hdr, body := do(http.MethodGet, "/oai/api/v1/models", keyA)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.NotEmpty(t, hdr.Get("Retry-After"))
	e = openaiErr(body)
	require.Equal(t, "rate_limit_error", e["type"])
	require.Contains(t, e["message"], "already has 2 requests in flight")
	code, hdr, body = do(http.MethodPost, "/anthropic/api/v1/messages", keyA)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.NotEmpty(t, hdr.Get("Retry-After"))
	e = anthropicErr(body)
	require.Equal(t, "rate_limit_error", e["type"])
	code, _, body = do(http.MethodGet, "/api/v1/get_server_capabilities", keyA)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Contains(t, body["detail"], "already has 2 requests in flight", "Tinker's shape is unchanged")
}
