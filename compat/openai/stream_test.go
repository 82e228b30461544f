package openai_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/compat/openai"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// gatedSampling is the core's sampling service with the decoder held, right after the
// first token it streams, until release is closed or the stream's reader is gone. It
// records the operations it queues in ops, and started receives when a decoder is held.
type gatedSampling struct {
	loopsv1connect.SamplingServiceHandler
	release chan struct{}
	ops     chan string
	started chan struct{}
	// served receives when a request's handler has returned.
	served chan struct{}
}

func (g *gatedSampling) Sample(ctx context.Context, req *loopsv1.SampleRequest) (*loopsv1.Operation, error) {
	op, err := g.SamplingServiceHandler.Sample(ctx, req)
	if err == nil {
		g.ops <- op.GetId()
	}
	return op, err
}

func (g *gatedSampling) SampleStream(ctx context.Context, req *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	op, err := g.SamplingServiceHandler.(tokenstream.Streamer).SampleStream(ctx, req, &gatedSink{Sink: sink, g: g})
	if err == nil {
		g.ops <- op.GetId()
	}
	return op, err
}

// gatedSink is a sink that keeps tokens whatever it wraps, so the decoder streams to it
// (and is held) for requests that are not streamed too.
type gatedSink struct {
	tokenstream.Sink
	g *gatedSampling
	n int
}

func (s *gatedSink) Token(seq int, id int32, lp float32, top []tokenstream.Alt) {
	s.Sink.Token(seq, id, lp, top)
	if s.n++; s.n == 1 {
		s.g.started <- struct{}{}
		select { // the decoding goroutine waits here, in the middle of the sequence
		case <-s.g.release:
		case <-s.Gone():
		}
	}
}

// gatedServer serves the OpenAI handler over a gateway's core with gatedSampling.
func gatedServer(t *testing.T) (url string, g *gatedSampling, ops loopsv1connect.OperationServiceHandler) {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	svc := srv.Core().Services()
	g = &gatedSampling{SamplingServiceHandler: svc.Sampling, release: make(chan struct{}),
		ops: make(chan string, 16), started: make(chan struct{}, 16), served: make(chan struct{}, 16)}
	h := openai.NewHandler(openai.Services{Sampling: g, Operations: svc.Operations, Models: svc.Models, Checkpoints: svc.Checkpoints},
		openai.Options{Workspace: auth.Workspace})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(auth.WithWorkspace(r.Context(), "ws")))
		g.served <- struct{}{}
	}))
	t.Cleanup(ts.Close)
	return ts.URL + openai.Prefix, g, svc.Operations
}

// openStream posts a streaming request and returns a reader of its data lines.
func openStream(t *testing.T, ctx context.Context, url string, body any) (*http.Response, func() string) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(string(raw)))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	return resp, func() string {
		for sc.Scan() {
			if line := sc.Text(); line != "" {
				return strings.TrimPrefix(line, "data: ")
			}
		}
		return ""
	}
}

// TestStreamSendsTokensWhileDecoding: the first chunk of a streamed completion reaches the
// client while the decoder is held after its first token, so chunks are sent as tokens are
// decoded and not when the sample completes; the streamed text and logprobs then add up
// to the non-streamed answer.
func TestStreamSendsTokensWhileDecoding(t *testing.T) {
	url, g, _ := gatedServer(t)
	body := map[string]any{"model": tiny.Name, "prompt": "Hello there", "max_tokens": 12, "temperature": 0, "logprobs": 0}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	resp, next := openStream(t, ctx, url+"completions", map[string]any{"model": tiny.Name, "prompt": "Hello there", "max_tokens": 12, "temperature": 0, "logprobs": 0, "stream": true})
	defer resp.Body.Close()
	var first struct {
		Choices []struct {
			Text     string             `json:"text"`
			Logprobs completionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(next()), &first))
	require.Len(t, first.Choices[0].Logprobs.Tokens, 1, "the first chunk carries the one token decoded so far")
	close(g.release)
	text := first.Choices[0].Text
	lps := first.Choices[0].Logprobs.TokenLogprobs
	finish := ""
	for line := next(); line != "[DONE]"; line = next() {
		require.NotEmpty(t, line, "the stream ends with [DONE]")
		var c struct {
			Choices []struct {
				Text         string             `json:"text"`
				Logprobs     completionLogprobs `json:"logprobs"`
				FinishReason *string            `json:"finish_reason"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &c))
		text += c.Choices[0].Text
		lps = append(lps, c.Choices[0].Logprobs.TokenLogprobs...)
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	st, b := call(t, "POST", url+"completions", "", body)
	require.Equal(t, http.StatusOK, st, string(b))
	var plain struct {
		Choices []struct {
			Text         string             `json:"text"`
			Logprobs     completionLogprobs `json:"logprobs"`
			FinishReason string             `json:"finish_reason"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(b, &plain))
	require.Equal(t, plain.Choices[0].Text, text)
	require.Equal(t, plain.Choices[0].Logprobs.TokenLogprobs, lps, "the same bits, streamed or not")
	require.Equal(t, plain.Choices[0].FinishReason, finish)
}

type completionLogprobs struct {
	Tokens        []string  `json:"tokens"`
	TokenLogprobs []float32 `json:"token_logprobs"`
}

// TestStreamClientGoneStopsTheSample: a streaming client that goes away mid-sequence stops
// its sample: the operation fails with Canceled instead of decoding to max_tokens.
func TestStreamClientGoneStopsTheSample(t *testing.T) {
	url, _, ops := gatedServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	resp, next := openStream(t, ctx, url+"chat/completions", map[string]any{"model": tiny.Name, "max_tokens": 64, "temperature": 0, "logprobs": true, "stream": true,
		"messages": []map[string]any{{"role": "user", "content": "Hi"}}})
	var role struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(next()), &role))
	opID, ok := strings.CutPrefix(role.ID, "chatcmpl-")
	require.True(t, ok, role.ID)
	require.NotEmpty(t, next(), "a chunk with the first token")
	cancel() // the decoder is still held: only the client's leaving can free it
	_ = resp.Body.Close()
	wctx := auth.WithWorkspace(t.Context(), "ws")
	deadline := time.Now().Add(time.Minute)
	for {
		op, err := ops.WaitOperation(wctx, &loopsv1.WaitOperationRequest{Id: opID})
		require.NoError(t, err)
		if op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED {
			require.Equal(t, int32(connect.CodeCanceled), op.GetError().GetCode(), op.GetError().GetMessage())
			return
		}
		require.NotEqual(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), "the sample ran on after its client left")
		require.True(t, time.Now().Before(deadline))
	}
}

// TestAbandonedRequestStopsItsSample: the client of a request that is not streamed goes
// away mid-sequence: its sample is stopped (the operation fails with Canceled instead of
// decoding to max_tokens), and the request's handler, which holds the gateway's count of
// the key's requests in flight, returns only once the sample has really ended. Today's
// main decoded such a sample to its end (8 abandoned requests ran 247 s) and returned at
// once.
func TestAbandonedRequestStopsItsSample(t *testing.T) {
	url, g, ops := gatedServer(t)
	wctx := auth.WithWorkspace(t.Context(), "ws")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	raw, err := json.Marshal(map[string]any{"model": tiny.Name, "max_tokens": 64, "temperature": 0,
		"messages": []map[string]any{{"role": "user", "content": "Hi"}}})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, "POST", url+"chat/completions", strings.NewReader(string(raw)))
	require.NoError(t, err)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	opID := <-g.ops
	for started := false; !started; {
		select {
		case <-g.started:
			started = true
		case <-time.After(100 * time.Millisecond):
			op, err := ops.GetOperation(wctx, &loopsv1.GetOperationRequest{Id: opID})
			require.NoError(t, err)
			if op.GetState() == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED || op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED {
				t.Fatalf("the sample of a request that is not streamed ran (%v) without a sink that can stop it", op.GetState())
			}
		}
	}
	cancel() // the decoder is still held: only the client's leaving can free it
	select {
	case <-g.served:
	case <-time.After(time.Minute):
		t.Fatal("the handler did not return once the sample ended")
	}
	op, err := ops.GetOperation(wctx, &loopsv1.GetOperationRequest{Id: opID})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, op.GetState(), "the sample had ended, stopped, when the handler returned")
	require.Equal(t, int32(connect.CodeCanceled), op.GetError().GetCode(), op.GetError().GetMessage())
}
