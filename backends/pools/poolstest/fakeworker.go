package poolstest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/grpchealth"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FakeWorkerEnv, set to 1, makes FakeWorkerMain run the fake worker.
const FakeWorkerEnv = "LOOPS_POOLS_FAKE_WORKER"

// FakeSlowPoolEnv names a pool whose fake worker processes register a second late (as a
// real worker whose model takes longer to load than another pool's).
const FakeSlowPoolEnv = "LOOPS_POOLS_FAKE_SLOW_POOL"

// FakeWorker serves TrainerService.GetCapabilities (Implementation "fake cuda=<CUDA_VISIBLE_DEVICES>",
// the models it was given), CreateAdapter and OptimStep that accept anything, and the
// grpc.health.v1 service (SERVING until a test changes Health), on a listener, over mutual
// TLS with its credentials, as a real worker does.
type FakeWorker struct {
	Addr string
	// Health is what its health service answers.
	Health *grpchealth.StaticChecker
	srv    *http.Server
}

type fakeTrainer struct {
	backendv1connect.UnimplementedTrainerServiceHandler
	caps *backendv1.GetCapabilitiesResponse
}

// CreateAdapter and OptimStep accept anything (enough to bind adapters to a replica).
func (f *fakeTrainer) CreateAdapter(context.Context, *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	return &backendv1.CreateAdapterResponse{}, nil
}

func (f *fakeTrainer) OptimStep(context.Context, *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	return &backendv1.OptimStepResponse{}, nil
}

func (f *fakeTrainer) GetCapabilities(context.Context, *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return f.caps, nil
}

// Capabilities are what the fake worker answers.
func Capabilities(models []string) *backendv1.GetCapabilitiesResponse {
	caps := &backendv1.GetCapabilitiesResponse{Implementation: "fake cuda=" + os.Getenv("CUDA_VISIBLE_DEVICES")}
	for _, m := range models {
		name, _, _ := strings.Cut(m, "=")
		caps.Models = append(caps.Models, &loopsv1.ModelInfo{Name: name})
	}
	return caps
}

// StartFakeWorker serves a fake worker with creds on addr (host:port; port 0 picks one).
func StartFakeWorker(addr string, models []string, creds *mtls.Credentials) (*FakeWorker, error) {
	cfg, err := creds.ServerConfig()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(backendv1connect.NewTrainerServiceHandler(&fakeTrainer{caps: Capabilities(models)}))
	health := grpchealth.NewStaticChecker(backendv1connect.TrainerServiceName, backendv1connect.SamplerServiceName)
	mux.Handle(grpchealth.NewHandler(health))
	p := new(http.Protocols)
	p.SetHTTP2(true)
	w := &FakeWorker{Addr: l.Addr().String(), Health: health, srv: &http.Server{Handler: mux, Protocols: p, TLSConfig: cfg, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = w.srv.ServeTLS(l, "", "") }()
	return w, nil
}

// Authority is a gateway's certificate authority in a folder of the test's.
func Authority(t testing.TB) *mtls.Authority {
	t.Helper()
	a, err := mtls.Open(filepath.Join(t.TempDir(), "tls"))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Credentials are a for a worker of pool.
func Credentials(t testing.TB, a *mtls.Authority, pool string) *mtls.Credentials {
	t.Helper()
	c, err := a.Issue(pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// RegistryClient is the HTTP client of a worker of a's gateway dialling its Registry.
func RegistryClient(t testing.TB, a *mtls.Authority) *http.Client {
	t.Helper()
	cfg, err := Credentials(t, a, "registry-client").RegistryDialConfig()
	if err != nil {
		t.Fatal(err)
	}
	hc := mtls.HTTPClient(cfg)
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// Close stops the fake worker at once.
func (w *FakeWorker) Close() { _ = w.srv.Close() }

// FakeWorkerMain runs the fake worker process when FakeWorkerEnv is 1 (call it first in
// TestMain) and exits; otherwise it returns. It takes the real worker's flags: --listen,
// --register, --pool, --replica, --join-token-file, --model, --tls-cert, --tls-key,
// --tls-ca (others are ignored); it exits
// when its stdin closes (with LOOPS_WORKER_EXIT_ON_STDIN_EOF=1), on SIGTERM, or when told to
// drain.
func FakeWorkerMain() {
	if os.Getenv(FakeWorkerEnv) != "1" {
		return
	}
	os.Exit(fakeMain(os.Args[1:]))
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func fakeMain(args []string) int {
	fs := flag.NewFlagSet("fakeworker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "")
	reg := fs.String("register", "", "")
	pool := fs.String("pool", "", "")
	replica := fs.Uint("replica", 0, "")
	tokenFile := fs.String("join-token-file", "", "")
	var files mtls.Files
	fs.StringVar(&files.Cert, "tls-cert", "", "")
	fs.StringVar(&files.Key, "tls-key", "", "")
	fs.StringVar(&files.CA, "tls-ca", "", "")
	var models multi
	fs.Var(&models, "model", "")
	// ignore unknown flags the real worker takes
	var known []string
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		if fs.Lookup(name) != nil {
			known = append(known, args[i])
			if i+1 < len(args) {
				known = append(known, args[i+1])
				i++
			}
		}
	}
	if err := fs.Parse(known); err != nil {
		return 2
	}
	creds, err := mtls.Load(files)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake worker:", err)
		return 1
	}
	w, err := StartFakeWorker(*listen, models, creds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake worker:", err)
		return 1
	}
	fmt.Printf("%s%s\n", readyPrefix, w.Addr)
	fmt.Fprintf(os.Stderr, "fake worker serving on %s cuda=%q\n", w.Addr, os.Getenv("CUDA_VISIBLE_DEVICES"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if os.Getenv("LOOPS_WORKER_EXIT_ON_STDIN_EOF") == "1" {
		c, cancel := context.WithCancel(ctx)
		ctx = c
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	}
	if *reg == "" {
		<-ctx.Done()
		return 0
	}
	if os.Getenv(FakeSlowPoolEnv) == *pool {
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(time.Second):
		}
	}
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake worker: join token:", err)
		return 1
	}
	rcfg, err := creds.RegistryDialConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake worker:", err)
		return 1
	}
	err = pools.Hold(ctx, mtls.HTTPClient(rcfg), *reg, &backendv1.RegisterRequest{PoolId: *pool, Replica: uint32(*replica), Address: w.Addr,
		IncarnationId: fmt.Sprintf("fake-%d-%d", os.Getpid(), time.Now().UnixNano()), JoinToken: strings.TrimSpace(string(tok)), Capabilities: Capabilities(models)})
	if errors.Is(err, pools.ErrDrain) || err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "fake worker:", err)
	return 1
}

// readyPrefix starts the line a worker prints on stdout once it serves (serve.ReadyPrefix).
const readyPrefix = "LOOPS_WORKER_LISTENING "

// StartWorkerProcess starts a worker process (name with args, env added to this
// process's) as an operator starts one by hand, waits for its ready line and returns the
// address it gives, and the process; it is killed when the test ends.
func StartWorkerProcess(t testing.TB, env []string, name string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the worker %s exited before it served: %v", name, err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), strings.TrimSpace(readyPrefix)+" ")
	if !ok {
		t.Fatalf("the worker's first line is not its ready line: %q", line)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }() // a full pipe never blocks it
	return addr, cmd
}
