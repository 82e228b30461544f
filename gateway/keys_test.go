package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/loops-dev/loops/gateway"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

const operatorKey = "tml-test-operator"

func postJSON(t *testing.T, url, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", key)
	return doJSON(t, req)
}

func doJSON(t *testing.T, req *http.Request) (int, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), string(b))
	return resp.StatusCode, m
}

// A key exchanged at auth/token gives a token that works on every surface; client/config
// turns the SDK's JWT auth on unless the server says otherwise.
func TestAccessTokensOnEverySurface(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { require.NoError(t, c.Keys.AddOperatorKeys([]string{operatorKey})) })
	url := "http://" + addr
	ctx := t.Context()

	code, cfg := postJSON(t, url+"/api/v1/client/config", keyB, `{"sdk_version":"0.38.0"}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, true, cfg["pjwt_auth_enabled"])

	code, tok := postJSON(t, url+"/api/v1/auth/token", keyB, `{}`)
	require.Equal(t, http.StatusOK, code, tok)
	jwt, _ := tok["jwt"].(string)
	require.True(t, strings.HasPrefix(jwt, "eyJ"), jwt)

	// Connect.
	cl := loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(jwt))
	who, err := cl.WhoAmI(ctx, &loopsv1.WhoAmIRequest{})
	require.NoError(t, err)
	require.Equal(t, "team-b", who.GetWorkspace())
	require.Equal(t, "flag", who.GetSource())
	require.Equal(t, loopsv1.KeyRole_KEY_ROLE_MEMBER, who.GetRole())

	// gRPC.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	gwho, err := loopsv1.NewKeyServiceClient(conn).WhoAmI(metadata.AppendToOutgoingContext(ctx, "x-api-key", jwt), &loopsv1.WhoAmIRequest{})
	require.NoError(t, err)
	require.Equal(t, who.GetKeyId(), gwho.GetKeyId())

	// REST, and the Tinker routes (the token in X-API-Key, as the SDK sends it).
	req, _ := http.NewRequest(http.MethodGet, url+"/v1/whoami", nil)
	req.Header.Set("X-API-Key", jwt)
	code, rest := doJSON(t, req)
	require.Equal(t, http.StatusOK, code, rest)
	require.Equal(t, "team-b", rest["workspace"])
	req, _ = http.NewRequest(http.MethodGet, url+"/api/v1/auth/apikey/me", nil)
	req.Header.Set("X-API-Key", jwt)
	code, me := doJSON(t, req)
	require.Equal(t, http.StatusOK, code, me)
	require.Equal(t, who.GetKeyId(), me["id"])

	// A token is not exchanged for another; an operator key has no workspace to bind one to.
	code, body := postJSON(t, url+"/api/v1/auth/token", jwt, `{}`)
	require.Equal(t, http.StatusForbidden, code, body)
	code, body = postJSON(t, url+"/api/v1/auth/token", operatorKey, `{}`)
	require.Equal(t, http.StatusForbidden, code, body)

	// A flag key cannot be revoked over the API: 400 that says why.
	req, _ = http.NewRequest(http.MethodDelete, url+"/api/v1/auth/apikey/me", nil)
	req.Header.Set("X-API-Key", keyB)
	code, body = doJSON(t, req)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body["detail"], "configuration")

	// An operator lists every workspace's keys and makes one; the key works at once.
	ocl := loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(operatorKey))
	made, err := ocl.CreateKey(ctx, &loopsv1.CreateKeyRequest{Workspace: "team-c"})
	require.NoError(t, err)
	all, err := ocl.ListKeys(ctx, &loopsv1.ListKeysRequest{})
	require.NoError(t, err)
	require.Len(t, all.GetKeys(), 1)
	require.Equal(t, made.GetKey().GetId(), all.GetKeys()[0].GetId())
	mine, err := loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(made.GetSecret())).WhoAmI(ctx, &loopsv1.WhoAmIRequest{})
	require.NoError(t, err)
	require.Equal(t, "team-c", mine.GetWorkspace())
	require.Equal(t, made.GetKey().GetId(), mine.GetKeyId())
	// A member key may not list keys.
	_, err = loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(made.GetSecret())).ListKeys(ctx, &loopsv1.ListKeysRequest{})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
}

func TestNoJWTAuth(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) { c.APIKeys.DisableJWTAuth = true })
	code, cfg := postJSON(t, "http://"+addr+"/api/v1/client/config", keyA, `{"sdk_version":"0.38.0"}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, false, cfg["pjwt_auth_enabled"])
}
