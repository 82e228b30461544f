// Package s3test starts a throwaway S3-compatible server for tests: SeaweedFS's weed, a
// real server (master, volume server, filer and S3 gateway in one process), on free
// loopback ports with its data in a temporary folder, stopped and removed when the test
// (or, in a package whose TestMain calls Main, the test binary) ends.
//
// The weed binary is looked up in $LOOPS_WEED_BIN, then as weed on PATH, then as
// ~/.cache/loops/bin/weed, which `make weed` builds from the Go module proxy once per
// machine (and `make test-go`, hence CI, runs first). Without it Start skips the test with a message saying
// how to build it, except under CI (CI=true), where it fails it: CI must never pass by
// skipping the S3 tests.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// startTimeout bounds the wait for the S3 gateway to answer.
const startTimeout = 2 * time.Minute

// stopGrace is how long Stop waits after SIGTERM before it kills the server.
const stopGrace = 2 * time.Second

// Server is a running throwaway S3-compatible server.
type Server struct {
	// Endpoint is the S3 gateway's URL, http://127.0.0.1:<port>.
	Endpoint string
	// AccessKey and SecretKey are an administrator's credentials.
	AccessKey, SecretKey string
	// Region is what clients should sign for.
	Region string

	client  *minio.Client
	buckets atomic.Int64
	stop    func()
}

// ErrNoBinary is returned by Launch when the weed binary cannot be found.
var ErrNoBinary = errors.New("SeaweedFS's weed binary not found (run `make weed`, or set LOOPS_WEED_BIN)")

var shared struct {
	sync.Mutex
	inMain bool
	s      *Server
	err    error
}

// Main runs the tests of a package whose tests share one server, started by the first
// Start and stopped when they are all done: TestMain(m) { os.Exit(s3test.Main(m)) }.
func Main(m *testing.M) int {
	shared.Lock()
	shared.inMain = true
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.s != nil {
		shared.s.Stop()
	}
	return code
}

// Start returns a running server: the package's shared one when its TestMain calls Main,
// otherwise one of its own, stopped when tb ends. Without the weed binary it skips tb,
// or fails it under CI=true.
func Start(tb testing.TB) *Server {
	tb.Helper()
	shared.Lock()
	inMain := shared.inMain
	if inMain {
		if shared.s == nil && shared.err == nil {
			shared.s, shared.err = Launch(context.Background())
		}
		s, err := shared.s, shared.err
		shared.Unlock()
		return orSkip(tb, s, err)
	}
	shared.Unlock()
	s, err := Launch(tb.Context())
	s = orSkip(tb, s, err)
	tb.Cleanup(s.Stop)
	return s
}

func orSkip(tb testing.TB, s *Server, err error) *Server {
	tb.Helper()
	switch {
	case errors.Is(err, ErrNoBinary) && os.Getenv("CI") != "true":
		tb.Skipf("skipping the S3 tests: %v", err)
	case err != nil:
		tb.Fatalf("starting the S3 test server: %v", err)
	}
	return s
}

// Binary returns the path of the weed binary, or ErrNoBinary: $LOOPS_WEED_BIN, else weed
// on PATH, else ~/.cache/loops/bin/weed (where `make weed` links it).
func Binary() (string, error) {
	if p := os.Getenv("LOOPS_WEED_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: LOOPS_WEED_BIN: %v", ErrNoBinary, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("weed"); err == nil {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoBinary, err)
	}
	p := filepath.Join(home, ".cache", "loops", "bin", "weed")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: not in %s", ErrNoBinary, p)
	}
	return p, nil
}

// Launch starts a server of its own; the caller must Stop it.
func Launch(ctx context.Context) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "loops-s3test-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	s := &Server{AccessKey: "loops-test-" + randHex(4), SecretKey: randHex(20), Region: "us-east-1"}
	cfg := map[string]any{"identities": []any{map[string]any{
		"name":        "admin",
		"credentials": []any{map[string]string{"accessKey": s.AccessKey, "secretKey": s.SecretKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}}
	cfgJSON, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), cfgJSON, 0o600); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		return nil, err
	}
	ports, err := freePorts(8)
	if err != nil {
		return nil, err
	}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	args := []string{
		"-logtostderr", // into weed.log, not glog's files in /tmp
		"server", "-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + p(0), "-master.port.grpc=" + p(1), "-master.telemetry=false",
		"-master.volumeSizeLimitMB=64", "-volume.max=0",
		"-volume.port=" + p(2), "-volume.port.grpc=" + p(3), "-volume.preStopSeconds=0",
		"-filer", "-filer.port=" + p(4), "-filer.port.grpc=" + p(5), "-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port=" + p(6), "-s3.port.grpc=" + p(7), "-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.config=" + filepath.Join(dir, "s3.json"),
	}
	logPath := filepath.Join(dir, "weed.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(exited) }()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			// The data is thrown away, so a short grace is enough (weed's own orderly stop
			// takes about 15 s).
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(stopGrace):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
			_ = os.RemoveAll(dir)
			// weed puts its gRPC Unix sockets in /tmp whatever its flags say.
			for svc, port := range map[string]int{"master": ports[1], "volume": ports[3], "filer": ports[5], "s3": ports[7]} {
				_ = os.Remove(fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", svc, port))
			}
		})
	}
	s.Endpoint = "http://127.0.0.1:" + p(6)
	s.client, err = minio.New("127.0.0.1:"+p(6), &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: s.Region})
	if err != nil {
		s.stop()
		return nil, err
	}
	if err := s.waitReady(ctx, exited); err != nil {
		tail := logTail(logPath)
		s.stop()
		return nil, fmt.Errorf("%w; weed's log ends:\n%s", err, tail)
	}
	ok = true
	return s, nil
}

// waitReady waits until the S3 gateway creates and lists a bucket.
func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var last error
	for {
		last = s.client.MakeBucket(ctx, "loops-ready", minio.MakeBucketOptions{Region: s.Region})
		if last == nil {
			if _, last = s.client.BucketExists(ctx, "loops-ready"); last == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("weed exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("the S3 gateway did not answer within %v: %v", startTimeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// NewBucket creates an empty bucket and returns its name.
func (s *Server) NewBucket(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("loops-test-%d-%s", s.buckets.Add(1), randHex(3))
	if err := s.client.MakeBucket(tb.Context(), name, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		tb.Fatalf("creating bucket %s: %v", name, err)
	}
	return name
}

// SetEnv points the AWS environment variables (endpoint, region, credentials) at the
// server for the rest of tb, as a deployment would with `--checkpoint-store s3://…`.
func (s *Server) SetEnv(tb testing.TB) {
	tb.Setenv("AWS_ENDPOINT_URL_S3", s.Endpoint)
	tb.Setenv("AWS_REGION", s.Region)
	tb.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	tb.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	tb.Setenv("AWS_SESSION_TOKEN", "")
}

// Stop stops the server and removes its data.
func (s *Server) Stop() { s.stop() }

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		port := l.Addr().(*net.TCPAddr).Port
		// weed derives nothing from these, but keep them below 55536 so that no port+10000
		// default elsewhere could overflow.
		if port < 55536 {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

func logTail(p string) string {
	b, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
