package gateway_test

import (
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/jobs"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestMain shares one PostgreSQL cluster (started by the first test that needs one) between
// the package's tests.
func TestMain(m *testing.M) {
	if os.Getenv("LOOPS_TEST_RELAY") == "1" { // a job's relay (jobs_test.go)
		os.Exit(jobs.RelayMain(os.Args[1:], os.Stderr))
	}
	os.Exit(pgtest.Main(m))
}

const pageKeyA, pageKeyB = "tml-page-key-a", "tml-page-key-b"

// startStoreServer starts a server on st with two keys, of workspaces ws-a and ws-b, and
// returns its URL.
func startStoreServer(t *testing.T, st store.Store) string {
	t.Helper()
	keys, err := auth.ParseKeys([]string{pageKeyA + "=ws-a", pageKeyB + "=ws-b"})
	require.NoError(t, err)
	return "http://" + startServerWith(t, func(c *gateway.Config) {
		c.Store = st
		c.Keys = keys
	})
}

func openSQLite(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "loops.db"))
	require.NoError(t, err)
	return st
}

func openPostgres(t *testing.T) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(t.Context(), pgtest.Start(t).NewSchema(t), postgres.Options{})
	require.NoError(t, err)
	return st
}

func TestKeysetPagingSQLite(t *testing.T) { testKeysetPaging(t, openSQLite(t)) }

func TestKeysetPagingPostgres(t *testing.T) { testKeysetPaging(t, openPostgres(t)) }

// testKeysetPaging pages by token through lists whose records share create_times (and, for
// checkpoints, ids across runs) and checks that every record comes exactly once, in order.
func testKeysetPaging(t *testing.T, st store.Store) {
	url := startStoreServer(t, st)
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	// Records i share create_time in groups of 4 and are written in random order.
	at := func(i int) *timestamppb.Timestamp { return timestamppb.New(base.Add(time.Duration(i/4) * time.Second)) }
	const n = 23

	var sessions, runs []string
	for _, i := range rng.Perm(n) {
		id := fmt.Sprintf("sess-%02d", i)
		require.NoError(t, st.PutSession(ctx, "ws-a", &loopsv1.Session{Id: id, CreateTime: at(i)}))
		sessions = append(sessions, id)
		rid := fmt.Sprintf("run-%02d", i)
		require.NoError(t, st.PutTrainingRun(ctx, "ws-a", &loopsv1.TrainingRun{Id: rid, BaseModel: "m", CreateTime: at(i)}))
		runs = append(runs, rid)
	}
	require.NoError(t, st.PutSession(ctx, "ws-b", &loopsv1.Session{Id: "sess-b", CreateTime: at(0)}))
	// Checkpoints: the same ids in three runs, all at a handful of times.
	type ck struct{ run, id string }
	var cks []ck
	for _, i := range rng.Perm(3 * 8) {
		c := ck{runs[i%3], fmt.Sprintf("weights/c%d", i/3)}
		require.NoError(t, st.PutCheckpoint(ctx, "ws-a", &loopsv1.Checkpoint{Id: c.id, TrainingRunId: c.run, CreateTime: at(i / 3 * 2)}))
		cks = append(cks, c)
	}
	// The expected orders: create_time, then (checkpoints) run, then id, all descending.
	sortDesc := func(ids []string, time func(string) int) {
		slices.SortFunc(ids, func(a, b string) int {
			if c := time(b) - time(a); c != 0 {
				return c
			}
			return strings.Compare(b, a)
		})
	}
	num := func(s string) int {
		var i int
		_, _ = fmt.Sscanf(s[len(s)-2:], "%d", &i)
		return i / 4
	}
	sortDesc(sessions, num)
	sortDesc(runs, num)
	ckTime := func(c ck) int {
		var i int
		_, _ = fmt.Sscanf(c.id, "weights/c%d", &i)
		return (i * 2) / 4
	}
	slices.SortFunc(cks, func(a, b ck) int {
		if c := ckTime(b) - ckTime(a); c != 0 {
			return c
		}
		if c := strings.Compare(b.run, a.run); c != 0 {
			return c
		}
		return strings.Compare(b.id, a.id)
	})
	var ckKeys []string
	for _, c := range cks {
		ckKeys = append(ckKeys, c.run+"/"+c.id)
	}

	sessionsA := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(pageKeyA))
	sessionsB := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, withKey(pageKeyB))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(pageKeyA))
	checkpoints := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(pageKeyA))

	for _, limit := range []int32{1, 4, 5, n, n + 1, 0} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			var got []string
			token, pages := "", 0
			for {
				res, err := sessionsA.ListSessions(ctx, &loopsv1.ListSessionsRequest{Limit: limit, PageToken: token})
				require.NoError(t, err)
				require.EqualValues(t, n, res.GetTotalCount())
				for _, s := range res.GetSessions() {
					got = append(got, s.GetId())
				}
				pages++
				if token = res.GetNextPageToken(); token == "" {
					break
				}
				require.Len(t, res.GetSessions(), int(limit))
				require.Less(t, pages, n+1, "paging does not end")
			}
			require.Equal(t, sessions, got)
			if limit > 0 {
				require.Equal(t, (n+int(limit)-1)/int(limit), pages, "no empty last page")
			}

			got, token = nil, ""
			for {
				res, err := training.ListTrainingRuns(ctx, &loopsv1.ListTrainingRunsRequest{Limit: limit, PageToken: token})
				require.NoError(t, err)
				for _, r := range res.GetTrainingRuns() {
					got = append(got, r.GetId())
				}
				if token = res.GetNextPageToken(); token == "" {
					break
				}
			}
			require.Equal(t, runs, got)

			got, token = nil, ""
			for {
				res, err := checkpoints.ListCheckpoints(ctx, &loopsv1.ListCheckpointsRequest{Limit: limit, PageToken: token})
				require.NoError(t, err)
				require.EqualValues(t, len(cks), res.GetTotalCount())
				for _, c := range res.GetCheckpoints() {
					got = append(got, c.GetTrainingRunId()+"/"+c.GetId())
				}
				if token = res.GetNextPageToken(); token == "" {
					break
				}
			}
			require.Equal(t, ckKeys, got)
		})
	}

	// One run's checkpoints page by token too.
	run := cks[0].run
	var got []string
	token := ""
	for {
		res, err := checkpoints.ListCheckpoints(ctx, &loopsv1.ListCheckpointsRequest{TrainingRunId: run, Limit: 3, PageToken: token})
		require.NoError(t, err)
		for _, c := range res.GetCheckpoints() {
			got = append(got, c.GetTrainingRunId()+"/"+c.GetId())
		}
		if token = res.GetNextPageToken(); token == "" {
			break
		}
	}
	want := slices.DeleteFunc(slices.Clone(ckKeys), func(k string) bool { return !strings.HasPrefix(k, run+"/") })
	require.Len(t, want, 8)
	require.Equal(t, want, got)

	// offset still works, alone and counted from a token.
	res, err := sessionsA.ListSessions(ctx, &loopsv1.ListSessionsRequest{Limit: 5, Offset: 5})
	require.NoError(t, err)
	require.Equal(t, sessions[5:10], ids(res.GetSessions()))
	first, err := sessionsA.ListSessions(ctx, &loopsv1.ListSessionsRequest{Limit: 5})
	require.NoError(t, err)
	res, err = sessionsA.ListSessions(ctx, &loopsv1.ListSessionsRequest{Limit: 5, Offset: 2, PageToken: first.GetNextPageToken()})
	require.NoError(t, err)
	require.Equal(t, sessions[7:12], ids(res.GetSessions()))

	// Over REST, page_token is a query parameter and next_page_token a field.
	body := restGet(t, url+"/v1/sessions?limit=5&page_token="+first.GetNextPageToken(), pageKeyA, http.StatusOK)
	require.Contains(t, body, `"`+sessions[5]+`"`)
	require.Contains(t, body, `"next_page_token"`)

	// Bad tokens are 400s that say what is wrong.
	tokB, err := sessionsB.ListSessions(ctx, &loopsv1.ListSessionsRequest{Limit: 1})
	require.NoError(t, err)
	require.Empty(t, tokB.GetNextPageToken(), "ws-b has one session")
	resB, err := sessionsA.ListSessions(ctx, &loopsv1.ListSessionsRequest{Limit: 1})
	require.NoError(t, err)
	tokA := resB.GetNextPageToken()
	raw, err := base64.RawURLEncoding.DecodeString(tokA)
	require.NoError(t, err)
	raw[len(raw)-20] ^= 0x10
	tampered := base64.RawURLEncoding.EncodeToString(raw)

	_, err = sessionsB.ListSessions(ctx, &loopsv1.ListSessionsRequest{PageToken: tokA})
	requireCode(t, err, connect.CodeInvalidArgument, "another workspace")
	_, err = sessionsA.ListSessions(ctx, &loopsv1.ListSessionsRequest{PageToken: tampered})
	requireCode(t, err, connect.CodeInvalidArgument, "signature")
	_, err = training.ListTrainingRuns(ctx, &loopsv1.ListTrainingRunsRequest{PageToken: tokA})
	requireCode(t, err, connect.CodeInvalidArgument, "issued for listing sessions, not training_runs")
	_, err = checkpoints.ListCheckpoints(ctx, &loopsv1.ListCheckpointsRequest{PageToken: "not a token"})
	requireCode(t, err, connect.CodeInvalidArgument, "base64url")
	body = restGet(t, url+"/v1/sessions?page_token="+tampered, pageKeyA, http.StatusBadRequest)
	require.Contains(t, body, "page_token")
	body = restGet(t, url+"/v1/sessions?page_token="+tokA, pageKeyB, http.StatusBadRequest)
	require.Contains(t, body, "another workspace")
}

func ids(ss []*loopsv1.Session) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.GetId())
	}
	return out
}

// restGet GETs u with key and checks the status; it returns the body.
func restGet(t *testing.T, u, key string, want int) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, want, res.StatusCode, "GET %s: %s", u, b)
	return string(b)
}
