package auth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseKeys(t *testing.T) {
	_, err := ParseKeys([]string{"sk-nope"})
	require.ErrorContains(t, err, `keys start with "tml-"`)
	_, err = ParseKeys([]string{"tml-has space"})
	require.ErrorContains(t, err, "printable ASCII")
	k, err := ParseKeys([]string{"tml-a", "tml-b=team", "# comment", ""})
	require.NoError(t, err)
	require.Equal(t, 2, k.Len())
	ws, err := k.Authenticate("tml-b")
	require.NoError(t, err)
	require.Equal(t, "team", ws)
	wsA, err := k.Authenticate("tml-a")
	require.NoError(t, err)
	require.NotEqual(t, "team", wsA)
	_, err = k.Authenticate("tml-c")
	require.ErrorContains(t, err, "unknown API key")
}

func TestOpenModeGivesEachKeyItsOwnWorkspace(t *testing.T) {
	var k Keys
	require.True(t, k.Open())
	a, err := k.Authenticate("tml-a")
	require.NoError(t, err)
	b, err := k.Authenticate("tml-b")
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	again, _ := k.Authenticate("tml-a")
	require.Equal(t, a, again)
	_, err = k.Authenticate("")
	require.ErrorContains(t, err, "missing API key")
	_, err = k.Authenticate("nope")
	require.ErrorContains(t, err, "malformed API key")
}

func TestMiddleware(t *testing.T) {
	k, err := ParseKeys([]string{"tml-a=ws-a"})
	require.NoError(t, err)
	h := k.Middleware(Policy{Public: []string{"/healthz", "/public/"}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(Workspace(r.Context())))
	}))
	do := func(path, key, bearer string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if key != "" {
			r.Header.Set(HeaderName, key)
		}
		if bearer != "" {
			r.Header.Set("Authorization", "Bearer "+bearer)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	require.Equal(t, "ws-a", do("/x", "tml-a", "").Body.String())
	require.Equal(t, "ws-a", do("/x", "", "tml-a").Body.String())
	require.Equal(t, "", do("/healthz", "", "").Body.String())
	require.Equal(t, http.StatusOK, do("/public/file", "", "").Code)
	w := do("/x", "tml-b", "")
	require.Equal(t, http.StatusUnauthorized, w.Code)
	var body map[string]string
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	require.Contains(t, body["detail"], "unknown API key")
	require.NotEmpty(t, w.Header().Get("Content-Length"))
}

func TestMiddlewareCarriesCaller(t *testing.T) {
	keys, err := ParseKeys([]string{"tml-alpha=team"})
	require.NoError(t, err)
	var got Caller
	h := keys.Middleware(Policy{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = CallerOf(r.Context())
	}))
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	req.Header.Set(HeaderName, "tml-alpha")
	req.RemoteAddr = "192.0.2.7:5555"
	h.ServeHTTP(httptest.NewRecorder(), req)
	require.Equal(t, Caller{KeyID: KeyIDOf("tml-alpha"), Addr: "192.0.2.7"}, got)
	require.NotContains(t, got.KeyID, "alpha")
	require.Len(t, got.KeyID, len("key-")+16)
}
