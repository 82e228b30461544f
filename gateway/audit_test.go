package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/audit"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// auditEvents lists the workspace's events with one action, through Connect.
func auditEvents(t *testing.T, url, key, action string) []*loopsv1.AuditEvent {
	t.Helper()
	res, err := loopsv1connect.NewAuditServiceClient(http.DefaultClient, url, withKey(key)).
		ListAuditEvents(t.Context(), &loopsv1.ListAuditEventsRequest{Action: action, PageSize: 1000})
	require.NoError(t, err)
	return res.GetEvents()
}

func post(t *testing.T, url, path, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAuditEverySurface: a session created over REST, gRPC, Connect and Tinker is recorded
// once each, with the surface, the key's id, the client's address and the session's id; a
// REST request is recorded as REST (its gRPC relay is not recorded again), and a gRPC
// client cannot pass for the relay; a REST write refused before any handler is recorded
// too; another workspace sees none of it.
func TestAuditEverySurface(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()

	code, body := post(t, url, "/v1/sessions", keyA, `{"sdk_version":"rest"}`)
	require.Equal(t, http.StatusOK, code, body)
	code, body = post(t, url, "/api/v1/create_session", keyA, `{"tags":[],"user_metadata":{},"sdk_version":"0.38.0","type":"create_session"}`)
	require.Equal(t, http.StatusOK, code, body)
	cs, err := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA)).CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)

	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	// A forged relay header is ignored: the call is gRPC from its own address.
	gctx := metadata.AppendToOutgoingContext(ctx, "x-api-key", keyA, "x-loops-audit-relay", "forged 203.0.113.9")
	gs, err := loopsv1.NewSessionServiceClient(conn).CreateSession(gctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)

	evs := auditEvents(t, url, keyA, "session_create")
	require.Len(t, evs, 4)
	bySurface := map[string]*loopsv1.AuditEvent{}
	for _, e := range evs {
		require.Equal(t, auth.KeyIDOf(keyA), e.GetKeyId())
		require.Equal(t, "127.0.0.1", e.GetClientAddr())
		require.Equal(t, "ok", e.GetCode())
		require.EqualValues(t, http.StatusOK, e.GetHttpStatus())
		require.Equal(t, "session", e.GetResource())
		bySurface[e.GetSurface()] = e
	}
	require.Len(t, bySurface, 4, "one event per surface: %v", evs)
	require.Equal(t, "/loops.v1.SessionService/CreateSession", bySurface["rest"].GetAction())
	require.Equal(t, "POST /api/v1/create_session", bySurface["tinker"].GetAction())
	require.Equal(t, cs.GetId(), bySurface["connect"].GetTarget())
	require.Equal(t, gs.GetId(), bySurface["grpc"].GetTarget())
	require.NotEmpty(t, bySurface["rest"].GetTarget())
	require.NotEmpty(t, bySurface["tinker"].GetTarget())

	// Reads are not recorded; a malformed REST write is, with its 400.
	_, err = loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA)).ListSessions(ctx, &loopsv1.ListSessionsRequest{})
	require.NoError(t, err)
	code, _ = post(t, url, "/v1/sessions", keyA, `{not json`)
	require.Equal(t, http.StatusBadRequest, code)
	all := auditEvents(t, url, keyA, "")
	require.Len(t, all, 5, "4 creates and the malformed write: %v", all)
	require.Equal(t, "unclassified_call", all[0].GetEvent(), "newest first")
	require.Equal(t, "POST /v1/sessions", all[0].GetAction())
	require.EqualValues(t, http.StatusBadRequest, all[0].GetHttpStatus())
	require.Equal(t, "rest", all[0].GetSurface())

	// Workspace B sees nothing of A's.
	require.Empty(t, auditEvents(t, url, keyB, ""))
}

// TestAuditPaging: pages of ListAuditEvents cover the log once, newest first; a token is
// bound to its workspace.
func TestAuditPaging(t *testing.T) {
	url := startServer(t)
	ctx := t.Context()
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA))
	for range 5 {
		_, err := sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{})
		require.NoError(t, err)
	}
	client := loopsv1connect.NewAuditServiceClient(http.DefaultClient, url, withKey(keyA))
	var seqs []int64
	req := &loopsv1.ListAuditEventsRequest{PageSize: 2}
	var token string
	for {
		res, err := client.ListAuditEvents(ctx, req)
		require.NoError(t, err)
		for _, e := range res.GetEvents() {
			seqs = append(seqs, e.GetSeq())
		}
		if res.GetNextPageToken() == "" {
			break
		}
		token = res.GetNextPageToken()
		req.PageToken = token
	}
	require.Len(t, seqs, 5)
	for i := 1; i < len(seqs); i++ {
		require.Less(t, seqs[i], seqs[i-1])
	}
	_, err := loopsv1connect.NewAuditServiceClient(http.DefaultClient, url, withKey(keyB)).
		ListAuditEvents(ctx, &loopsv1.ListAuditEventsRequest{PageToken: token})
	require.Error(t, err, "another workspace's token is refused")
}

// stuckAudit is a store whose audit appends wait until release closes (a database that
// has stopped answering).
type stuckAudit struct {
	store.Store
	release chan struct{}
}

func (s stuckAudit) AppendAuditEvents(ctx context.Context, evs []store.OwnedAuditEvent) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.AppendAuditEvents(ctx, evs)
}

// TestAuditFullRefusesMutations: while the database does not take audit events, a full
// buffer refuses mutating calls with 429 AUDIT_LOG_FULL (they are not run), reads go on,
// and once the database answers every admitted event is written.
func TestAuditFullRefusesMutations(t *testing.T) {
	dataDir := t.TempDir()
	sq, err := sqlite.Open(t.Context(), dataDir+"/loops.db")
	require.NoError(t, err)
	release := make(chan struct{})
	url := "http://" + startServerWith(t, func(c *gateway.Config) {
		c.DataDir = dataDir
		c.Store = stuckAudit{Store: sq, release: release}
		c.Audit = audit.Options{Buffer: 1, AdmitWait: 10 * time.Millisecond, FlushEvery: time.Millisecond}
	})
	ctx := t.Context()
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(keyA))
	first, err := sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err, "the first event takes the buffer's one slot")

	_, err = sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "audit log")
	code, body := post(t, url, "/api/v1/create_session", keyA, `{"tags":[],"user_metadata":{},"sdk_version":"0.38.0","type":"create_session"}`)
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, "AUDIT_LOG_FULL")

	list, err := sessions.ListSessions(ctx, &loopsv1.ListSessionsRequest{})
	require.NoError(t, err, "reads are not held up")
	require.Len(t, list.GetSessions(), 1, "the refused creates did not run")

	close(release)
	evs := auditEvents(t, url, keyA, "session_create")
	require.Len(t, evs, 1)
	require.Equal(t, first.GetId(), evs[0].GetTarget())
}
