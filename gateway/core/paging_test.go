package core

import (
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestPageTokensOutliveARestart: a page token stays valid after a restart on the same data
// dir (its key is kept there, private to the server's user), and a server with another key
// refuses it.
func TestPageTokensOutliveARestart(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, Options{})
	for range 3 {
		_, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
		require.NoError(t, err)
	}
	first, err := h.svc.Sessions.ListSessions(h.ctx, &loopsv1.ListSessionsRequest{Limit: 2})
	require.NoError(t, err)
	token := first.GetNextPageToken()
	require.NotEmpty(t, token)
	st, err := os.Stat(filepath.Join(dir, pageTokenKeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.NoError(t, h.core.Close())

	h2 := newHarness(t, dir, Options{})
	rest, err := h2.svc.Sessions.ListSessions(h2.ctx, &loopsv1.ListSessionsRequest{Limit: 2, PageToken: token})
	require.NoError(t, err, "a token from before the restart")
	require.Len(t, rest.GetSessions(), 1)
	require.NotEqual(t, first.GetSessions()[0].GetId(), rest.GetSessions()[0].GetId())

	other := newHarness(t, t.TempDir(), Options{PageTokenKey: []byte("another server's key, 32 bytes!")})
	_, err = other.svc.Sessions.ListSessions(other.ctx, &loopsv1.ListSessionsRequest{PageToken: token})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
}
