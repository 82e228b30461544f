package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/replicaplan"
)

// TestServeDatabaseSurvivesRestart starts loops serve on each store, creates a session,
// stops the server, starts it again on the same database and finds the session there.
// PostgreSQL is selected by --database the first time and by LOOPS_DATABASE the second.
func TestServeDatabaseSurvivesRestart(t *testing.T) {
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			dataDir := t.TempDir()
			var first []string
			var dbURL string
			if kind == "postgres" {
				dbURL = pgtest.Start(t).NewDatabase(t)
				first = []string{"--database", dbURL, "--db-max-conns", "4", "--db-statement-timeout", "30s"}
			}

			url, stop := startServe(t, dataDir, first...)
			sessions := sessionClient(url)
			created, err := sessions.CreateSession(t.Context(), &loopsv1.CreateSessionRequest{Tags: []string{"restart"}})
			require.NoError(t, err)
			stop()

			if dbURL != "" {
				t.Setenv("LOOPS_DATABASE", dbURL)
			}
			url, stop = startServe(t, dataDir)
			defer stop()
			sessions = sessionClient(url)
			got, err := sessions.GetSession(t.Context(), &loopsv1.GetSessionRequest{Id: created.GetId()})
			require.NoError(t, err)
			require.Equal(t, created.GetId(), got.GetId())
			require.Equal(t, []string{"restart"}, got.GetTags())
			list, err := sessions.ListSessions(t.Context(), &loopsv1.ListSessionsRequest{})
			require.NoError(t, err)
			require.EqualValues(t, 1, list.GetTotalCount())
		})
	}
}

func TestServeRejectsUnknownDatabase(t *testing.T) {
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--database", "mysql://u:secret@h/db"})
	err := cmd.ExecuteContext(t.Context())
	require.ErrorContains(t, err, "postgres://")
	require.NotContains(t, err.Error(), "secret")

	t.Setenv("LOOPS_DB_MAX_CONNS", "many")
	cmd = rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()})
	require.ErrorContains(t, cmd.ExecuteContext(t.Context()), "LOOPS_DB_MAX_CONNS")
}

func TestServeRejectsOutOfRangeScheduling(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--train-chunk-tokens", "0"}, "--train-chunk-tokens 0 is out of range: use 64 to 1048576"},
		{[]string{"--train-chunk-tokens", "9223372036854775807"}, "out of range"},
		{[]string{"--train-concurrency", "0"}, "--train-concurrency 0 is out of range: use 1 to 64"},
		{[]string{"--train-concurrency", "65"}, "--train-concurrency 65 is out of range"},
		{[]string{"--long-poll", "1h"}, "--long-poll 1h0m0s is out of range"},
		{[]string{"--fairness-target", "0.5"}, "is not a latency inflation"},
	} {
		cmd := rootCmd()
		cmd.SetArgs(append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, c.args...))
		require.ErrorContains(t, cmd.ExecuteContext(t.Context()), c.want, c.args)
	}
}

// TestServeRefusesABadPriceSheet: a price sheet that does not parse stops the server from
// starting, with the line that is wrong.
func TestServeRefusesABadPriceSheet(t *testing.T) {
	sheet := filepath.Join(t.TempDir(), "prices.yaml")
	require.NoError(t, os.WriteFile(sheet, []byte("models:\n  m:\n    sample: 1.2.3\n"), 0o600))
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--prices", sheet})
	require.ErrorContains(t, cmd.ExecuteContext(t.Context()), `line 3: "1.2.3" is not a decimal number of dollars`)
	cmd = rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--prices", sheet + ".missing"})
	require.ErrorContains(t, cmd.ExecuteContext(t.Context()), "--prices")
}

// TestServeReloadsTheWorkspacePolicy: loops serve --workspace-policy refuses a file it
// cannot use at start, and puts a change of the file in force while it runs (GetWorkspace
// shows the new limit), without a restart.
func TestServeReloadsTheWorkspacePolicy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(file, []byte("default: {max_concurrent_runs: many}\n"), 0o600))
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--workspace-policy", file})
	require.ErrorContains(t, cmd.ExecuteContext(t.Context()), "workspace policy "+file)

	require.NoError(t, os.WriteFile(file, []byte("default: {max_concurrent_runs: 1}\n"), 0o600))
	url, _ := startServe(t, t.TempDir(), "--workspace-policy", file)
	ws := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("X-API-Key", "tml-serve-test")
				return next(ctx, req)
			}
		})))
	limit := func() int32 {
		got, err := ws.GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{})
		require.NoError(t, err)
		return got.GetLimits().GetMaxConcurrentRuns()
	}
	require.Equal(t, int32(1), limit())
	require.NoError(t, os.WriteFile(file, []byte("default: {max_concurrent_runs: 12}\n"), 0o600))
	require.Eventually(t, func() bool { return limit() == 12 }, 20*time.Second, 100*time.Millisecond, "reloaded within its 2 s poll")
}

// startServe runs loops serve with args on a free loopback port until stop, which waits for
// it to shut down cleanly. It returns once the server answers /healthz.
func startServe(t *testing.T, dataDir string, args ...string) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cmd := rootCmd()
	cmd.SetArgs(append([]string{"serve", "--addr", addr, "--data-dir", dataDir, "--log-level", "warn"}, args...))
	go func() { done <- cmd.ExecuteContext(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-done)
	}
	t.Cleanup(stop)

	url = "http://" + addr
	for {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, stop
			}
		}
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("loops serve exited before answering: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func sessionClient(url string) loopsv1connect.SessionServiceClient {
	return loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("X-API-Key", "tml-serve-test")
				return next(ctx, req)
			}
		})))
}

// TestServePlansReplicas: with --device-memory-gib the catalog says what a replica of
// loops/tiny needs and holds, and a device too small for it stops loops serve with the
// arithmetic. loops/tiny on the reference engine (float32), computed by hand:
//
//	parameters 512·256 (tied embedding) + 256 (final norm) + 4 × (2·256 norms + 2·64 q/k
//	  norms + 256·256 q + 2·256·128 k, v + 256·256 o + 3·256·768 MLP) = 3279616
//	  → weights 13118464 B
//	LoRA per rank: 256 + 512 (lm_head) + 4 × (512 + 2·384 + 512 + 2·1024 + 1024) = 20224
//	  → rank 64: 64 × 20224 × 16 B = 20709376 B (on each device)
//	loss head: 256 rows × 512 logits × 8 B = 1048576 B
//	per token: 4 B × (4·256 + 2·(5·256 + 2·256 + 2·128 + 3·768) + 2·256) = 40960 B
//
// 0.1 GiB = 107374182 B: (107374182 − 13118464 − 20709376 − 1048576) / 40960 = 1769.96 →
// 1769 tokens; the full 2048 tokens (83886080 B) leave 107374182 − 20709376 − 1048576 −
// 83886080 = 1730150 B per device for the weights' shard: ⌈13118464 / 1730150⌉ = ⌈7.58⌉ = 8
// devices.
func TestServePlansReplicas(t *testing.T) {
	url, stop := startServe(t, t.TempDir(), "--device-memory-gib", "0.1")
	defer stop()
	cl := loopsv1connect.NewModelServiceClient(http.DefaultClient, url, connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("X-API-Key", "tml-serve-test")
				return next(ctx, req)
			}
		})))
	resp, err := cl.ListModels(t.Context(), &loopsv1.ListModelsRequest{})
	require.NoError(t, err)
	require.Len(t, resp.GetModels(), 1)
	m := resp.GetModels()[0]
	require.Equal(t, int64(3279616), m.GetParameterCount())
	require.Equal(t, int64(20224), m.GetLoraParametersPerRank())
	require.Equal(t, int32(1769), m.GetMaxSequenceLength(), "what one 0.1 GiB device holds")
	require.Equal(t, int32(8), m.GetDevicesPerReplica(), "devices for the full 2048 tokens")
	require.Equal(t, int64(107374182), m.GetDeviceMemoryBytes())
	require.Equal(t, int64(13118464+20709376+1048576+1769*40960), m.GetReplicaBytes())

	// 0.03 GiB = 32212254 B holds not even the weights and LoRA state
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--device-memory-gib", "0.03"})
	err = cmd.ExecuteContext(t.Context())
	require.ErrorContains(t, err, "loops/tiny does not fit a replica of 1 device(s) of 30.72 MiB")
	require.ErrorContains(t, err, "weights 3279616 parameters × 4 B (float32) = 12.51 MiB")
	require.ErrorContains(t, err, "LoRA state 1 adapter(s) × rank 64 × 20224 parameters per rank × 16 B = 19.75 MiB")
	require.ErrorContains(t, err, "(0.039 MiB per token) of a 1024-token sequence")
	// the full 2048 tokens' activations (80 MiB) fit no such device, however many
	require.ErrorContains(t, err, "Use devices with more memory (--device-memory-gib)")
	cmd = rootCmd()
	cmd.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--device-memory-gib", "-1"})
	require.ErrorContains(t, cmd.ExecuteContext(t.Context()), "--device-memory-gib -1 is out of range")
}

// The replica's devices are the pool's gpus_per_replica (1 for a CPU replica).
func TestReplicaConfig(t *testing.T) {
	require.Equal(t, replicaplan.Config{DeviceMemory: 80 << 30, Devices: 4}, replicaConfig(80, map[string]string{"gpus_per_replica": "4"}))
	require.Equal(t, replicaplan.Config{DeviceMemory: 3 << 29, Devices: 1}, replicaConfig(1.5, map[string]string{"gpus_per_replica": "0"}))
	require.Equal(t, replicaplan.Config{Devices: 1}, replicaConfig(0, nil))
}
