package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/opsvc"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/grpcurltest"
)

// grpcurl runs the real grpcurl in plaintext (h2c) with args (flags, the address, then
// what to do) and returns its stdout, its stderr and whether it succeeded.
func grpcurl(t *testing.T, bin string, args ...string) (string, string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append([]string{"-plaintext", "-max-time", "20"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err == nil
}

// get GETs url and returns its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(b)
}

// TestGrpcurl is issue 35's item 1 with the ecosystem's own tool: the real grpcurl,
// without a proto file, lists and describes the public API by server reflection with no
// key, calls a loops.v1 method with a key (and is refused without one), and checks health
// (no key) before and through a drain: SERVING, then NOT_SERVING while Close drains, a
// Watch stream sees the change and ends; /readyz fails with it while /livez stays ok.
func TestGrpcurl(t *testing.T) {
	bin := grpcurltest.Binary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys, DrainDelay: 6 * time.Second})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	addr := ln.Addr().String()
	url := "http://" + addr

	// Reflection, without a key.
	out, errOut, ok := grpcurl(t, bin, addr, "list")
	require.True(t, ok, errOut)
	listed := strings.Fields(out)
	require.Subset(t, listed, []string{"loops.v1.SessionService", "loops.v1.TrainingService", "loops.v1.SamplingService",
		"loops.v1.ModelService", "loops.v1.PoolService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"})
	for _, name := range listed {
		require.True(t, strings.HasPrefix(name, "loops.v1.") || strings.HasPrefix(name, "grpc."), "listed %s, which /openapi.json does not publish", name)
	}
	out, errOut, ok = grpcurl(t, bin, addr, "describe", "loops.v1.TrainingService")
	require.True(t, ok, errOut)
	require.Contains(t, out, "rpc ForwardBackward ( .loops.v1.ForwardBackwardRequest ) returns ( .loops.v1.Operation )")
	out, errOut, ok = grpcurl(t, bin, addr, "describe", "loops.v1.Datum")
	require.True(t, ok, errOut)
	require.Contains(t, out, "loss_fn_inputs")
	// What the binary links in but /openapi.json does not publish stays unknown.
	_, errOut, ok = grpcurl(t, bin, addr, "describe", "loops.backend.v1.TrainerService")
	require.False(t, ok)
	require.Contains(t, errOut, "not found")

	// A keyed call to loops.v1 with no proto file; without the key it is refused.
	out, errOut, ok = grpcurl(t, bin, "-H", "x-api-key: "+keyA, addr, "loops.v1.ModelService/ListModels")
	require.True(t, ok, errOut)
	var models struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &models), out)
	require.NotEmpty(t, models.Models)
	require.Equal(t, "loops/tiny", models.Models[0].Name)
	_, errOut, ok = grpcurl(t, bin, addr, "loops.v1.ModelService/ListModels")
	require.False(t, ok)
	require.Contains(t, errOut, "Unauthenticated")

	// Health, without a key: the server, a service by name, and an unknown one.
	out, errOut, ok = grpcurl(t, bin, addr, "grpc.health.v1.Health/Check")
	require.True(t, ok, errOut)
	require.JSONEq(t, `{"status":"SERVING"}`, out)
	out, errOut, ok = grpcurl(t, bin, "-d", `{"service":"loops.v1.TrainingService"}`, addr, "grpc.health.v1.Health/Check")
	require.True(t, ok, errOut)
	require.JSONEq(t, `{"status":"SERVING"}`, out)
	_, errOut, ok = grpcurl(t, bin, "-d", `{"service":"loops.backend.v1.TrainerService"}`, addr, "grpc.health.v1.Health/Check")
	require.False(t, ok)
	require.Contains(t, errOut, "NotFound")
	code, body := get(t, url+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ok\n", body)

	// A Watch stream, open before the drain.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var watchErr bytes.Buffer
	watch := exec.CommandContext(ctx, bin, "-plaintext", addr, "grpc.health.v1.Health/Watch")
	watch.Stderr = &watchErr
	stdout, err := watch.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, watch.Start())
	statuses := make(chan string, 8)
	go func() {
		defer close(statuses)
		dec := json.NewDecoder(stdout)
		for {
			var m struct{ Status string }
			if dec.Decode(&m) != nil {
				return
			}
			statuses <- m.Status
		}
	}()
	next := func() string {
		select {
		case s := <-statuses:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("the Watch stream sent nothing for 10 s")
			return ""
		}
	}
	require.Equal(t, "SERVING", next())

	// The drain: Close answers NOT_SERVING for DrainDelay before the listener closes.
	closed := make(chan error, 1)
	go func() {
		grace, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		closed <- srv.Close(grace)
	}()
	require.Eventually(t, func() bool {
		out, _, ok := grpcurl(t, bin, addr, "grpc.health.v1.Health/Check")
		return ok && strings.Contains(out, "NOT_SERVING")
	}, 3*time.Second, 50*time.Millisecond, "Health/Check during the drain")
	out, errOut, ok = grpcurl(t, bin, "-d", `{"service":"loops.v1.SamplingService"}`, addr, "grpc.health.v1.Health/Check")
	require.True(t, ok, errOut)
	require.JSONEq(t, `{"status":"NOT_SERVING"}`, out)
	code, body = get(t, url+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "[-]shutdown: the server is draining")
	require.Contains(t, body, "readyz check failed")
	code, body = get(t, url+"/livez")
	require.Equal(t, http.StatusOK, code, "liveness does not fail on a drain: %s", body)
	require.Equal(t, "NOT_SERVING", next())
	select {
	case s, more := <-statuses:
		require.False(t, more, "the Watch stream ends after NOT_SERVING, it sent %s", s)
	case <-time.After(5 * time.Second):
		t.Fatal("the Watch stream did not end when the drain began")
	}
	require.NoError(t, watch.Wait(), "grpcurl Watch: %s", watchErr.String())
	require.NoError(t, <-closed)
}

// flakyStore is a store whose ping fails while down is set.
type flakyStore struct {
	store.Store
	down *atomic.Bool
}

func (f flakyStore) Ping(ctx context.Context) error {
	if f.down.Load() {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// TestHealthFollowsTheStore: gRPC health (over grpc-go's own client, and Watch over
// Connect) and /readyz answer NOT_SERVING while the store does not answer, and SERVING
// again once it does; /livez stays ok throughout.
func TestHealthFollowsTheStore(t *testing.T) {
	down := new(atomic.Bool)
	addr := startServerWith(t, func(c *gateway.Config) {
		c.Store = flakyStore{openSQLite(t), down}
		c.HealthProbeEvery = 50 * time.Millisecond
	})
	url := "http://" + addr
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		res, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		require.NoError(t, err)
		return res.GetStatus()
	}
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, check(""))
	for _, s := range opsvc.LoopsServices() {
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, check(s), s)
	}
	_, err = hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "nope.Service"})
	require.Equal(t, codes.NotFound, status.Code(err))

	watch, err := hc.Watch(t.Context(), &healthpb.HealthCheckRequest{Service: "loops.v1.TrainingService"})
	require.NoError(t, err)
	first, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, first.GetStatus())

	down.Store(true)
	next, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next.GetStatus())
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check(""))
	code, body := get(t, url+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "[-]store: the other store's ping failed")
	code, _ = get(t, url+"/livez")
	require.Equal(t, http.StatusOK, code)

	down.Store(false)
	next, err = watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, next.GetStatus())
	code, body = get(t, url+"/readyz?verbose")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "[+]shutdown ok\n[+]store ok\nreadyz check passed\n", body)

	// Over Connect too (connect-go's client of the same service).
	cc := connect.NewClient[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](http.DefaultClient, url+"/grpc.health.v1.Health/Check")
	res, err := cc.CallUnary(t.Context(), connect.NewRequest(&healthpb.HealthCheckRequest{}))
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, res.Msg.GetStatus())
	require.Equal(t, grpchealth.HealthV1ServiceName, "grpc.health.v1.Health")
}

// TestPprofIsOperatorsOnly is issue 35's item 5: /debug/pprof answers an operator key, a
// workspace key gets a plain 404 (and no key a 401, as on every private path).
func TestPprofIsOperatorsOnly(t *testing.T) {
	const operatorKey = "tml-test-operator"
	addr := startServerWith(t, func(c *gateway.Config) {
		require.NoError(t, c.Keys.AddOperatorKeys([]string{operatorKey}))
	})
	do := func(path, key string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set(auth.HeaderName, key)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		code, body := do(path, keyA)
		require.Equal(t, http.StatusNotFound, code, path)
		require.Equal(t, "404 page not found\n", body, path)
		code, _ = do(path, "")
		require.Equal(t, http.StatusUnauthorized, code, path)
	}
	code, body := do("/debug/pprof/", operatorKey)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine")
	code, body = do("/debug/pprof/goroutine?debug=1", operatorKey)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine profile:")
	code, body = do("/debug/pprof/profile?seconds=1", operatorKey)
	require.Equal(t, http.StatusOK, code, body)
	require.NotEmpty(t, body)
	code, body = do("/debug/pprof/profile?seconds=100000", operatorKey)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "from 1 to 300")
}
