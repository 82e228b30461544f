package serve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/pools/poolstest"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/conformance/backendtest"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// running is a Run in a goroutine.
type running struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// gateway is the test's gateway: a data dir, and the worker TLS authority the worker
// backend opens there.
type gateway struct {
	dir  string
	auth *mtls.Authority
}

func newGateway(t *testing.T) *gateway {
	t.Helper()
	dir := t.TempDir()
	a, err := mtls.Open(filepath.Join(dir, "pools", "tls"))
	require.NoError(t, err)
	return &gateway{dir: dir, auth: a}
}

// creds are the credentials of a worker of the pool the gateway's worker backend dials
// (that of the built-in model, in the workers mode).
func (g *gateway) creds(t *testing.T) *mtls.Credentials {
	t.Helper()
	c, err := g.auth.Issue(worker.PoolID(tiny.Name), 0)
	require.NoError(t, err)
	return c
}

// start runs Run with o (credentials from g unless o has some; the temp folder allowed)
// and waits for its ready line.
func start(t *testing.T, g *gateway, o Options) *running {
	t.Helper()
	if o.Credentials == nil {
		o.Credentials = g.creds(t)
	}
	if o.AllowDirs == nil {
		o.AllowDirs = []string{os.TempDir()} // where the tests' adapter folders are
	}
	pr, pw := io.Pipe()
	o.Stdout = pw
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := Run(ctx, o)
		_ = pw.CloseWithError(errors.New("Run returned"))
		r.done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err, "Run ended before it served")
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), strings.TrimSpace(ReadyPrefix)+" ")
	require.True(t, ok, "ready line %q", line)
	r.addr = addr
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the Run (if it still runs) and returns its error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end")
		return nil
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// engineOptions serve the built-in model from a temp folder (also registered in a temp
// Hugging Face cache, not the user's).
func engineOptions(t *testing.T) (reference.Options, string) {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dataDir := t.TempDir()
	modelDir := filepath.Join(dataDir, "models", "loops-tiny")
	require.NoError(t, tiny.Write(modelDir))
	return reference.Options{DataDir: dataDir, Threads: 2}, modelDir
}

// workerClient is g's worker backend dialling addr.
func workerClient(t *testing.T, g *gateway, addr string) *worker.Backend {
	t.Helper()
	b, err := worker.New(t.Context(), worker.Options{Workers: []string{addr}, DataDir: g.dir, Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

type sharedHandle struct{ *worker.Backend }

func (sharedHandle) Close() error { return nil }

// TestConformance runs the backend contract suite through the gateway's worker client
// (backends/worker) against the Go worker serving the reference engine: the engine's
// semantics survive the loops.backend.v1 round trip.
func TestConformance(t *testing.T) {
	eo, modelDir := engineOptions(t)
	g := newGateway(t)
	r := start(t, g, Options{Engine: eo})
	b := workerClient(t, g, r.addr)
	backendtest.Run(t, func(t *testing.T) backends.Backend { return sharedHandle{b} }, backendtest.Options{
		ModelName:    tiny.Name,
		ModelDir:     modelDir,
		KnownFailing: "testdata/known_failing.txt",
	})
}

// collect is a tokenstream.Sink that keeps every token.
type collect struct {
	mu   sync.Mutex
	toks []tokenstream.Token
	gone chan struct{}
}

func (c *collect) Token(seq int, id int32, lp float32, top []tokenstream.Alt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.toks = append(c.toks, tokenstream.Token{Seq: seq, ID: id, Logprob: lp, Top: top})
}

func (c *collect) Gone() <-chan struct{} { return c.gone }

// TestStreamSample: the worker client's SampleStream gets every sampled token of every
// sequence, in order, then the response Sample gives (bit for bit: same seed).
func TestStreamSample(t *testing.T) {
	eo, _ := engineOptions(t)
	g := newGateway(t)
	r := start(t, g, Options{Engine: eo})
	b := workerClient(t, g, r.addr)
	req := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: []int32{5, 17, 42, 9}, NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1, TopP: 1, Seed: proto.Uint64(7), TopLogprobs: 2}}
	sink := &collect{gone: make(chan struct{})}
	streamed, err := b.Sampler().(backends.TokenStreamer).SampleStream(t.Context(), req, sink)
	require.NoError(t, err)
	plain, err := b.Sampler().Sample(t.Context(), req)
	require.NoError(t, err)
	require.Empty(t, cmp.Diff(plain, streamed, protocmp.Transform()), "the streamed response is Sample's")
	seqs := streamed.GetResult().GetSequences()
	require.Len(t, seqs, 2)
	got := make([][]int32, len(seqs))
	for _, tk := range sink.toks {
		got[tk.Seq] = append(got[tk.Seq], tk.ID)
		require.Len(t, tk.Top, 2, "top_logprobs travel with each token")
	}
	for i, s := range seqs {
		require.Equal(t, s.GetTokens(), got[i], "sequence %d: the streamed tokens are the response's", i)
	}
}

// plainBackend hides the engine's TokenStreamer.
type plainBackend struct{ e *reference.Engine }

func (p plainBackend) Trainer() backends.Trainer { return p.e }
func (p plainBackend) Sampler() backends.Sampler {
	return struct{ backends.Sampler }{p.e}
}
func (p plainBackend) Close() error { return nil }

// TestStreamSampleUnimplemented: a backend whose sampler cannot stream answers
// Unimplemented, and the worker client then samples plainly.
func TestStreamSampleUnimplemented(t *testing.T) {
	eo, _ := engineOptions(t)
	e, err := reference.New(eo)
	require.NoError(t, err)
	g := newGateway(t)
	r := start(t, g, Options{Backend: plainBackend{e}})
	cl := backendv1connect.NewSamplerServiceClient(g.client(t), "https://"+r.addr, connect.WithGRPC())
	req := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: []int32{5, 6}, Params: &loopsv1.SamplingParams{MaxTokens: 3, Temperature: 1, TopP: 1}}
	st, err := cl.StreamSample(t.Context(), &backendv1.StreamSampleRequest{Request: req})
	require.NoError(t, err)
	for st.Receive() {
	}
	require.Equal(t, connect.CodeUnimplemented, connect.CodeOf(st.Err()))
	b := workerClient(t, g, r.addr)
	sink := &collect{gone: make(chan struct{})}
	resp, err := b.Sampler().(backends.TokenStreamer).SampleStream(t.Context(), req, sink)
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetResult().GetSequences()[0].GetTokens(), "sampled plainly")
	require.Empty(t, sink.toks)
}

// TestProtocols: the services answer gRPC and gRPC-Web, and Connect (JSON), over HTTP/2
// with mutual TLS.
func TestProtocols(t *testing.T) {
	eo, _ := engineOptions(t)
	g := newGateway(t)
	r := start(t, g, Options{Engine: eo})
	hc := g.client(t)
	resp, err := hc.Post("https://"+r.addr+backendv1connect.TrainerServiceGetCapabilitiesProcedure, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `"implementation":"reference"`)
	for _, opt := range []connect.ClientOption{connect.WithGRPCWeb(), connect.WithGRPC()} {
		cl := backendv1connect.NewSamplerServiceClient(hc, "https://"+r.addr, opt)
		caps, err := cl.GetCapabilities(t.Context(), &backendv1.GetCapabilitiesRequest{})
		require.NoError(t, err)
		m := caps.GetModels()[0]
		require.Equal(t, tiny.Name, m.GetName())
		// the catalog: loops/tiny is a Qwen3 that takes the cookbook's qwen3_instruct
		require.Equal(t, []string{"qwen3", "Qwen", tiny.Renderer}, []string{m.GetFamily(), m.GetPublisher(), m.GetRenderer()})
		require.Equal(t, []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}, m.GetLoraTargets())
		require.Equal(t, []string{"text"}, m.GetModalities())
	}
}

// client is the HTTP client of g dialling a worker of its pool.
func (g *gateway) client(t *testing.T) *http.Client {
	hc := mtls.HTTPClient(g.auth.DialConfig(worker.PoolID(tiny.Name)))
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// registry serves g's worker registry with a fast heartbeat.
func registry(t *testing.T, g *gateway, token string) (*pools.Registry, string, string) {
	t.Helper()
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: token, HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 2 * time.Second})
	srv, err := pools.Serve(reg, "127.0.0.1:0", g.auth.RegistryConfig())
	require.NoError(t, err)
	t.Cleanup(func() { reg.Close(); _ = srv.Close() })
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte(token+"\n"), 0o600))
	return reg, srv.URL(), file
}

// TestRunRegisters: with a registry the worker registers its address, capabilities and a
// fresh incarnation; it deregisters when it stops, and stops (cleanly) when told to drain.
func TestRunRegisters(t *testing.T) {
	eo, _ := engineOptions(t)
	e, err := reference.New(eo)
	require.NoError(t, err)
	g := newGateway(t)
	reg, url, tokenFile := registry(t, g, "s3cret")
	o := Options{Backend: e, Register: url, Pool: "p", Replica: 1, JoinTokenFile: tokenFile}

	first := start(t, g, o)
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 1 }, 10*time.Second, 20*time.Millisecond)
	m := reg.Members("p")[0]
	require.Equal(t, first.addr, m.Address)
	require.Equal(t, 1, m.Replica)
	require.Equal(t, 0, m.GPUs)
	caps, err := e.GetCapabilities(t.Context(), &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	require.Empty(t, cmp.Diff(caps, m.Capabilities, protocmp.Transform()))
	require.NoError(t, first.stop(t))
	require.Empty(t, reg.Members("p"), "a worker that stops deregisters")

	second := start(t, g, o)
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.NotEqual(t, m.Incarnation, reg.Members("p")[0].Incarnation, "each run is a new incarnation")
	reg.SetDesired("p", 1) // replica 1 is beyond the pool's size: drain
	select {
	case err := <-second.done:
		require.NoError(t, err, "a drain is a clean stop")
		close(second.done)
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not stop when told to drain")
	}
}

// TestRunRefused: a registration the gateway refuses for good ends Run with its reason.
func TestRunRefused(t *testing.T) {
	g := newGateway(t)
	_, url, _ := registry(t, g, "s3cret")
	bad := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(bad, []byte("wrong"), 0o600))
	eo, _ := engineOptions(t)
	e, err := reference.New(eo)
	require.NoError(t, err)
	r := start(t, g, Options{Backend: e, Register: url, Pool: "p", JoinTokenFile: bad})
	select {
	case err := <-r.done:
		require.ErrorContains(t, err, "registration refused")
		close(r.done)
	case <-time.After(10 * time.Second):
		t.Fatal("a refused worker keeps running")
	}
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	require.ErrorContains(t, Run(t.Context(), Options{Backend: e, Credentials: g.creds(t), Register: url, Pool: "p", JoinTokenFile: empty}), "is empty")
	require.ErrorContains(t, Run(t.Context(), Options{Backend: e}), "mutual TLS only", "no credentials: no worker")
}

// TestRunStdinEOF: with ExitOnStdinEOF the worker stops when its stdin closes (the parent
// has gone).
func TestRunStdinEOF(t *testing.T) {
	eo, _ := engineOptions(t)
	e, err := reference.New(eo)
	require.NoError(t, err)
	in, w := io.Pipe()
	r := start(t, newGateway(t), Options{Backend: e, ExitOnStdinEOF: true, Stdin: in})
	require.NoError(t, w.Close())
	select {
	case err := <-r.done:
		require.NoError(t, err)
		close(r.done)
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not stop when its stdin closed")
	}
}

// TestMainExitCodes: --help prints the flags (exit 0), bad flags exit 2 with the reason, a
// model the engine cannot load exits 1.
func TestMainExitCodes(t *testing.T) {
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) }) // run sets the default logger
	var out, errOut bytes.Buffer
	require.Equal(t, ExitOK, run(t.Context(), []string{"--help"}, &out, &errOut))
	for _, f := range []string{"-listen", "-model", "-max-lora-rank", "-max-adapters", "-threads", "-device", "-register",
		"-pool", "-replica", "-join-token-file", "-advertise", "-data-dir", "-tls-cert", "-tls-key", "-tls-ca", "-allow-dir", "-checkpoint-origin"} {
		require.Contains(t, out.String(), f)
	}
	out.Reset()
	require.Equal(t, ExitUsage, run(t.Context(), []string{"--device", "cuda"}, &out, &errOut))
	require.Contains(t, errOut.String(), "the Go worker runs on the CPU")
	require.Empty(t, out.String())
	errOut.Reset()
	require.Equal(t, ExitUsage, run(t.Context(), []string{"--dtype", "bfloat16"}, &out, &errOut))
	require.Contains(t, errOut.String(), "flag of the Python worker")
	errOut.Reset()
	t.Setenv(LogLevelEnv, "ERROR")
	targs, _ := tlsArgs(t, t.TempDir())
	require.Equal(t, ExitFailure, run(t.Context(), append([]string{"--model", filepath.Join(t.TempDir(), "missing"), "--data-dir", t.TempDir()}, targs...), &out, &errOut))
	require.Contains(t, errOut.String(), "neither a folder with config.json")
	require.Empty(t, out.String(), "no ready line for a worker that did not start")
}

// TestWriteTinyShared: workers that start together on one data folder write the built-in
// model one at a time, and each then loads the whole model.
func TestWriteTinyShared(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	eo := reference.Options{DataDir: t.TempDir(), Threads: 1}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			if err := writeTiny(eo); err != nil {
				errs <- err
				return
			}
			e, err := reference.New(eo)
			if err == nil {
				_ = e.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, writeTiny(reference.Options{Models: []string{"elsewhere"}}), "no built-in model: nothing written")
}

// TestStrangersGetNothing: the Go worker serves the gateway that issued its credentials
// and nobody else: no client certificate, another gateway's, the worker's own, plaintext
// HTTP/2 or HTTP/1.1 read, save, sample and delete nothing; and the gateway talks to it
// only as the worker of its own pool.
func TestStrangersGetNothing(t *testing.T) {
	eo, _ := engineOptions(t)
	g := newGateway(t)
	dir := filepath.Join(g.dir, "allowed")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	r := start(t, g, Options{Engine: eo, AllowDirs: []string{dir}})
	poolstest.CheckStrangers(t, g.auth, worker.PoolID(tiny.Name), r.addr, dir)
}

// TestHealth: the worker answers the standard grpc.health.v1 service over its mutual TLS
// (SERVING, per service too), NOT_SERVING once it stops, and nothing to a client without
// the gateway's certificate.
func TestHealth(t *testing.T) {
	eo, _ := engineOptions(t)
	g := newGateway(t)
	r := start(t, g, Options{Engine: eo})
	hc := g.client(t)
	cl := grpchealth.NewClient(hc, "https://"+r.addr, connect.WithGRPC())
	for _, service := range []string{"", backendv1connect.TrainerServiceName, backendv1connect.SamplerServiceName} {
		res, err := cl.Check(t.Context(), &grpchealth.CheckRequest{Service: service})
		require.NoError(t, err, service)
		require.Equal(t, grpchealth.StatusServing, res.Status, service)
	}
	_, err := cl.Check(t.Context(), &grpchealth.CheckRequest{Service: "loops.v1.TrainingService"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	stranger := mtls.HTTPClient(&tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}) //nolint:gosec // a stranger's client
	_, err = grpchealth.NewClient(stranger, "https://"+r.addr, connect.WithGRPC()).Check(t.Context(), &grpchealth.CheckRequest{})
	require.Error(t, err, "a client without the gateway's certificate")

	watch := cl.Watch(t.Context(), &grpchealth.CheckRequest{})
	ev := <-watch
	require.NoError(t, ev.Err)
	require.Equal(t, grpchealth.StatusServing, ev.Response.Status)
	r.cancel() // the worker stops
	ev = <-watch
	require.NoError(t, ev.Err)
	require.Equal(t, grpchealth.StatusNotServing, ev.Response.Status)
}
