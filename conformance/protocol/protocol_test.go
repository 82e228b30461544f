package protocol_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/conformance/protocol"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
)

const (
	keyA = "tml-conformance-a"
	keyB = "tml-conformance-b"
	// operatorKey makes the API keys of the keys cases.
	operatorKey = "tml-conformance-operator"
	// bodyLimit is small so that over-limit cases stay cheap.
	bodyLimit = 1 << 20
)

// startServer runs the real server (reference backend, two keys in two workspaces) on
// 127.0.0.1:0.
func startServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA + "=team-a", keyB + "=team-b"})
	require.NoError(t, err)
	require.NoError(t, keys.AddOperatorKeys([]string{operatorKey}))
	srv, err := gateway.New(t.Context(), ln, gateway.Config{
		DataDir: t.TempDir(),
		Keys:    keys,
		Limits:  gateway.Limits{MaxBodyBytes: bodyLimit, MaxDecompressedBytes: 4 * bodyLimit},
	})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

// TestProtocol runs every case on Connect, gRPC, REST and the Tinker routes against the
// real server.
func TestProtocol(t *testing.T) {
	url := startServer(t)
	known, err := protocol.LoadKnownFailing("known_failing/loops.txt")
	require.NoError(t, err)
	protocol.Run(t, url, protocol.Options{
		APIKey:         keyA,
		OtherAPIKey:    keyB,
		OperatorAPIKey: operatorKey,
		MaxBodyBytes:   bodyLimit,
		KnownFailing:   known,
	})
}
