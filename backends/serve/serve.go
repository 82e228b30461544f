package serve

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	"github.com/loops-dev/loops/internal/telemetry"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// ReadyPrefix starts the line Run prints on stdout once it serves; the address follows
// (the worker backend's worker.ReadyPrefix, which its local workers are waited on with).
const ReadyPrefix = "LOOPS_WORKER_LISTENING "

// MaxMessageBytes bounds a message the worker reads or sends (1 GiB, as the worker client's
// limits: a ForwardBackward batch of long sequences, or a sample's prompt log-probs, is
// large but never that large).
const MaxMessageBytes = 1 << 30

// DefaultShutdownGrace is how long Run waits for calls in flight when it stops.
const DefaultShutdownGrace = 2 * time.Second

// maxStreamBacklog bounds the sampled tokens StreamSample holds for a client that reads
// slower than the sampler decodes; past it the sample is stopped.
const maxStreamBacklog = 1 << 20

// Options configure Run. Zero values mean the documented defaults.
type Options struct {
	// Listen is the host:port to listen on (default 127.0.0.1:0: a free port on loopback).
	Listen string
	// Credentials are the worker's TLS credentials, issued by the gateway (required): the
	// worker serves over mutual TLS only, and answers only the gateway that issued them.
	Credentials *mtls.Credentials
	// AllowDirs are the folders requests may name (to save adapters into, and to load and
	// sample adapters from), absolute; a folder outside them, once symbolic links are
	// resolved, is refused. None: the worker takes no folder at all.
	AllowDirs []string
	// CheckpointOrigins are the checkpoint store's scheme://host[:port] that checkpoint
	// URLs in requests may name; any other URL is refused. None: no URL is taken.
	CheckpointOrigins []string
	// Backend is what the worker serves. Nil: Run starts the reference engine with Engine,
	// and closes it when it returns; a given Backend is not closed.
	Backend backends.Backend
	// Engine configures the reference engine when Backend is nil.
	Engine reference.Options
	// Register is the gateway's worker registry (https://host:port); empty: the worker does
	// not register. With it, Pool and JoinTokenFile are required: the worker registers as
	// replica Replica of pool Pool, authenticated by the token in JoinTokenFile, and checks
	// the registry's certificate against the gateway CA of its Credentials.
	Register      string
	Pool          string
	Replica       int
	JoinTokenFile string
	// Advertise is the host the gateway dials (default: the Listen host, or this host's
	// address when listening on all interfaces).
	Advertise string
	// ExitOnStdinEOF ends Run when Stdin reaches its end: the parent that started the worker
	// closes it, or dies. ParseArgs sets it when LOOPS_WORKER_EXIT_ON_STDIN_EOF=1.
	ExitOnStdinEOF bool
	// Stdin (default os.Stdin) is watched for its end with ExitOnStdinEOF; Stdout (default
	// os.Stdout) receives the ReadyPrefix line.
	Stdin  io.Reader
	Stdout io.Writer
	// Logger receives the worker's events (default slog.Default()).
	Logger *slog.Logger
	// ShutdownGrace bounds how long Run waits for calls in flight when it stops (default
	// DefaultShutdownGrace); calls still running then are cut off.
	ShutdownGrace time.Duration
}

// handler serves b as the loops.backend.v1 TrainerService and SamplerService (Connect,
// gRPC and gRPC-Web), reading and sending messages of up to MaxMessageBytes, every
// request's folders and URLs checked by c first, and health as the standard
// grpc.health.v1 service (behind the same mutual TLS as the rest). StreamSample streams when b's sampler
// implements backends.TokenStreamer and answers Unimplemented otherwise (the worker client
// then falls back to Sample). A panic in a call answers Internal instead of ending the
// process.
func handler(b backends.Backend, c *confinement, health grpchealth.Checker) http.Handler {
	hopts := []connect.HandlerOption{
		connect.WithReadMaxBytes(MaxMessageBytes),
		connect.WithSendMaxBytes(MaxMessageBytes),
		connect.WithRecover(func(_ context.Context, spec connect.Spec, _ http.Header, p any) error {
			slog.Error("worker call panicked", slog.String("procedure", spec.Procedure), slog.Any("panic", p))
			return connect.NewError(connect.CodeInternal, fmt.Errorf("the worker failed in %s", spec.Procedure))
		}),
	}
	if ic := telemetry.ConnectInterceptor(); ic != nil {
		hopts = append(hopts, connect.WithInterceptors(ic))
	}
	mux := http.NewServeMux()
	mux.Handle(backendv1connect.NewTrainerServiceHandler(trainerHandler{b.Trainer(), c}, hopts...))
	mux.Handle(backendv1connect.NewSamplerServiceHandler(samplerHandler{b.Sampler(), c}, hopts...))
	mux.Handle(grpchealth.NewHandler(health, connect.WithReadMaxBytes(healthMaxBytes)))
	return telemetry.Extract(mux) // the gateway's trace, whose children the calls' spans are
}

// newServer returns an HTTP server of handler(b, c) that speaks HTTP/2 over mutual TLS
// with cfg (mtls.Credentials.ServerConfig) and nothing else, with a bound on reading
// request headers. Its calls have no deadline of their own: a training pass takes as long
// as it takes.
func newServer(b backends.Backend, cfg *tls.Config, c *confinement, health grpchealth.Checker) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP2(true)
	return &http.Server{Handler: handler(b, c, health), Protocols: p, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes: 1 << 20}
}

// samplerHandler is the SamplerService of a backends.Sampler, every request's adapter
// folder and URLs checked by c first.
type samplerHandler struct {
	s backends.Sampler
	c *confinement
}

var _ backendv1connect.SamplerServiceHandler = samplerHandler{}

func (h samplerHandler) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return h.s.GetCapabilities(ctx, req)
}

func (h samplerHandler) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	if err := h.c.sample(req); err != nil {
		return nil, err
	}
	return h.s.Sample(ctx, req)
}

// StreamSample sends every token as the sampler passes it on, then the response. The
// tokens go through a tokenstream.Buffer, so a slow client never holds the decoder (which
// serves every request of its batch); a client that falls maxStreamBacklog tokens behind,
// or goes away, stops the sample.
func (h samplerHandler) StreamSample(ctx context.Context, req *backendv1.StreamSampleRequest, st *connect.ServerStream[backendv1.StreamSampleResponse]) error {
	ts, ok := h.s.(backends.TokenStreamer)
	if !ok {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this worker's sampler does not stream tokens; call Sample"))
	}
	sreq := req.GetRequest()
	if sreq == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("request is required"))
	}
	if err := h.c.sample(sreq); err != nil {
		return err
	}
	buf := tokenstream.NewBuffer(streamBacklog(sreq))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		resp *backendv1.SampleResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := ts.SampleStream(ctx, sreq, buf)
		done <- result{resp, err}
	}()
	send := func() error {
		for _, t := range buf.Take() {
			tok := &backendv1.SampledToken{Sequence: int32(t.Seq), Token: t.ID, Logprob: t.Logprob}
			if len(t.Top) > 0 {
				tok.TopTokens = make([]int32, len(t.Top))
				tok.TopLogprobs = make([]float32, len(t.Top))
				for i, a := range t.Top {
					tok.TopTokens[i], tok.TopLogprobs[i] = a.ID, a.Logprob
				}
			}
			if err := st.Send(&backendv1.StreamSampleResponse{Item: &backendv1.StreamSampleResponse_Token{Token: tok}}); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		select {
		case <-buf.Ready():
			if err := send(); err != nil {
				buf.Close()
				cancel()
				<-done
				return err
			}
		case r := <-done:
			if r.err != nil {
				select {
				case <-buf.Gone():
					if ctx.Err() == nil {
						return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the client fell more than %d tokens behind the sampler; the sample was stopped", streamBacklog(sreq)))
					}
				default:
				}
				return r.err
			}
			if err := send(); err != nil {
				return err
			}
			return st.Send(&backendv1.StreamSampleResponse{Item: &backendv1.StreamSampleResponse_Response{Response: r.resp}})
		}
	}
}

// streamBacklog is what one request can sample at most (num_samples × max_tokens, the
// sampler's defaults when unset), within maxStreamBacklog: a client that reads does not
// lose the sample however the sends and the decoder interleave.
func streamBacklog(req *backendv1.SampleRequest) int {
	n := max(int64(req.GetNumSamples()), 1)
	m := int64(req.GetParams().GetMaxTokens())
	if m < 1 {
		m = 1 << 12
	}
	return int(min(n*m, maxStreamBacklog))
}

var errStdinClosed = errors.New("stdin closed: the parent process has gone")

// Run serves the worker until ctx ends, the gateway tells the replica to drain, or (with
// ExitOnStdinEOF) stdin closes; any of these is a clean stop (nil). It prints the
// ReadyPrefix line once it serves. When it stops it deregisters first, then waits up to
// ShutdownGrace for calls in flight. A registration the gateway refuses for good (bad join
// token, bad pool) is an error.
func Run(ctx context.Context, o Options) error {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.Stdin == nil {
		o.Stdin = os.Stdin
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	if o.Credentials == nil {
		return errors.New("the worker serves over mutual TLS only and needs the credentials the gateway issues (--tls-cert, --tls-key, --tls-ca): the gateway writes them for the workers it starts, and loops pools credentials issues them for a worker started by hand")
	}
	tlsCfg, err := o.Credentials.ServerConfig()
	if err != nil {
		return err
	}
	conf, err := newConfinement(o.AllowDirs, o.CheckpointOrigins)
	if err != nil {
		return err
	}
	var token string
	if o.Register != "" {
		if o.Pool == "" || o.JoinTokenFile == "" {
			return errors.New("--register needs --pool and --join-token-file")
		}
		raw, err := os.ReadFile(o.JoinTokenFile)
		if err != nil {
			return fmt.Errorf("reading the join token: %w", err)
		}
		if token = strings.TrimSpace(string(raw)); token == "" {
			return fmt.Errorf("the join token file %s is empty", o.JoinTokenFile)
		}
	}
	b := o.Backend
	if b == nil {
		if err := writeTiny(o.Engine); err != nil {
			return err
		}
		e, err := reference.New(o.Engine)
		if err != nil {
			return err
		}
		defer func() { _ = e.Close() }()
		b = e
	}
	l, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Listen, err)
	}
	health := newHealth()
	srv := newServer(b, tlsCfg, conf, health)
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(l, "", "") }()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	host, _, _ := net.SplitHostPort(o.Listen)
	if host == "" {
		host = "127.0.0.1"
	}
	addr := net.JoinHostPort(host, port)
	caps, err := b.Trainer().GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("the backend does not report its capabilities: %w", err)
	}
	var models []string
	for _, m := range caps.GetModels() {
		models = append(models, m.GetName())
	}
	o.Logger.Info("worker serving", slog.String("address", addr), slog.Any("models", models), slog.String("implementation", caps.GetImplementation()))
	if _, err := fmt.Fprintf(o.Stdout, "%s%s\n", ReadyPrefix, addr); err != nil {
		_ = srv.Close()
		return fmt.Errorf("writing the ready line: %w", err)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if o.ExitOnStdinEOF {
		go func() { // returns with the process (a read cannot be interrupted)
			_, _ = io.Copy(io.Discard, o.Stdin)
			cancel(errStdinClosed)
		}()
	}
	var held chan error
	if o.Register != "" {
		req := &backendv1.RegisterRequest{PoolId: o.Pool, Replica: uint32(o.Replica),
			Address:       net.JoinHostPort(advertiseHost(o.Listen, o.Advertise), port),
			IncarnationId: incarnationID(), JoinToken: token, Capabilities: caps}
		rcfg, err := o.Credentials.RegistryDialConfig()
		if err != nil {
			_ = srv.Close()
			return err
		}
		hc := mtls.HTTPClient(rcfg)
		defer hc.CloseIdleConnections()
		held = make(chan error, 1)
		go func() { held <- pools.Hold(ctx, hc, o.Register, req) }()
		o.Logger.Info("registering", slog.String("registry", o.Register), slog.String("pool", o.Pool), slog.Int("replica", o.Replica),
			slog.String("advertise", req.GetAddress()), slog.String("incarnation", req.GetIncarnationId()))
	}
	var runErr error
	select {
	case <-ctx.Done():
		o.Logger.Info("worker stopping", slog.String("why", context.Cause(ctx).Error()))
	case err := <-held:
		held = nil
		switch {
		case errors.Is(err, pools.ErrDrain):
			o.Logger.Info("worker stopping", slog.String("why", err.Error()))
		case err != nil:
			runErr = err
		}
	case err := <-served:
		runErr = fmt.Errorf("serving: %w", err)
	}
	cancel(nil)
	stopping(health)
	if held != nil {
		<-held // deregisters (bounded by Hold)
	}
	sctx, scancel := context.WithTimeout(context.Background(), o.ShutdownGrace)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	return runErr
}

// advertiseHost is the host the gateway dials: advertise, else the listen host, else
// (listening on all interfaces) this host's address.
func advertiseHost(listen, advertise string) string {
	if advertise != "" {
		return advertise
	}
	host, _, err := net.SplitHostPort(listen)
	if err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
		return host
	}
	if name, err := os.Hostname(); err == nil {
		if addrs, err := net.LookupHost(name); err == nil && len(addrs) > 0 {
			for _, a := range addrs {
				if ip := net.ParseIP(a); ip != nil && ip.To4() != nil && !ip.IsLoopback() {
					return a
				}
			}
			return addrs[0]
		}
	}
	return "127.0.0.1"
}

// incarnationID names this process lifetime: a new one tells the gateway that the
// adapters of the old one are gone.
func incarnationID() string {
	var r [12]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("go-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
}

// writeTiny writes the built-in model into the engine's data folder, when it serves it,
// under an exclusive lock of a file beside it: replicas started together on one host share
// the folder, and one must not load the model while another is still writing it (the
// engine's own write then finds the finished folder).
func writeTiny(eo reference.Options) error {
	if len(eo.Models) > 0 && !slices.Contains(eo.Models, tiny.Name) {
		return nil
	}
	dir := eo.DataDir
	if dir == "" {
		dir = defaultDataDir()
	}
	models := filepath.Join(dir, "models")
	if err := os.MkdirAll(models, 0o755); err != nil {
		return fmt.Errorf("writing the built-in model: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(models, ".loops-tiny.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("writing the built-in model: %w", err)
	}
	defer func() { _ = lock.Close() }() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	if err := tiny.Write(filepath.Join(models, "loops-tiny")); err != nil {
		return fmt.Errorf("writing the built-in model: %w", err)
	}
	return nil
}

// healthMaxBytes bounds a health request (a service name).
const healthMaxBytes = 4 << 10

// newHealth is the worker's health: SERVING for the server as a whole and for each of its
// services, until it stops.
func newHealth() *grpchealth.StaticChecker {
	return grpchealth.NewStaticChecker(backendv1connect.TrainerServiceName, backendv1connect.SamplerServiceName)
}

// stopping makes every service NOT_SERVING: the worker is shutting down.
func stopping(h *grpchealth.StaticChecker) {
	for _, name := range []string{"", backendv1connect.TrainerServiceName, backendv1connect.SamplerServiceName} {
		h.SetStatus(name, grpchealth.StatusNotServing)
	}
}
