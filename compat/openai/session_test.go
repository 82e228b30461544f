package openai_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestSessionHeaderMetersTheSession: a chat completion sent with X-Loops-Session is metered
// to that session (its usage rows carry the session id, the tokens the response reported);
// one without the header to no session; a malformed header is a 400 naming it, an ended
// session a 400, and another workspace's session a 404.
func TestSessionHeaderMetersTheSession(t *testing.T) {
	base := startServer(t, nil)
	ctx := t.Context()
	sess, err := loopsv1connect.NewSessionServiceClient(http.DefaultClient, base, withKey(keyA)).CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	send := func(key, session string) (int, []byte) {
		body := `{"model":"loops/tiny","messages":[{"role":"user","content":"Hi there"}],"max_tokens":3,"temperature":0}`
		req, err := http.NewRequestWithContext(ctx, "POST", base+"/oai/api/v1/chat/completions", bytes.NewReader([]byte(body)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		if session != "" {
			req.Header.Set("X-Loops-Session", session)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	status, body := send(keyA, sess.GetId())
	in := ok(t, status, body)
	status, body = send(keyA, "")
	out := ok(t, status, body)

	usage, err := loopsv1connect.NewUsageServiceClient(http.DefaultClient, base, withKey(keyA)).GetUsage(ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	bySession := map[string]map[loopsv1.UsageKind]int64{}
	for _, b := range usage.GetBuckets() {
		if bySession[b.GetSessionId()] == nil {
			bySession[b.GetSessionId()] = map[loopsv1.UsageKind]int64{}
		}
		bySession[b.GetSessionId()][b.GetKind()] += b.GetAmount()
	}
	prompt := func(m map[loopsv1.UsageKind]int64) int64 {
		return m[loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS] + m[loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS]
	}
	got := bySession[sess.GetId()]
	require.Equal(t, int64(in.Usage.PromptTokens), prompt(got), "the session's prompt tokens: %v", bySession)
	require.Equal(t, int64(in.Usage.CompletionTokens), got[loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS])
	require.Equal(t, int64(out.Usage.PromptTokens), prompt(bySession[""]), "no header, no session: %v", bySession)
	require.Len(t, bySession, 2)

	status, body = send(keyA, "sess bad")
	require.Equal(t, http.StatusBadRequest, status, string(body))
	require.Contains(t, string(body), "X-Loops-Session")
	status, body = send(keyA, strings.Repeat("s", 200))
	require.Equal(t, http.StatusBadRequest, status, string(body))
	// an ended session gets no new sampler
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, base, withKey(keyA))
	ended, err := sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	_, err = sessions.FinishSession(ctx, &loopsv1.FinishSessionRequest{Id: ended.GetId()})
	require.NoError(t, err)
	status, body = send(keyA, ended.GetId())
	require.Equal(t, http.StatusBadRequest, status, string(body))
	require.Contains(t, string(body), "ended")
	status, body = send(keyB, sess.GetId())
	require.Equal(t, http.StatusNotFound, status, string(body))
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &e))
	require.Contains(t, e.Error.Message, "not found")
}
