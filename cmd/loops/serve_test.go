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
