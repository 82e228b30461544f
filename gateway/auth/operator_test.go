package auth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/errs"
)

// seen is what the handler behind the middleware saw of a request.
type seen struct {
	code      int
	workspace string
	operator  bool
	marked    bool // the NotOperatorHeader, for the REST hop
}

func through(t *testing.T, k *Keys, remote, key string, header map[string]string) seen {
	t.Helper()
	var s seen
	h := k.Middleware(Policy{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.workspace, s.operator = Workspace(r.Context()), IsOperator(r.Context())
		s.marked = r.Header.Get(NotOperatorHeader) != ""
		w.WriteHeader(http.StatusOK)
	}))
	r := httptest.NewRequest(http.MethodGet, "/loops.v1.PoolService/ListPools", nil)
	r.Host, r.RemoteAddr = "127.0.0.1:8000", remote
	r.Header.Set(HeaderName, key)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	s.code = w.Code
	return s
}

// TestOperatorKeys: an operator key is the operator role and no workspace; it is refused
// where a workspace key is needed; it may not be malformed or also a workspace key; a
// workspace key is not an operator's.
func TestOperatorKeys(t *testing.T) {
	k, err := ParseKeys([]string{"tml-ws=team"})
	require.NoError(t, err)
	require.ErrorContains(t, k.AddOperatorKeys([]string{"op"}), `keys start with "tml-"`)
	require.ErrorContains(t, k.AddOperatorKeys([]string{"tml-ws"}), "also configured as a workspace API key")
	require.NoError(t, k.AddOperatorKeys([]string{" tml-op ", "", "tml-op2"}))
	require.Equal(t, 2, k.Operators())
	require.Equal(t, 1, k.Len(), "operator keys are not workspace keys")

	const far = "192.0.2.1:1234"
	require.Equal(t, seen{code: 200, operator: true}, through(t, k, far, "tml-op", nil), "an operator key works from anywhere")
	require.Equal(t, seen{code: 200, operator: true}, through(t, k, "127.0.0.1:5", "tml-op2", nil))
	require.Equal(t, seen{code: 200, workspace: "team"}, through(t, k, "127.0.0.1:5", "tml-ws", nil), "a workspace key is not an operator's, even on loopback")
	require.Equal(t, http.StatusUnauthorized, through(t, k, far, "tml-nope", nil).code)

	_, err = k.Authenticate("tml-op")
	require.ErrorContains(t, err, "operator key, not a workspace API key", "the console's sign-in refuses it too")
	_, err = RequireWorkspace(WithOperator(context.Background()))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.ErrorContains(t, err, "use a workspace key")

	err = RequireOperator(WithWorkspace(context.Background(), "team"))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.Equal(t, errs.ReasonOperatorRequired, errs.Reason(err))
	require.ErrorContains(t, err, "--operator-key")
	require.ErrorContains(t, err, "LOOPS_OPERATOR_KEY")
	require.NoError(t, RequireOperator(WithOperator(context.Background())))
}

// TestOpenModeOperatorIsLoopback: with no keys at all, a request from a loopback peer is an
// operator's as well as its key's workspace's; one from another peer is not, and is marked so
// that its REST hop (from loopback) is not either; the mark, sent by a client, only denies
// it. Once operator keys are configured, only they are operators, in open mode too.
func TestOpenModeOperatorIsLoopback(t *testing.T) {
	open := &Keys{}
	ws, err := open.Authenticate("tml-any")
	require.NoError(t, err)
	for _, peer := range []string{"127.0.0.1:5", "[::1]:5", "127.9.9.9:1", "[::ffff:127.0.0.1]:5"} {
		require.Equal(t, seen{code: 200, workspace: ws, operator: true}, through(t, open, peer, "tml-any", nil), peer)
	}
	for _, peer := range []string{"192.0.2.1:1234", "[2001:db8::1]:5", "10.0.0.1:80", "garbage"} {
		require.Equal(t, seen{code: 200, workspace: ws, marked: true}, through(t, open, peer, "tml-any", nil), peer)
	}
	require.Equal(t, seen{code: 200, workspace: ws, marked: true},
		through(t, open, "127.0.0.1:5", "tml-any", map[string]string{NotOperatorHeader: "1"}), "the mark only denies")

	withOps := &Keys{}
	require.NoError(t, withOps.AddOperatorKeys([]string{"tml-op"}))
	require.True(t, withOps.Open(), "operator keys alone leave workspaces in open mode")
	require.Equal(t, seen{code: 200, workspace: ws}, through(t, withOps, "127.0.0.1:5", "tml-any", nil))
	require.Equal(t, seen{code: 200, operator: true}, through(t, withOps, "127.0.0.1:5", "tml-op", nil))
}

func TestLoopbackPeer(t *testing.T) {
	for _, a := range []string{"127.0.0.1:1", "[::1]:2", "127.0.0.2", "[::ffff:127.0.0.1]:3"} {
		require.True(t, loopbackPeer(a), a)
	}
	for _, a := range []string{"", "localhost:1", "192.0.2.1:1", "[::]:1", "0.0.0.0:1", "@"} {
		require.False(t, loopbackPeer(a), a)
	}
}
