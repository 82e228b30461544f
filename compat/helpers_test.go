package compat

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type testEnv struct {
	t    *testing.T
	core *fakeCore
	srv  *httptest.Server
}

func newEnv(t *testing.T, opts ...func(*Options)) *testEnv {
	t.Helper()
	core := newFakeCore()
	o := Options{LongPoll: 50 * time.Millisecond, MaxBodyBytes: 1 << 20, MaxDecompressedBytes: 4 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", NewHandler(core.services(), o))
	srv := httptest.NewServer(mux) // listens on 127.0.0.1:0
	t.Cleanup(srv.Close)
	return &testEnv{t: t, core: core, srv: srv}
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

func (e *testEnv) do(method, path string, body []byte, headers map[string]string) resp {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	require.NoError(e.t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	// Redirects are answers under test here (the archive route), not something to follow.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noRedirect.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	if res.StatusCode >= 400 {
		// Every error has a JSON body with a detail and a Content-Length.
		require.NotEmpty(e.t, res.Header.Get("Content-Length"), "error without Content-Length")
		var eb errorBody
		require.NoError(e.t, json.Unmarshal(b, &eb), "error body %q", b)
		require.NotEmpty(e.t, eb.Detail)
		require.NotEmpty(e.t, eb.Code)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (e *testEnv) postJSON(path string, v any) resp {
	e.t.Helper()
	var b []byte
	if s, ok := v.(string); ok {
		b = []byte(s)
	} else {
		var err error
		b, err = json.Marshal(v)
		require.NoError(e.t, err)
	}
	return e.do(http.MethodPost, path, b, map[string]string{"Content-Type": "application/json"})
}

func (e *testEnv) get(path string) resp {
	e.t.Helper()
	return e.do(http.MethodGet, path, nil, nil)
}

func mustHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Golden encodings from the wire-protocol notes, §5.5.
const (
	goldenFBRequest = `0a0c736573733a747261696e3a3010011a640a100a0e0a0c01000000020000000300000012300a0d7461
726765745f746f6b656e73121f0a180200000000000000030000000000000004000000000000001802220103
121e0a077765696768747312130a0c000000000000803f0000803f1801220103220d63726f73735f656e74726f7079`
	goldenFBOutput = `0a0b41727261795265636f7264123f0a0b41727261795265636f7264122e0a086c6f6770726f627312220a0c
000000bf0000a0bf000000c0121000000000000000000c00000000000000180118011a130a086c6f73733a73
756d110000000000000a40`
	goldenSample = `0a16080112080b0000000c0000001a08cdccccbdcdcc4cbe120c0000c07f0000c0bf000080be`
)

type ctxAny = context.Context

func (e *testEnv) srvLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func httpRequest(method, path string) *http.Request { return httptest.NewRequest(method, path, nil) }
