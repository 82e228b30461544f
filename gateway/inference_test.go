package gateway

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/auth"
)

// TestInferenceAPIsShareOneEngine: the OpenAI- and Anthropic-compatible APIs sample through
// one engine, so a workspace's sampler of a model is created once whichever API asks, and
// the bound on remembered samplers covers both.
func TestInferenceAPIsShareOneEngine(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	const key = "tml-shared-engine"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{key})
	require.NoError(t, err)
	srv, err := New(t.Context(), ln, Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	base := "http://" + ln.Addr().String()
	post := func(path, body string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		_ = resp.Body.Close()
	}
	post("/oai/api/v1/completions", `{"model":"`+tiny.Name+`","prompt":"Hello","max_tokens":2}`)
	post("/anthropic/api/v1/messages", `{"model":"`+tiny.Name+`","max_tokens":2,"messages":[{"role":"user","content":"Hello"}]}`)
	srv.mu.Lock()
	eng := srv.infer
	srv.mu.Unlock()
	require.Equal(t, 1, eng.Samplers(), "one sampler for the workspace's model, created by whichever API asked first")
}
