package httpedge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/errs"
)

// NewTestLog is newTestLog, for this package's external tests.
var NewTestLog = newTestLog

// newTestLog returns a debug logger writing JSON lines to a file (the kernel orders
// concurrent writes), and a function that returns the records logged so far.
func newTestLog(t *testing.T) (*slog.Logger, func() []map[string]any) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "log.jsonl"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	lines := func() []map[string]any {
		b, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		var out []map[string]any
		for _, ln := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if ln == "" {
				continue
			}
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(ln), &m))
			out = append(out, m)
		}
		return out
	}
	return slog.New(slog.NewJSONHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug})), lines
}

// testBody is the test protocol's error body.
type testBody struct {
	Msg string `json:"msg"`
}

// testSurface answers every error {"msg": ...} with the one error table's status, masking
// internal errors, as the real protocols do.
func testSurface(log *slog.Logger) *Surface {
	return &Surface{Name: "test", Logger: log,
		Classify: func(err error) Answer {
			var te *timeoutError
			if errors.As(err, &te) {
				return Answer{Status: http.StatusRequestTimeout, Body: testBody{"too slow"}, Message: "too slow"}
			}
			out := errs.Edge(err)
			return Answer{Status: out.Entry.TinkerStatus, Body: testBody{out.Err.Message()}, ID: out.ID,
				Reason: errs.Reason(out.Err), Message: out.Err.Message()}
		},
		EncodeFailure: []byte(`{"msg":"cannot encode"}`)}
}

type timeoutError struct{}

func (*timeoutError) Error() string { return "the body did not arrive in time" }

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func TestHandleAnswersTheRouteError(t *testing.T) {
	log, lines := newTestLog(t)
	s := testSurface(log)
	mux := http.NewServeMux()
	s.Handle(mux, "GET /ok", func(w http.ResponseWriter, _ *http.Request) error {
		s.WriteJSON(w, http.StatusOK, map[string]int{"n": 1})
		return nil
	})
	s.Handle(mux, "GET /missing", func(http.ResponseWriter, *http.Request) error {
		return connect.NewError(connect.CodeNotFound, errors.New("no such run"))
	})
	s.Handle(mux, "GET /broken", func(http.ResponseWriter, *http.Request) error {
		return errors.New("disk on fire")
	})

	rec := serve(mux, httptest.NewRequest("GET", "/ok", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, `{"n":1}`, rec.Body.String())
	require.Equal(t, "7", rec.Header().Get("Content-Length"))
	require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))

	rec = serve(mux, httptest.NewRequest("GET", "/missing", nil))
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{"msg":"no such run"}`, rec.Body.String())

	rec = serve(mux, httptest.NewRequest("GET", "/broken", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	var body testBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Regexp(t, `^internal error, id [0-9a-f]{12}$`, body.Msg, "an internal error is masked")
	id := strings.TrimPrefix(body.Msg, "internal error, id ")

	got := lines()
	require.Len(t, got, 2)
	require.Equal(t, "DEBUG", got[0]["level"], "a refusal is logged at debug")
	require.Equal(t, "test: request rejected", got[0]["msg"])
	require.Equal(t, "no such run", got[0]["message"])
	require.Equal(t, "NOT_FOUND", got[0]["reason"])
	require.Equal(t, "ERROR", got[1]["level"])
	require.Equal(t, "test: request failed", got[1]["msg"])
	require.Equal(t, id, got[1]["error_id"], "the masked error is logged in full under the id the client sees")
	require.Equal(t, "disk on fire", got[1]["err"])
}

func TestWriteErrorLogsByCategory(t *testing.T) {
	for _, tc := range []struct {
		err   error
		level string
	}{
		{connect.NewError(connect.CodeInvalidArgument, errors.New("bad")), "DEBUG"},
		{connect.NewError(connect.CodeUnavailable, errors.New("draining")), "DEBUG"},
		{connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow")), "ERROR"},
		{errs.Incident("abc", "internal error, id abc"), "ERROR"},
	} {
		log, lines := newTestLog(t)
		s := testSurface(log)
		s.WriteError(httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil), tc.err)
		got := lines()
		require.Len(t, got, 1)
		require.Equal(t, tc.level, got[0]["level"], "%v", tc.err)
	}
}

func TestWriteErrorSendsRetryAfterOnA429(t *testing.T) {
	s := testSurface(slog.New(slog.DiscardHandler))
	err := errs.Limit(connect.CodeResourceExhausted, errs.ReasonRateLimited, "requests per key", 3*time.Second, errors.New("too many"))
	rec := httptest.NewRecorder()
	s.WriteError(rec, httptest.NewRequest("GET", "/x", nil), err)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "3", rec.Header().Get(errs.HeaderRetryAfter))

	rec = httptest.NewRecorder()
	s.Reply(rec, err)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "3", rec.Header().Get(errs.HeaderRetryAfter), "Reply sends it too")
}

// TestClientGone: the answer for a client that went away goes nowhere: nothing is written
// and it is logged as 499, but for a 408 (a body past the read deadline cancels the
// context, and that client is still there).
func TestClientGone(t *testing.T) {
	log, lines := newTestLog(t)
	s := testSurface(log)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req := httptest.NewRequestWithContext(ctx, "POST", "/x", nil)

	rec := httptest.NewRecorder()
	s.WriteError(rec, req, errors.New("backend call cancelled"))
	require.Empty(t, rec.Body.String())
	require.Empty(t, rec.Header())
	got := lines()
	require.Len(t, got, 1)
	require.Equal(t, "INFO", got[0]["level"])
	require.Equal(t, "test: client closed request", got[0]["msg"])
	require.EqualValues(t, errs.StatusClientClosedRequest, got[0]["status"])

	rec = httptest.NewRecorder()
	s.WriteError(rec, req, fmt.Errorf("reading: %w", &timeoutError{}))
	require.Equal(t, http.StatusRequestTimeout, rec.Code)
	require.JSONEq(t, `{"msg":"too slow"}`, rec.Body.String())
}

// TestRecoverAnswersAPanic: a panic is answered as an internal error through Classify, and
// logged once, with its stack, under the id the client sees.
func TestRecoverAnswersAPanic(t *testing.T) {
	log, lines := newTestLog(t)
	s := testSurface(log)
	h := s.Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panicInHandler() }))
	rec := serve(h, httptest.NewRequest("POST", "/x", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body testBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Regexp(t, `^internal error, id [0-9a-f]{12}$`, body.Msg)

	got := lines()
	require.Len(t, got, 1, "one log line per panic")
	require.Equal(t, "ERROR", got[0]["level"])
	require.Equal(t, "test: panic serving request", got[0]["msg"])
	require.Equal(t, strings.TrimPrefix(body.Msg, "internal error, id "), got[0]["error_id"])
	require.Equal(t, "boom", got[0]["panic"])
	require.Contains(t, got[0]["stack"], "panicInHandler", "the stack names the panicking function")
	require.Equal(t, false, got[0]["response_started"])
}

func panicInHandler() { panic("boom") }

// TestRecoverPassesErrAbortHandler: http.ErrAbortHandler (or an error wrapping it) is how a
// handler cuts its response short on purpose: it is neither answered nor logged.
func TestRecoverPassesErrAbortHandler(t *testing.T) {
	for _, v := range []any{http.ErrAbortHandler, fmt.Errorf("download: %w", http.ErrAbortHandler)} {
		log, lines := newTestLog(t)
		s := testSurface(log)
		h := s.Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(v) }))
		rec := httptest.NewRecorder()
		require.PanicsWithValue(t, http.ErrAbortHandler, func() { h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil)) })
		require.Empty(t, rec.Body.String())
		require.Empty(t, lines())
	}
}

// TestRecoverCutsAStartedResponse: once the status or bytes have gone out, an error body
// would corrupt the response: the panic is logged and the response cut short instead.
func TestRecoverCutsAStartedResponse(t *testing.T) {
	for name, start := range map[string]func(http.ResponseWriter){
		"write":       func(w http.ResponseWriter) { _, _ = io.WriteString(w, "data: {}\n\n") },
		"writeHeader": func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) },
		"flush":       func(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() },
		"readFrom":    func(w http.ResponseWriter) { _, _ = io.Copy(w, strings.NewReader("chunk")) },
	} {
		t.Run(name, func(t *testing.T) {
			log, lines := newTestLog(t)
			s := testSurface(log)
			h := s.Recover(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				start(w)
				panic("late")
			}))
			rec := httptest.NewRecorder()
			require.PanicsWithValue(t, http.ErrAbortHandler, func() { h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil)) })
			require.NotContains(t, rec.Body.String(), "internal error")
			got := lines()
			require.Len(t, got, 1)
			require.Equal(t, true, got[0]["response_started"])
			require.Equal(t, "late", got[0]["panic"])
		})
	}

	// Over a real connection: the client sees a failed response, not a corrupted one.
	s := testSurface(slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(s.Recover(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, "partial")
		_ = http.NewResponseController(w).Flush()
		panic("late")
	})))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, "partial", string(b))
}

// TestRecoverInformationalIsNotStarted: a 1xx status leaves the final answer to come.
func TestRecoverInformationalIsNotStarted(t *testing.T) {
	s := testSurface(slog.New(slog.DiscardHandler))
	h := s.Recover(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		panic("after hints")
	}))
	rec := serve(h, httptest.NewRequest("GET", "/x", nil))
	require.Contains(t, rec.Body.String(), "internal error, id ")
}

// TestRecoverClientGone: a panic while the client is gone writes nothing; it is still
// logged with its stack.
func TestRecoverClientGone(t *testing.T) {
	log, lines := newTestLog(t)
	s := testSurface(log)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	h := s.Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := serve(h, httptest.NewRequestWithContext(ctx, "GET", "/x", nil))
	require.Empty(t, rec.Body.String())
	got := lines()
	require.Len(t, got, 2)
	require.Equal(t, "test: panic serving request", got[0]["msg"])
	require.NotEmpty(t, got[0]["stack"])
	require.EqualValues(t, errs.StatusClientClosedRequest, got[1]["status"])
}

// TestRecoverKeepsTheWriterFeatures: handlers behind Recover still flush (connect-go
// requires an http.Flusher for streams), reach deadlines through http.ResponseController,
// and copy with the connection's ReadFrom.
func TestRecoverKeepsTheWriterFeatures(t *testing.T) {
	s := testSurface(slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(s.Recover(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, ok := w.(http.Flusher)
		require.True(t, ok)
		_, ok = w.(io.ReaderFrom)
		require.True(t, ok)
		rc := http.NewResponseController(w)
		require.NoError(t, rc.SetWriteDeadline(time.Now().Add(time.Minute)))
		_, _ = io.WriteString(w, "one ")
		require.NoError(t, rc.Flush())
		_, _ = io.Copy(w, strings.NewReader("two"))
	})))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "one two", string(b))
}

func TestWriteJSONThatCannotBeEncoded(t *testing.T) {
	log, lines := newTestLog(t)
	s := testSurface(log)
	rec := httptest.NewRecorder()
	s.WriteJSON(rec, http.StatusOK, map[string]any{"f": func() {}})
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.JSONEq(t, `{"msg":"cannot encode"}`, rec.Body.String())
	require.Len(t, lines(), 1)
}

func TestPublic(t *testing.T) {
	out, msg := Public(errors.New("the encoder broke"))
	require.Equal(t, connect.CodeInternal, out.Err.Code(), "a surface's own failure is internal")
	require.NotEmpty(t, out.ID)
	require.Equal(t, "internal error, id "+out.ID, msg)

	out, msg = Public(connect.NewError(connect.CodeNotFound, nil))
	require.Empty(t, out.ID)
	require.Equal(t, "not_found", msg, "an error without a message says its code")
	require.Equal(t, http.StatusNotFound, out.Entry.TinkerStatus)

	out, msg = Public(fmt.Errorf("wrapped: %w", errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, errors.New("queue full"))))
	require.Equal(t, "queue full", msg)
	require.Equal(t, errs.ReasonQueueFull, errs.Reason(out.Err))
}
