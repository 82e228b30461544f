package gateway_test

import (
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// Two gateways on one PostgreSQL: keys made through the standby are the leader's records; a
// revocation on the leader is refused through the standby at once (the standby forwards,
// the leader checks); after failover the new leader accepts the stored keys and the tokens
// the old leader signed (the signing keys are in the database) and refuses the revoked one.
func TestKeysAndTokensAcrossFailover(t *testing.T) {
	dbURL := pgtest.Start(t).NewSchema(t)
	cks, err := ckstore.Open(t.Context(), t.TempDir(), ckstore.Options{})
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA + "=ws-a"})
	require.NoError(t, err)
	require.NoError(t, keys.AddOperatorKeys([]string{operatorKey}))
	ctx := t.Context()

	a := startMemberTTL(t, dbURL, cks, keys, 2*time.Second)
	require.Eventually(t, func() bool { return healthOf(t, a.url).Role == "leader" }, 20*time.Second, 20*time.Millisecond)
	b := startMemberTTL(t, dbURL, cks, keys, 2*time.Second)
	require.Eventually(t, func() bool { return healthOf(t, b.url).Lease.Leader == a.url }, 20*time.Second, 20*time.Millisecond)

	op := loopsv1connect.NewKeyServiceClient(http.DefaultClient, b.url, withKey(operatorKey))
	k1, err := op.CreateKey(ctx, &loopsv1.CreateKeyRequest{Workspace: "ws-k", Name: "stays"})
	require.NoError(t, err)
	k2, err := op.CreateKey(ctx, &loopsv1.CreateKeyRequest{Workspace: "ws-k", Name: "revoked"})
	require.NoError(t, err)
	whoVia := func(url, cred string) (*loopsv1.WhoAmIResponse, error) {
		return loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(cred)).WhoAmI(ctx, &loopsv1.WhoAmIRequest{})
	}
	tokenVia := func(url, key string) string {
		code, body := postJSON(t, url+"/api/v1/auth/token", key, `{}`)
		require.Equal(t, http.StatusOK, code, body)
		return body["jwt"].(string)
	}
	t1, t2 := tokenVia(b.url, k1.GetSecret()), tokenVia(a.url, k2.GetSecret())
	for _, cred := range []string{k1.GetSecret(), t1, k2.GetSecret(), t2} {
		who, err := whoVia(b.url, cred)
		require.NoError(t, err)
		require.Equal(t, "ws-k", who.GetWorkspace())
	}

	// Revoked on the leader: refused through the standby at once, key and token.
	_, err = loopsv1connect.NewKeyServiceClient(http.DefaultClient, a.url, withKey(operatorKey)).RevokeKey(ctx, &loopsv1.RevokeKeyRequest{Id: k2.GetKey().GetId()})
	require.NoError(t, err)
	for _, cred := range []string{k2.GetSecret(), t2} {
		_, err = whoVia(b.url, cred)
		require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err), "via the standby: %v", err)
	}

	a.kill()
	require.Eventually(t, func() bool { return healthOf(t, b.url).Role == "leader" }, 20*time.Second, 20*time.Millisecond)
	for _, cred := range []string{k1.GetSecret(), t1} {
		who, err := whoVia(b.url, cred)
		require.NoError(t, err)
		require.Equal(t, k1.GetKey().GetId(), who.GetKeyId())
	}
	for _, cred := range []string{k2.GetSecret(), t2} {
		_, err = whoVia(b.url, cred)
		require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err), "after failover: %v", err)
	}
	// The new leader signs with the signing key the old one made.
	code, body := postJSON(t, b.url+"/api/v1/auth/token", k1.GetSecret(), `{}`)
	require.Equal(t, http.StatusOK, code, body)
}
