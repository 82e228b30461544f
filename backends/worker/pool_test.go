package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/pools/poolstest"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The test binary doubles as the fake worker the local provider starts.
func init() { poolstest.FakeWorkerMain() }

func TestPoolOptions(t *testing.T) {
	o, err := OptionsFromConfig(backendsConfig(map[string]string{}))
	require.NoError(t, err)
	require.Nil(t, o.Pool, "no provider: today's mode")
	o, err = OptionsFromConfig(backendsConfig(map[string]string{"provider": "local", "replicas": "3", "gpus": "0, 1", "gpus_per_replica": "1", "gpu_kind": "H100"}))
	require.NoError(t, err)
	require.Equal(t, &PoolOptions{Provider: "local", Replicas: 3, GPUsPerReplica: 1, GPUKind: "H100", GPUs: []string{"0", "1"}}, o.Pool)
	for _, bad := range []map[string]string{{"provider": "k8s"}, {"provider": "local", "gpu_kind": "H100 SXM"}, {"provider": "local", "gpu_kind": strings.Repeat("a", 65)}, {"provider": "ray"}, {"provider": "local", "replicas": "-1"}, {"provider": "local", "heartbeat_timeout": "x"}} {
		_, err := OptionsFromConfig(backendsConfig(bad))
		require.Error(t, err, "%v", bad)
	}
	// An option no one reads is refused, not ignored (attn-implementation is a worker argument).
	_, err = OptionsFromConfig(backendsConfig(map[string]string{"attn-implementation": "eager"}))
	require.ErrorContains(t, err, `unknown backend option "attn-implementation"`)
	for _, k := range optionKeys { // each known key is accepted (as a key: some values are refused)
		_, err := OptionsFromConfig(backendsConfig(map[string]string{k: ""}))
		require.NotContains(t, fmt.Sprint(err), "unknown backend option", k)
	}
	require.Equal(t, "torch-Qwen-Qwen3-8B", PoolID("Qwen/Qwen3-8B"))
	require.Equal(t, "torch-loops-tiny", PoolID("loops/tiny=/data/models/loops-tiny"))
}

// Pool mode: replicas come from the local provider and register; killing one loses its
// adapters (NotFound, the gateway's reload path), and its new incarnation takes work again.
func TestPoolModeLocal(t *testing.T) {
	b, err := New(t.Context(), Options{Models: []string{"m"}, Python: testBinary(), Env: []string{poolstest.FakeWorkerEnv + "=1"}, DataDir: t.TempDir(),
		HealthInterval: 100 * time.Millisecond, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 2, HeartbeatTimeout: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	prov, reg := b.Pools()
	require.Eventually(t, func() bool { return len(reg.Members(PoolID("m"))) == 2 }, 20*time.Second, 20*time.Millisecond)
	caps, err := b.Trainer().GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	require.Equal(t, "m", caps.GetModels()[0].GetName())

	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a1", BaseModel: "m"})
	require.NoError(t, err)
	_, err = b.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a1"})
	require.NoError(t, err)
	before := reg.Members(PoolID("m"))
	lp := prov.(*local.Provider)
	for i := range 2 {
		require.NoError(t, syscall.Kill(lp.PID(PoolID("m"), i), syscall.SIGKILL))
	}
	require.Eventually(t, func() bool {
		_, err := b.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a1"})
		return connect.CodeOf(err) == connect.CodeNotFound
	}, 20*time.Second, 20*time.Millisecond, "the adapter of a dead replica is gone")
	require.Eventually(t, func() bool {
		now := reg.Members(PoolID("m"))
		return len(now) == 2 && now[0].Incarnation != before[0].Incarnation && now[1].Incarnation != before[1].Incarnation
	}, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		_, err := b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a2", BaseModel: "m"})
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "the new incarnations take work")
}

// TestScaleSamplersScalesThePool: a deployment's replicas scale the model's pool (never
// below the configured replicas, within the slots); without pool mode nothing is placed.
func TestScaleSamplersScalesThePool(t *testing.T) {
	b, err := New(t.Context(), Options{Models: []string{"m"}, Python: testBinary(), Env: []string{poolstest.FakeWorkerEnv + "=1"}, DataDir: t.TempDir(),
		HealthInterval: 100 * time.Millisecond, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 1, Slots: 3, HeartbeatTimeout: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	_, reg := b.Pools()
	members := func() int { return len(reg.Members(PoolID("m"))) }
	require.Eventually(t, func() bool { return members() == 1 }, 20*time.Second, 20*time.Millisecond)
	set, ok, err := b.ScaleSamplers(t.Context(), "m", 5)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 3, set, "within the pool slots")
	require.Eventually(t, func() bool { return members() == 3 }, 20*time.Second, 20*time.Millisecond)
	set, _, err = b.ScaleSamplers(t.Context(), "m", 0)
	require.NoError(t, err)
	require.Equal(t, 1, set, "never below the configured replicas")
	require.Eventually(t, func() bool { return members() == 1 }, 20*time.Second, 20*time.Millisecond)
	_, _, err = b.ScaleSamplers(t.Context(), "other", 2)
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	plain := &Backend{}
	_, ok, err = plain.ScaleSamplers(t.Context(), "m", 2)
	require.NoError(t, err)
	require.False(t, ok, "no pools: nothing placed")
}

func backendsConfig(opts map[string]string) backends.Config {
	return backends.Config{Models: []string{"m"}, Options: opts}
}

func testBinary() string { return os.Args[0] }

// authority is the worker TLS authority of a backend whose data dir is dataDir (what
// loops pools credentials opens to issue a hand-started worker's credentials).
func authority(t *testing.T, dataDir string) *mtls.Authority {
	t.Helper()
	a, err := mtls.Open(filepath.Join(dataDir, "pools", "tls"))
	require.NoError(t, err)
	return a
}

// Pool mode with the real Python worker (make test-torch): it registers with --register,
// trains, and after its process is killed the adapter answers NotFound while the new
// incarnation registers and trains again.
func TestPoolModeTorch(t *testing.T) {
	needTorch(t)
	o := testOptions(t, t.TempDir())
	o.Python = os.Getenv("LOOPS_WORKER_PYTHON")
	o.StartTimeout = 5 * time.Minute
	o.Pool = &PoolOptions{Provider: "local", Replicas: 1, HeartbeatTimeout: 3 * time.Second}
	b, err := New(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	prov, reg := b.Pools()
	pool := PoolID("loops/tiny")
	ms := reg.Members(pool)
	require.Len(t, ms, 1)
	require.NotEmpty(t, ms[0].Capabilities.GetModels(), "the worker registers its capabilities")
	lora := &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true}
	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: "loops/tiny", Lora: lora})
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(prov.(*local.Provider).PID(pool, 0), syscall.SIGKILL))
	require.Eventually(t, func() bool {
		_, err := b.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a", Adam: &loopsv1.AdamParams{LearningRate: 0.01}})
		return connect.CodeOf(err) == connect.CodeNotFound
	}, time.Minute, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		now := reg.Members(pool)
		return len(now) == 1 && now[0].Incarnation != ms[0].Incarnation
	}, 2*time.Minute, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		_, err := b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "b", BaseModel: "loops/tiny", Lora: lora})
		return err == nil
	}, 2*time.Minute, 200*time.Millisecond)
}

// Pool mode with the static provider: configured addresses become the pool's replicas.
func TestPoolModeStatic(t *testing.T) {
	dir := t.TempDir()
	a := authority(t, dir)
	var addrs []string
	for range 2 {
		w, err := poolstest.StartFakeWorker("127.0.0.1:0", []string{"m"}, poolstest.Credentials(t, a, PoolID("m")))
		require.NoError(t, err)
		t.Cleanup(w.Close)
		addrs = append(addrs, w.Addr)
	}
	o, err := OptionsFromConfig(backends.Config{Models: []string{"m"}, DataDir: dir,
		Options: map[string]string{"provider": "static", "workers": addrs[0] + "," + addrs[1]}})
	require.NoError(t, err)
	b, err := New(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	_, reg := b.Pools()
	require.Eventually(t, func() bool { return len(reg.Members(PoolID("m"))) == 2 }, 10*time.Second, 20*time.Millisecond)
	_, err = b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: "m"})
	require.NoError(t, err)
}

// TestStartWaitsForEveryPool: New returns once every pool it ensured has a replica
// attached, not once any replica serves the model: with a sampler pool whose replica
// answers first, the trainer pool's replica (which answers a second late) is attached
// before New returns, so an adapter can be created at once. (Before, New returned on the
// sampler replica and CreateAdapter failed with "not served by any worker": the cause of
// TestSamplerPool's rare failures under -race, where attaching is slower.)
func TestStartWaitsForEveryPool(t *testing.T) {
	b, err := New(t.Context(), Options{Models: []string{"m"}, Python: testBinary(), DataDir: t.TempDir(),
		Env:            []string{poolstest.FakeWorkerEnv + "=1", poolstest.FakeSlowPoolEnv + "=" + PoolID("m")},
		HealthInterval: 100 * time.Millisecond, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 1, SamplerReplicas: 1, HeartbeatTimeout: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	_, err = b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: "m"})
	require.NoError(t, err)
	pool, _, ok := b.AdapterReplica("a")
	require.True(t, ok)
	require.Equal(t, PoolID("m"), pool)
}

// TestNoTrainerYetIsUnavailable: a model the backend serves whose trainer replicas are
// all down (restarting, or registered but not attached yet) is Unavailable, retried by the
// gateway, not InvalidArgument, which would fail the client's request as its own mistake.
func TestNoTrainerYetIsUnavailable(t *testing.T) {
	b := &Backend{opts: Options{Models: []string{"m=/models/m"}, Pool: &PoolOptions{Provider: "local"}}, roles: map[string]pools.Role{}}
	w := &worker{b: b, pooled: true, up: make(chan struct{})}
	b.workers = []*worker{w}
	_, err := b.pick("", "m")
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)
	_, err = b.pick("", "other")
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "a model the backend does not serve is the client's mistake")
}
