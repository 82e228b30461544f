package auth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoopbackHost(t *testing.T) {
	for _, h := range []string{"localhost", "localhost:1234", "LocalHost", "localhost.", "127.0.0.1", "127.0.0.1:8000",
		"127.3.2.1:9", "[::1]", "[::1]:8000", "::1", ""} {
		require.True(t, loopbackHost(h), h)
	}
	for _, h := range []string{"evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io",
		"10.0.0.1", "[::2]:80", "0.0.0.0", "192.168.1.2:8000", "[fe80::1%25eth0]"} {
		require.False(t, loopbackHost(h), h)
	}
}

// TestOpenModeAnswersLoopbackHostsOnly: with no keys a request addressed to another name (as
// a DNS-rebinding page sends it) is refused with a 403 that says why and how to fix it,
// public paths included; with keys any Host is fine.
func TestOpenModeAnswersLoopbackHostsOnly(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	open := (&Keys{}).Middleware(Policy{Public: []string{"/healthz"}}, ok)
	do := func(h http.Handler, host, path string, header map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Host = host
		r.Header.Set(HeaderName, "tml-anything")
		for k, v := range header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, path := range []string{"/api/v1/get_server_capabilities", "/healthz"} {
		w := do(open, "evil.example", path, nil)
		require.Equal(t, http.StatusForbidden, w.Code, path)
		require.Equal(t, "application/json", w.Header().Get("Content-Type"))
		var body map[string]string
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
		require.Equal(t, "permission_denied", body["code"])
		require.Contains(t, body["detail"], `Host "evil.example" is not a loopback name`)
		require.Contains(t, body["detail"], "DNS rebinding")
		require.Contains(t, body["detail"], "--api-key")
	}
	require.Equal(t, http.StatusOK, do(open, "localhost:1234", "/api/v1/get_server_capabilities", nil).Code)
	require.Equal(t, http.StatusOK, do(open, "127.0.0.1:8000", "/healthz", nil).Code)
	// gRPC clients read the refusal from the status headers.
	w := do(open, "evil.example:8000", "/loops.v1.ModelService/ListModels", map[string]string{"Content-Type": "application/grpc"})
	require.Equal(t, "7", w.Header().Get("Grpc-Status"))
	require.Contains(t, w.Header().Get("Grpc-Message"), "DNS rebinding")

	keys, err := ParseKeys([]string{"tml-anything"})
	require.NoError(t, err)
	keyed := keys.Middleware(Policy{}, ok)
	require.Equal(t, http.StatusOK, do(keyed, "evil.example", "/x", nil).Code)
}

// TestRequestsPerKeyAreCapped: a key with the cap's number of requests in flight gets a 429
// that says why; other keys are unaffected; the count goes when the requests finish.
func TestRequestsPerKeyAreCapped(t *testing.T) {
	keys, err := ParseKeys([]string{"tml-a", "tml-b"})
	require.NoError(t, err)
	entered, unblock := make(chan struct{}), make(chan struct{})
	h, inflight := keys.middleware(Policy{MaxRequestsPerKey: 2}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			entered <- struct{}{}
			<-unblock
		}
		w.WriteHeader(http.StatusOK)
	}))
	do := func(key, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Header.Set(HeaderName, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { do("tml-a", "/block") })
		<-entered
	}
	w := do("tml-a", "/x")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	var body map[string]string
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	require.Equal(t, "resource_exhausted", body["code"])
	require.Contains(t, body["detail"], "already has 2 requests in flight")
	require.Equal(t, "RATE_LIMITED", body["reason"])
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	require.Equal(t, http.StatusOK, do("tml-b", "/x").Code)
	require.Equal(t, 1, inflight.keys())

	close(unblock)
	wg.Wait()
	require.Equal(t, http.StatusOK, do("tml-a", "/x").Code)
	require.Zero(t, inflight.keys(), "a key without requests in flight keeps no entry")

	// A negative cap means none.
	h, _ = keys.middleware(Policy{MaxRequestsPerKey: -1}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	require.Equal(t, http.StatusOK, do("tml-a", "/x").Code)
}
