package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
)

// TestLimitIs429WithRetryAfterOnEverySurface: a refusing cap (here the live sessions of a
// workspace) answers 429 with a Retry-After header and a message that names the limit on
// Connect, loops.v1 REST and Tinker's routes.
func TestLimitIs429WithRetryAfterOnEverySurface(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { c.Core.Limits.MaxSessionsPerWorkspace = 1 })
	url := "http://" + addr
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA))
	_, err := sessions.CreateSession(t.Context(), &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)

	_, err = sessions.CreateSession(t.Context(), &loopsv1.CreateSessionRequest{})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Message(), "max_sessions_per_workspace")
	require.Equal(t, "1", ce.Meta().Get("Retry-After"), "Connect")
	require.Equal(t, "LIMIT_REACHED", connectReason(t, err).GetReason())

	post := func(path, body string) *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, bytes.NewReader([]byte(body)))
		require.NoError(t, err)
		req.Header.Set("X-API-Key", keyA)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	for _, path := range []string{"/v1/sessions", "/api/v1/create_session"} {
		resp := post(path, `{}`)
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", path, b)
		require.Equal(t, "1", resp.Header.Get("Retry-After"), path)
		require.Contains(t, string(b), "max_sessions_per_workspace", path)
	}
	// Another workspace has room of its own.
	other := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyB))
	_, err = other.CreateSession(t.Context(), &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
}
