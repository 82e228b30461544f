package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
)

// TestStalledBodyGets408OnEverySurface: a body that stops arriving is answered 408 in the
// shape of its surface's protocol on the OpenAI- and Anthropic-compatible APIs too, as on
// Tinker's routes (TestStalledBodyIsCutOff): the read deadline cancels the request's
// context, but the client is still there and must not be left with nothing.
func TestStalledBodyGets408OnEverySurface(t *testing.T) {
	const timeout = 300 * time.Millisecond
	addr := startServerWith(t, func(c *gateway.Config) { c.Limits.BodyReadTimeout = timeout })
	for _, tc := range []struct {
		path  string
		check func(t *testing.T, body map[string]any)
	}{
		{"/oai/api/v1/chat/completions", func(t *testing.T, body map[string]any) {
			e, ok := body["error"].(map[string]any)
			require.True(t, ok, "OpenAI's error shape: %v", body)
			require.Equal(t, "invalid_request_error", e["type"])
			require.Equal(t, "body_read_timeout", e["code"])
			require.Contains(t, e["message"], "body read timeout")
		}},
		{"/anthropic/api/v1/messages", func(t *testing.T, body map[string]any) {
			require.Equal(t, "error", body["type"], "Anthropic's error shape: %v", body)
			e, ok := body["error"].(map[string]any)
			require.True(t, ok, "Anthropic's error shape: %v", body)
			require.Equal(t, "invalid_request_error", e["type"])
			require.Contains(t, e["message"], "body read timeout")
		}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
				"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":", tc.path, addr, keyA)
			require.NoError(t, err)
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err, "the stalled request was not answered")
			b, _ := io.ReadAll(resp.Body)
			require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var body map[string]any
			require.NoError(t, json.Unmarshal(b, &body), string(b))
			tc.check(t, body)
		})
	}
}
