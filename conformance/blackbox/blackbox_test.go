package blackbox_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/conformance/blackbox"
	"github.com/loops-dev/loops/conformance/protocol"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
)

const keyA, keyB, operatorKey = "tml-blackbox-a", "tml-blackbox-b", "tml-blackbox-operator"

func startServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA + "=team-a", keyB + "=team-b"})
	require.NoError(t, err)
	require.NoError(t, keys.AddOperatorKeys([]string{operatorKey}))
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

// TestAgainstLoops runs the black-box suite against our own server: every SDK check and
// every Tinker-surface case passes (or is a listed known failure).
func TestAgainstLoops(t *testing.T) {
	url := startServer(t)
	known, err := protocol.LoadKnownFailing("../protocol/known_failing/loops.txt")
	require.NoError(t, err)
	rep, err := blackbox.Run(t.Context(), blackbox.Config{
		Target: url, APIKey: keyA, OtherAPIKey: keyB, OperatorAPIKey: operatorKey, MaxBodyBytes: 64 << 20, KnownFailing: known,
	})
	require.NoError(t, err)
	for _, r := range rep.Results {
		require.Falsef(t, r.Status.Failed(), "%s: %s: %s", r.Name, r.Status, r.Reason)
	}
	require.Len(t, rep.Results[:len(blackbox.SDKCheckNames())], len(blackbox.SDKCheckNames()))
	for i, name := range blackbox.SDKCheckNames() {
		require.Equal(t, name, rep.Results[i].Name)
		require.Equal(t, protocol.StatusPass, rep.Results[i].Status, rep.Results[i].Reason)
	}
	require.Positive(t, rep.Passed)
	require.True(t, rep.OK())
}

// The SDK checks on the JSON wire of tinker ≤ 0.24 pass against Loops, which serves both.
func TestJSONWireAgainstLoops(t *testing.T) {
	url := startServer(t)
	rep, err := blackbox.Run(t.Context(), blackbox.Config{Target: url, APIKey: keyA, SkipProtocol: true, Wire: blackbox.WireJSON})
	require.NoError(t, err)
	for _, r := range rep.Results {
		require.Equalf(t, protocol.StatusPass, r.Status, "%s: %s", r.Name, r.Reason)
	}
	_, err = blackbox.Run(t.Context(), blackbox.Config{Target: url, APIKey: keyA, Wire: "xml"})
	require.ErrorContains(t, err, `Wire "xml"`)
}

// TestReportsFailures points the suite at a server with the wrong key: every check fails or
// is skipped, and the report says so.
func TestReportsFailures(t *testing.T) {
	url := startServer(t)
	rep, err := blackbox.Run(t.Context(), blackbox.Config{Target: url, APIKey: "tml-wrong-key", SkipProtocol: true})
	require.NoError(t, err)
	require.False(t, rep.OK())
	require.Equal(t, protocol.StatusFail, rep.Results[0].Status)
	require.Contains(t, rep.Results[0].Reason, "401")
	require.Equal(t, protocol.StatusSkip, rep.Results[len(rep.Results)-1].Status)
}
