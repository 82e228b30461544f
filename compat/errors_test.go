package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// TestErrorTableIsTheOneTable: compat's statuses and failure categories are the table's
// (internal/errs), which the core's operationError and the gateway use too: for every code.
func TestErrorTableIsTheOneTable(t *testing.T) {
	for _, code := range errs.Codes() {
		e := errs.Lookup(code)
		a := classifyError(connect.NewError(code, errors.New("boom")))
		require.Equal(t, e.TinkerStatus, a.status, code.String())
		require.Equal(t, code.String(), a.body.Code)
		require.Equal(t, e.Reason, a.body.Reason)
		if e.Masked {
			require.Equal(t, "internal error, id "+a.id, a.body.Detail, code.String())
		} else {
			require.Equal(t, "boom", a.body.Detail, code.String())
			require.Empty(t, a.id)
		}
		require.Equal(t, e.Category.String(), failureCategory(&loopsv1.OperationError{Code: int32(code)}), code.String())
	}
	// The SDK retries 5xx for minutes: a route or feature Loops lacks is a 404.
	require.Equal(t, http.StatusNotFound, classifyError(connect.NewError(connect.CodeUnimplemented, errors.New("x"))).status)
	require.Equal(t, http.StatusRequestEntityTooLarge, classifyError(&http.MaxBytesError{Limit: 10}).status)
	require.Equal(t, errs.ReasonBodyTooLarge, classifyError(&http.MaxBytesError{Limit: 10}).body.Reason)
	require.Equal(t, errs.ReasonQueueFull,
		classifyError(errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, errors.New("full"))).body.Reason)
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestInternalErrorIsMaskedWithID: a core error with driver text reaches the Tinker client
// as "internal error, id <id>" with code and reason fields, and the log holds the full
// error under the same id.
func TestInternalErrorIsMaskedWithID(t *testing.T) {
	var logs syncBuffer
	e := newEnv(t, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	e.core.setErr("ListSessions", connect.NewError(connect.CodeInternal, errors.New("listing sessions: SQLITE_IOERR at /srv/loops/loops.db")))
	r := e.get("/api/v1/sessions")
	require.Equal(t, http.StatusInternalServerError, r.status)
	var body map[string]string
	require.NoError(t, json.Unmarshal(r.body, &body))
	m := regexp.MustCompile(`^internal error, id ([0-9a-f]{12})$`).FindStringSubmatch(body["detail"])
	require.NotNil(t, m, "detail %q", body["detail"])
	require.Equal(t, "internal", body["code"])
	require.Equal(t, "INTERNAL", body["reason"])
	require.NotContains(t, string(r.body), "SQLITE")
	require.Contains(t, logs.String(), "error_id="+m[1])
	require.Contains(t, logs.String(), "SQLITE_IOERR at /srv/loops/loops.db")

	// A feature the core lacks is a 404 (the SDK would retry a 501 for minutes).
	e.core.setErr("ListSessions", connect.NewError(connect.CodeUnimplemented, errors.New("not in this build")))
	r = e.get("/api/v1/sessions")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Contains(t, string(r.body), `"code":"unimplemented"`)
}

// TestClientGoneWritesNothing: an error for a request whose client hung up is logged as 499
// and nothing is written (no 5xx).
func TestClientGoneWritesNothing(t *testing.T) {
	var logs syncBuffer
	edge := ErrorSurface("compat", slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/api/v1/retrieve_future", nil)
	rec := httptest.NewRecorder()
	edge.WriteError(rec, req, connect.NewError(connect.CodeCanceled, context.Canceled))
	require.False(t, rec.Flushed)
	require.Empty(t, rec.Body.String())
	require.Empty(t, rec.Header())
	require.Contains(t, logs.String(), "status=499")
	require.NotContains(t, logs.String(), "level=ERROR")
}
