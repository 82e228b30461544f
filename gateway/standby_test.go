package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/lease/pglease"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// killableListener is a listener whose kill closes it and every connection it accepted, as
// the death of the process would.
type killableListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *killableListener) kill() {
	_ = l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}

// member is one gateway of the pair.
type member struct {
	url   string
	ln    *killableListener
	st    *postgres.Store
	lease *pglease.Store
	lost  chan error
}

// kill cuts the gateway off from everything at once: its clients, its database and its
// lease (no release), as kill -9 does.
func (m *member) kill() {
	m.ln.kill()
	m.lease.Close()
	m.st.Close()
}

func startMember(t *testing.T, dbURL string, cks ckstore.Store, keys *auth.Keys) *member {
	t.Helper()
	return startMemberTTL(t, dbURL, cks, keys, 2*time.Second)
}

// startMemberTTL is startMember with the lease's TTL.
func startMemberTTL(t *testing.T, dbURL string, cks ckstore.Store, keys *auth.Keys, ttl time.Duration) *member {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	kl := &killableListener{Listener: ln}
	st, err := postgres.Open(t.Context(), dbURL, postgres.Options{})
	require.NoError(t, err)
	ls, err := pglease.Open(t.Context(), dbURL, 0)
	require.NoError(t, err)
	m := &member{url: "http://" + ln.Addr().String(), ln: kl, st: st, lease: ls, lost: make(chan error, 1)}
	srv, err := gateway.New(t.Context(), kl, gateway.Config{
		DataDir: t.TempDir(), Store: st, Keys: keys,
		Core: core.Options{CheckpointStore: cks, PageTokenKey: []byte("a key both gateways share 0123456789")},
		Lease: &gateway.LeaseConfig{Store: ls, Address: m.url, TTL: ttl, RetryEvery: 50 * time.Millisecond,
			OnLost: func(err error) { m.lost <- err }},
	})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
		ls.Close()
	})
	return m
}

type leaseHealth struct {
	Status string `json:"status"`
	Role   string `json:"role"`
	Lease  struct {
		Holder    string `json:"holder"`
		Leader    string `json:"leader"`
		Term      int64  `json:"term"`
		Takeovers int    `json:"takeovers"`
	} `json:"lease"`
}

func healthOf(t *testing.T, url string) leaseHealth {
	t.Helper()
	resp, err := http.Get(url + "/healthz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var h leaseHealth
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&h))
	return h
}

func metricsOf(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// TestStandbyForwardsAndTakesOver: two gateways on one PostgreSQL database and one
// checkpoint folder. The standby forwards every route to the leader; when the leader dies
// the standby answers 503 NO_LEADER (retryable) until the lease lapses, then takes over:
// finished operations and checkpoints are there, work in flight is failed with the
// failover message, and the run continues from its checkpoint.
func TestStandbyForwardsAndTakesOver(t *testing.T) {
	dbURL := pgtest.Start(t).NewSchema(t)
	cks, err := ckstore.Open(t.Context(), t.TempDir(), ckstore.Options{})
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA + "=ws-a"})
	require.NoError(t, err)

	a := startMember(t, dbURL, cks, keys)
	require.Eventually(t, func() bool { return healthOf(t, a.url).Role == "leader" }, 20*time.Second, 20*time.Millisecond)
	b := startMember(t, dbURL, cks, keys)
	require.Eventually(t, func() bool { return healthOf(t, b.url).Lease.Leader == a.url }, 20*time.Second, 20*time.Millisecond)
	hb := healthOf(t, b.url)
	require.Equal(t, "standby", hb.Role)
	require.Equal(t, "ok", hb.Status)
	require.Contains(t, metricsOf(t, b.url), "loops_lease_is_leader 0")
	ma := metricsOf(t, a.url)
	require.Contains(t, ma, "loops_lease_is_leader 1")
	require.Contains(t, ma, "loops_lease_term 1")
	require.Regexp(t, `loops_lease_age_seconds 0\.\d+|loops_lease_age_seconds [0-9.e-]+\n`, ma, "seconds since the last renewal")
	require.NotContains(t, ma, "loops_lease_age_seconds -1")

	// Training through the standby: every call is forwarded to the leader.
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, b.url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, b.url, withKey(keyA))
	checkpoints := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, b.url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			var err error
			op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
			require.NoError(t, err)
		}
		return op
	}
	succeeded := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		op = wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	run := succeeded(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true},
	}))).GetTrainingRun().GetId()
	in, tgt, w := tokens(16)
	datum := &loopsv1.Datum{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
	}}
	step := func(seq int64) (fb, opt *loopsv1.Operation) {
		fb = succeeded(must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: seq, Data: []*loopsv1.Datum{datum}, LossFn: "cross_entropy"})))
		opt = succeeded(must(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: seq + 1, Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}})))
		return fb, opt
	}
	_, opt := step(1)
	saved := succeeded(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 3, Name: "ck1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING})))
	path := saved.GetSaveWeights().GetPath()
	require.NotEmpty(t, path)
	// An operation the leader holds in flight when it dies (recorded pending).
	inflight := &loopsv1.Operation{Id: "op-inflight", Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD,
		State: loopsv1.OperationState_OPERATION_STATE_RUNNING, TrainingRunId: run, SeqId: 4, CreateTime: timestamppb.Now()}
	require.NoError(t, a.st.PutOperation(ctx, "ws-a", inflight))

	a.kill()
	// Until the lease lapses the standby cannot reach a leader: a retryable 503.
	req, err := http.NewRequest(http.MethodGet, b.url+"/v1/training_runs/"+run, nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", keyA)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if healthOf(t, b.url).Role == "standby" { // not taken over already (a slow machine)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(body))
		require.Equal(t, "true", resp.Header.Get("x-should-retry"))
		require.Contains(t, string(body), "NO_LEADER")
	}
	select {
	case err := <-a.lost: // the dead leader's fence fired (its renewals failed)
		require.Error(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the cut-off leader never stepped down")
	}
	require.Eventually(t, func() bool { return healthOf(t, b.url).Role == "leader" }, 20*time.Second, 20*time.Millisecond)
	hb = healthOf(t, b.url)
	require.Equal(t, 1, hb.Lease.Takeovers)
	require.Equal(t, b.url, hb.Lease.Leader)
	require.Contains(t, metricsOf(t, b.url), "loops_lease_takeovers_total 1")

	// What finished is there; what was in flight failed over.
	got := must(ops.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: opt.GetId()}))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
	got = must(ops.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: saved.GetId()}))
	require.Equal(t, path, got.GetSaveWeights().GetPath())
	got = must(ops.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: "op-inflight"}))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "the gateway failed over")
	list := must(checkpoints.ListCheckpoints(ctx, &loopsv1.ListCheckpointsRequest{TrainingRunId: run}))
	require.Len(t, list.GetCheckpoints(), 1)

	// The run continues from its checkpoint, as after a restart.
	info := must(training.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: run}))
	require.Equal(t, path, info.GetLastCheckpoint().GetTinkerPath())
	seq := max(info.GetLastSeqId(), 4) + 1
	succeeded(must(training.LoadWeights(ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, SeqId: seq, Path: path, WithOptimizer: true})))
	fb, _ := step(seq + 1)
	require.Contains(t, fb.GetForwardBackward().GetMetrics(), "loss:sum")
}

// TestStandbyRefusesForwardedRequests: a request a standby forwarded is never forwarded
// again (no loops between gateways that both think the other leads).
func TestStandbyRefusesForwardedRequests(t *testing.T) {
	dbURL := pgtest.Start(t).NewSchema(t)
	keys, err := auth.ParseKeys([]string{keyA + "=ws-a"})
	require.NoError(t, err)
	a := startMember(t, dbURL, nil, keys)
	require.Eventually(t, func() bool { return healthOf(t, a.url).Role == "leader" }, 20*time.Second, 20*time.Millisecond)
	b := startMember(t, dbURL, nil, keys)
	require.Eventually(t, func() bool { return healthOf(t, b.url).Lease.Leader == a.url }, 20*time.Second, 20*time.Millisecond)
	req, err := http.NewRequest(http.MethodGet, b.url+"/v1/training_runs", nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", keyA)
	req.Header.Set("X-Loops-Forwarded-By", "another-gateway")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.True(t, strings.Contains(string(body), "NO_LEADER"), string(body))
	// Unauthenticated requests are refused by the standby itself.
	resp, err = http.Get(b.url + "/v1/training_runs")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestFencedWriteEndsLeading: another gateway takes the lease over while the leader has
// not noticed (its clock says its lease holds: a pause, a frozen VM); the leader's next
// write is refused by the database (store.ErrFenced), nothing of it is committed, and the
// gateway stops leading at once (OnLost; /healthz says standby), without waiting for its
// next renewal.
func TestFencedWriteEndsLeading(t *testing.T) {
	dbURL := pgtest.Start(t).NewSchema(t)
	keys, err := auth.ParseKeys([]string{keyA + "=ws-a"})
	require.NoError(t, err)
	a := startMemberTTL(t, dbURL, nil, keys, time.Minute) // renews every 15 s: not during the test
	require.Eventually(t, func() bool { return healthOf(t, a.url).Role == "leader" }, 20*time.Second, 20*time.Millisecond)
	ctx := t.Context()
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, a.url, withKey(keyA))
	_, err = sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err, "the leader writes")

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `UPDATE `+postgres.LeaseTable+` SET holder = 'another-gateway', term = term + 1`)
	require.NoError(t, err)

	_, err = sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{Tags: []string{"after-takeover"}})
	require.Error(t, err, "a write after the takeover is refused")
	select {
	case err := <-a.lost:
		require.ErrorIs(t, err, store.ErrFenced)
	case <-time.After(10 * time.Second):
		t.Fatal("the fenced leader did not step down")
	}
	require.Equal(t, "standby", healthOf(t, a.url).Role)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM sessions`).Scan(&n))
	require.Equal(t, 1, n, "only the session written before the takeover is in the database")
}
