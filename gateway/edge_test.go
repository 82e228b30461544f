package gateway_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	_ "modernc.org/sqlite"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// logBuffer is a log sink safe for the server's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var maskedRE = regexp.MustCompile(`^internal error, id ([0-9a-f]{12})$`)

// TestInternalErrorsAreMaskedOnEverySurface breaks the store under a running server (its
// sessions table vanishes): ListSessions fails with the driver's text, which no surface
// shows; each answers "internal error, id <id>" and the log holds the full error under the
// same id. Errors carry an ErrorInfo reason on loops.v1 and a reason field on Tinker's.
func TestInternalErrorsAreMaskedOnEverySurface(t *testing.T) {
	var logs logBuffer
	dir := t.TempDir()
	addr := startServerWith(t, func(c *gateway.Config) {
		c.DataDir = dir
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	url := "http://" + addr
	ctx := t.Context()

	// A user error carries its reason too.
	runs := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	_, err := runs.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: "run-nope"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	require.Equal(t, "NOT_FOUND", connectReason(t, err).GetReason())

	db, err := sql.Open("sqlite", filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `ALTER TABLE sessions RENAME TO sessions_gone`)
	require.NoError(t, err)

	loggedUnder := func(id string) {
		t.Helper()
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "error_id="+id) && strings.Contains(line, "no such table") {
				return
			}
		}
		t.Fatalf("no log line holds error_id=%s and the driver's text:\n%s", id, logs.String())
	}

	// Connect.
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA))
	_, err = sessions.ListSessions(ctx, &loopsv1.ListSessionsRequest{})
	require.Equal(t, connect.CodeInternal, connect.CodeOf(err))
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	m := maskedRE.FindStringSubmatch(ce.Message())
	require.NotNil(t, m, "Connect message %q", ce.Message())
	info := connectReason(t, err)
	require.Equal(t, "INTERNAL", info.GetReason())
	require.Equal(t, "loops.dev", info.GetDomain())
	require.Equal(t, m[1], info.GetMetadata()["error_id"])
	loggedUnder(m[1])

	// gRPC.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	_, err = loopsv1.NewSessionServiceClient(conn).ListSessions(metadata.AppendToOutgoingContext(ctx, "x-api-key", keyA), &loopsv1.ListSessionsRequest{})
	st := status.Convert(err)
	require.Equal(t, codes.Internal, st.Code())
	m = maskedRE.FindStringSubmatch(st.Message())
	require.NotNil(t, m, "gRPC message %q", st.Message())
	var reasons []string
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			reasons = append(reasons, ei.GetReason())
		}
	}
	require.Equal(t, []string{"INTERNAL"}, reasons)
	loggedUnder(m[1])

	// REST (grpc-gateway).
	code, body := getJSON(t, url+"/v1/sessions")
	require.Equal(t, http.StatusInternalServerError, code)
	m = maskedRE.FindStringSubmatch(body["message"].(string))
	require.NotNil(t, m, "REST body %v", body)
	require.Contains(t, mustJSON(t, body), `"reason":"INTERNAL"`)
	loggedUnder(m[1])

	// Tinker.
	code, body = getJSON(t, url+"/api/v1/sessions")
	require.Equal(t, http.StatusInternalServerError, code)
	m = maskedRE.FindStringSubmatch(body["detail"].(string))
	require.NotNil(t, m, "Tinker body %v", body)
	require.Equal(t, "internal", body["code"])
	require.Equal(t, "INTERNAL", body["reason"])
	loggedUnder(m[1])
}

func connectReason(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	for _, d := range ce.Details() {
		v, derr := d.Value()
		require.NoError(t, derr)
		if info, ok := v.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
	return nil
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", keyA)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "body %s", b)
	return res.StatusCode, m
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// holdCreate makes the "edge-hold" backend's CreateAdapter wait until it is closed (or the
// call's context ends), so a run's create stays pending.
// Each test that uses it makes a new one before starting its server.
var holdCreate chan struct{}

func init() {
	backends.Register("edge-hold", func(ctx context.Context, cfg backends.Config) (backends.Backend, error) {
		be, err := backends.Open(ctx, "reference", cfg)
		if err != nil {
			return nil, err
		}
		return holdBackend{be, holdCreate}, nil
	})
}

type holdBackend struct {
	backends.Backend
	hold chan struct{}
}

func (h holdBackend) Trainer() backends.Trainer { return holdTrainer{h.Backend.Trainer(), h.hold} }

type holdTrainer struct {
	backends.Trainer
	hold chan struct{}
}

func (h holdTrainer) CreateAdapter(ctx context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	select {
	case <-h.hold:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.Trainer.CreateAdapter(ctx, req)
}

// TestClientGoneIs499: a client that hangs up (a Connect long-poll it cancels, a Tinker body
// it abandons) is logged and counted as 499, never as a 5xx.
func TestClientGoneIs499(t *testing.T) {
	var logs logBuffer
	hold := make(chan struct{})
	holdCreate = hold
	addr := startServerWith(t, func(c *gateway.Config) {
		c.Backend = "edge-hold"
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	t.Cleanup(func() { close(hold) }) // before the server closes
	url := "http://" + addr
	ctx := t.Context()

	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	op, err := training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true},
	})
	require.NoError(t, err)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = ops.WaitOperation(wctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(20 * time.Second)})
	require.Error(t, err)

	// Headers and part of a body, then the client hangs up.
	require.NoError(t, stallBody(t, addr, keyA).Close())

	require.Eventually(t, func() bool {
		m := metrics(t, url)
		return strings.Contains(m, `loops_requests_total{status="499",surface="connect"} 1`) &&
			strings.Contains(m, `loops_requests_total{status="499",surface="tinker"} 1`)
	}, 5*time.Second, 20*time.Millisecond, "metrics:\n%s", metrics(t, url))
	require.NotRegexp(t, `loops_requests_total\{status="5`, metrics(t, url))
	require.Contains(t, logs.String(), "status=499")
	require.NotContains(t, logs.String(), "level=ERROR")
}

func metrics(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return string(b)
}
