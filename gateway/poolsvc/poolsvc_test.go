package poolsvc_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/poolsvc"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// goWorkerEnv, set to 1, makes the test binary the Go worker (serve.Main): the pool's
// worker_command is the test binary itself.
const goWorkerEnv = "LOOPS_TEST_GO_WORKER"

func init() {
	if os.Getenv(goWorkerEnv) == "1" {
		os.Exit(serve.Main(os.Args[1:]))
	}
}

const (
	wsKey = "tml-pools-workspace"
	opKey = "tml-pools-operator"
)

// startGateway runs a gateway with cfg on a loopback port until the test ends.
func startGateway(t *testing.T, cfg gateway.Config) string {
	t.Helper()
	_, url := startServer(t, cfg)
	return url
}

// startServer is startGateway that also returns the server.
func startServer(t *testing.T, cfg gateway.Config) (*gateway.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return srv, "http://" + ln.Addr().String()
}

// poolGateway runs a gateway whose torch backend runs a local pool of two Go worker
// processes (this test binary) serving loops/tiny, with a workspace key and an operator key.
func poolGateway(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv(goWorkerEnv, "1") // the workers inherit it; this process is past init
	t.Setenv("HF_HUB_CACHE", filepath.Join(dir, "hub"))
	t.Setenv(serve.LogLevelEnv, "WARN")
	keys, err := auth.ParseKeys([]string{wsKey})
	require.NoError(t, err)
	require.NoError(t, keys.AddOperatorKeys([]string{opKey}))
	return startGateway(t, gateway.Config{DataDir: dir, Backend: worker.Name, Keys: keys,
		BackendConfig: backendsConfig(dir, map[string]string{"provider": "local", "replicas": "2"})})
}

func backendsConfig(dir string, opts map[string]string) backends.Config {
	opts["worker_command"] = os.Args[0]
	opts["args"] = "--data-dir " + dir + " --threads 1"
	opts["health_interval"] = "200ms"
	opts["start_timeout"] = "60s"
	return backends.Config{Models: []string{tiny.Name}, Options: opts}
}

func keyed(key string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(auth.HeaderName, key)
			return next(ctx, req)
		}
	}))
}

// attached lists the pool's allocations once every one of want replicas is attached.
func attached(t *testing.T, cl loopsv1connect.PoolServiceClient, pool string, want int) []*loopsv1.Allocation {
	t.Helper()
	var got []*loopsv1.Allocation
	require.Eventually(t, func() bool {
		resp, err := cl.ListAllocations(t.Context(), &loopsv1.ListAllocationsRequest{PoolId: pool})
		require.NoError(t, err)
		got = resp.GetAllocations()
		if len(got) != want {
			return false
		}
		for _, a := range got {
			if a.GetState() != loopsv1.AllocationState_ALLOCATION_STATE_ATTACHED {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "%d attached replicas of %s; last seen %v", want, pool, got)
	return got
}

func restCall(t *testing.T, method, url, key, body string, header ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(auth.HeaderName, key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, out
}

// TestPoolService drives PoolService against a local pool of two Go worker processes, over
// Connect, gRPC and REST: list and get; the allocations show the adapter of a created run on
// the replica that holds it; scale 2→1→2; bad input is a 4xx that says what is wrong;
// non-operators are refused; an operator key is no workspace key; delete.
func TestPoolService(t *testing.T) {
	url := poolGateway(t)
	ctx := t.Context()
	op := loopsv1connect.NewPoolServiceClient(http.DefaultClient, url, keyed(opKey))
	pool := worker.PoolID(tiny.Name)
	attached(t, op, pool, 2)

	// list and get
	list, err := op.ListPools(ctx, &loopsv1.ListPoolsRequest{})
	require.NoError(t, err)
	want := &loopsv1.Pool{Id: pool, Role: loopsv1.PoolRole_POOL_ROLE_TRAINER, BaseModel: tiny.Name, Provider: "local",
		DesiredReplicas: 2, RegisteredReplicas: 2}
	ignoreSeconds := protocmp.IgnoreFields(&loopsv1.Pool{}, "replica_seconds")
	require.Empty(t, cmpDiff(&loopsv1.ListPoolsResponse{Pools: []*loopsv1.Pool{want}}, list, ignoreSeconds))
	require.Positive(t, list.GetPools()[0].GetReplicaSeconds())
	require.Zero(t, list.GetPools()[0].GetGpuSeconds(), "a CPU pool holds no GPU-seconds")
	got, err := op.GetPool(ctx, &loopsv1.GetPoolRequest{Id: pool})
	require.NoError(t, err)
	require.Empty(t, cmpDiff(want, got, ignoreSeconds))

	// a run's adapter shows on the replica that holds it
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, keyed(wsKey))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, keyed(wsKey))
	created, err := training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.NoError(t, err)
	done, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: created.GetId(), Timeout: durationpb.New(60 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	run := done.GetTrainingRunId()
	allocs := attached(t, op, pool, 2)
	holders := slices.DeleteFunc(slices.Clone(allocs), func(a *loopsv1.Allocation) bool { return a.GetAdapterCount() == 0 })
	require.Len(t, holders, 1, "one replica holds the run's adapter: %v", allocs)
	h := holders[0]
	require.Empty(t, cmpDiff(&loopsv1.Allocation{PoolId: pool, Role: loopsv1.PoolRole_POOL_ROLE_TRAINER, BaseModel: tiny.Name,
		Replica: h.GetReplica(), State: loopsv1.AllocationState_ALLOCATION_STATE_ATTACHED, AdapterCount: 1, TrainingRunIds: []string{run}}, h,
		protocmp.IgnoreFields(&loopsv1.Allocation{}, "address", "incarnation", "since", "replica_seconds")))
	require.NotEmpty(t, h.GetAddress())
	require.NotEmpty(t, h.GetIncarnation())
	require.NotNil(t, h.GetSince())

	// refusals: non-operators, an operator key where a workspace is needed, bad input
	ws := loopsv1connect.NewPoolServiceClient(http.DefaultClient, url, keyed(wsKey))
	_, err = ws.ListPools(ctx, &loopsv1.ListPoolsRequest{})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.ErrorContains(t, err, "operator key")
	require.ErrorContains(t, err, "--operator-key")
	require.Equal(t, errs.ReasonOperatorRequired, errs.Reason(err))
	_, err = loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, keyed(opKey)).ListTrainingRuns(ctx, &loopsv1.ListTrainingRunsRequest{})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "an operator key has no workspace")
	require.ErrorContains(t, err, "not a workspace API key")
	n := func(v int32) *int32 { return &v }
	for _, bad := range []struct {
		req  *loopsv1.ScalePoolRequest
		code connect.Code
		msg  string
	}{
		{&loopsv1.ScalePoolRequest{Id: pool}, connect.CodeInvalidArgument, "replicas is required"},
		{&loopsv1.ScalePoolRequest{Id: pool, Replicas: n(-1)}, connect.CodeInvalidArgument, "between 0 and 1024"},
		{&loopsv1.ScalePoolRequest{Id: pool, Replicas: n(1025)}, connect.CodeInvalidArgument, "between 0 and 1024"},
		{&loopsv1.ScalePoolRequest{Id: pool, Replicas: n(1000)}, connect.CodeFailedPrecondition, "pool_slots"},
		{&loopsv1.ScalePoolRequest{Id: "", Replicas: n(1)}, connect.CodeInvalidArgument, "id is required"},
		{&loopsv1.ScalePoolRequest{Id: "../etc", Replicas: n(1)}, connect.CodeInvalidArgument, "letters, digits"},
		{&loopsv1.ScalePoolRequest{Id: strings.Repeat("p", 4096), Replicas: n(1)}, connect.CodeInvalidArgument, "at most 128"},
		{&loopsv1.ScalePoolRequest{Id: "nope", Replicas: n(1)}, connect.CodeNotFound, "does not exist"},
	} {
		_, err := op.ScalePool(ctx, bad.req)
		require.Equal(t, bad.code, connect.CodeOf(err), "%v: %v", bad.req, err)
		require.ErrorContains(t, err, bad.msg)
	}
	_, err = op.ListAllocations(ctx, &loopsv1.ListAllocationsRequest{PoolId: "no/such"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	_, err = op.ListAllocations(ctx, &loopsv1.ListAllocationsRequest{PoolId: "nope"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// gRPC
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	gc := loopsv1.NewPoolServiceClient(conn)
	gl, err := gc.ListPools(metadata.AppendToOutgoingContext(ctx, "x-api-key", opKey), &loopsv1.ListPoolsRequest{})
	require.NoError(t, err)
	require.Equal(t, pool, gl.GetPools()[0].GetId())
	_, err = gc.ListPools(metadata.AppendToOutgoingContext(ctx, "x-api-key", wsKey), &loopsv1.ListPoolsRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err))

	// REST
	code, body := restCall(t, "GET", url+"/v1/pools", opKey, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, pool, body["pools"].([]any)[0].(map[string]any)["id"])
	code, body = restCall(t, "GET", url+"/v1/allocations?pool_id="+pool, opKey, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, body["allocations"], 2)
	code, body = restCall(t, "GET", url+"/v1/pools/"+pool, wsKey, "")
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body["message"], "--operator-key")
	for _, b := range []string{`{}`, `{"replicas": 5000}`, `{"replicas": -3}`, `{"replicas": "x"}`, `{"replicas": 99999999999}`} {
		code, body = restCall(t, "POST", url+"/v1/pools/"+pool+"/scale", opKey, b)
		require.Equal(t, http.StatusBadRequest, code, "%s: %v", b, body)
	}

	// scale 2 → 1 → 2
	scaled, err := op.ScalePool(ctx, &loopsv1.ScalePoolRequest{Id: pool, Replicas: n(1)})
	require.NoError(t, err)
	require.EqualValues(t, 1, scaled.GetDesiredReplicas())
	one := attached(t, op, pool, 1)
	require.EqualValues(t, 0, one[0].GetReplica(), "the highest replica stops")
	code, body = restCall(t, "POST", url+"/v1/pools/"+pool+"/scale", opKey, `{"replicas": 2}`)
	require.Equal(t, http.StatusOK, code, body)
	require.EqualValues(t, 2, body["desired_replicas"])
	two := attached(t, op, pool, 2)
	require.EqualValues(t, []int32{0, 1}, []int32{two[0].GetReplica(), two[1].GetReplica()})
	require.Greater(t, two[1].GetReplicaSeconds(), 0.0)
	got, err = op.GetPool(ctx, &loopsv1.GetPoolRequest{Id: pool})
	require.NoError(t, err)
	require.EqualValues(t, 2, got.GetRegisteredReplicas())

	// delete
	code, body = restCall(t, "DELETE", url+"/v1/pools/"+pool, wsKey, "")
	require.Equal(t, http.StatusForbidden, code, body)
	_, err = op.DeletePool(ctx, &loopsv1.DeletePoolRequest{Id: pool})
	require.NoError(t, err)
	list, err = op.ListPools(ctx, &loopsv1.ListPoolsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetPools())
	_, err = op.GetPool(ctx, &loopsv1.GetPoolRequest{Id: pool})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	all, err := op.ListAllocations(ctx, &loopsv1.ListAllocationsRequest{})
	require.NoError(t, err)
	require.Empty(t, all.GetAllocations())
	_, err = op.DeletePool(ctx, &loopsv1.DeletePoolRequest{Id: pool})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = op.ScalePool(ctx, &loopsv1.ScalePoolRequest{Id: "no-such-pool", Replicas: n(1)})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	// a deleted shared pool is created again, as configured, by scaling it
	_, err = op.ScalePool(ctx, &loopsv1.ScalePoolRequest{Id: pool, Replicas: n(1)})
	require.NoError(t, err)
	attached(t, op, pool, 1)
}

// TestPoolServiceDedicatedPool: a dedicated run's pool is listed with the shared one, its
// replica holds the run's adapter, and it is not scaled or deleted by hand (it follows its run).
func TestPoolServiceDedicatedPool(t *testing.T) {
	url := poolGateway(t)
	ctx := t.Context()
	op := loopsv1connect.NewPoolServiceClient(http.DefaultClient, url, keyed(opKey))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, keyed(wsKey))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, keyed(wsKey))
	created, err := training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}, Dedicated: &loopsv1.DedicatedPool{Replicas: 1}})
	require.NoError(t, err)
	done, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: created.GetId(), Timeout: durationpb.New(60 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())

	list, err := op.ListPools(ctx, &loopsv1.ListPoolsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetPools(), 2, "%v", list)
	ded := list.GetPools()[0] // "ded-…" sorts before "torch-…"
	require.True(t, strings.HasPrefix(ded.GetId(), "ded-"), ded.GetId())
	require.Equal(t, worker.PoolID(tiny.Name), list.GetPools()[1].GetId())
	require.NotEmpty(t, ded.GetWorkspace(), "the pool names the workspace holding it")
	require.Empty(t, cmpDiff(&loopsv1.Pool{Id: ded.GetId(), Role: loopsv1.PoolRole_POOL_ROLE_TRAINER, BaseModel: tiny.Name, Provider: "local",
		DesiredReplicas: 1, RegisteredReplicas: 1, TrainingRunId: done.GetTrainingRunId()}, ded, protocmp.IgnoreFields(&loopsv1.Pool{}, "replica_seconds", "workspace")))
	allocs := attached(t, op, ded.GetId(), 1)
	require.Equal(t, []string{done.GetTrainingRunId()}, allocs[0].GetTrainingRunIds())

	n := int32(2)
	_, err = op.ScalePool(ctx, &loopsv1.ScalePoolRequest{Id: ded.GetId(), Replicas: &n})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "dedicated run's pool")
	_, err = op.DeletePool(ctx, &loopsv1.DeletePoolRequest{Id: ded.GetId()})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
}

// TestPoolServiceWithoutPools: a gateway on the reference engine answers FailedPrecondition
// (NO_POOLS) to an operator, on every surface; with no keys configured any key from loopback
// is an operator's, and the mark of a REST request from another peer holds on its hop back;
// with keys but no operator key, nobody is. A worker backend without pools (one that dials
// its workers by address) answers the same.
func TestPoolServiceWithoutPools(t *testing.T) {
	url := startGateway(t, gateway.Config{DataDir: t.TempDir()})
	ctx := t.Context()
	cl := loopsv1connect.NewPoolServiceClient(http.DefaultClient, url, keyed("tml-anyone"))
	_, err := cl.ListPools(ctx, &loopsv1.ListPoolsRequest{})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Equal(t, errs.ReasonNoPools, errs.Reason(err))
	require.ErrorContains(t, err, poolsvc.NoPoolsMessage)
	n := int32(1)
	_, err = cl.ScalePool(ctx, &loopsv1.ScalePoolRequest{Id: "p", Replicas: &n})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	code, body := restCall(t, "GET", url+"/v1/allocations", "tml-anyone", "")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body["message"], "provider=local|static|ray")
	code, body = restCall(t, "GET", url+"/v1/pools", "tml-anyone", "", auth.NotOperatorHeader, "1")
	require.Equal(t, http.StatusForbidden, code, "a REST request marked not an operator's stays so on its hop back: %v", body)

	keys, err := auth.ParseKeys([]string{wsKey})
	require.NoError(t, err)
	keyedURL := startGateway(t, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	_, err = loopsv1connect.NewPoolServiceClient(http.DefaultClient, keyedURL, keyed(wsKey)).ListPools(ctx, &loopsv1.ListPoolsRequest{})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "with keys and no operator key nobody is an operator")

	svc := poolsvc.New(&worker.Backend{})
	_, err = svc.ListAllocations(auth.WithOperator(ctx), &loopsv1.ListAllocationsRequest{})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "a worker backend that dials its workers runs no pools")
	require.ErrorContains(t, err, poolsvc.NoPoolsMessage)
}

// cmpDiff is cmp.Diff of messages, with protocmp.
func cmpDiff(want, got proto.Message, opts ...cmp.Option) string {
	return cmp.Diff(want, got, append(opts, protocmp.Transform())...)
}
