package worker

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools/local"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// goWorkerEnv, set to 1, makes the test binary the Go worker (serve.Main): the tests give
// it as worker_command.
const goWorkerEnv = "LOOPS_TEST_GO_WORKER"

func init() {
	if os.Getenv(goWorkerEnv) == "1" {
		os.Exit(serve.Main(os.Args[1:]))
	}
}

// TestOptionsWorkerCommand: worker_command (or LOOPS_WORKER_COMMAND) replaces
// `<python> -m loops_worker`.
func TestOptionsWorkerCommand(t *testing.T) {
	t.Setenv("LOOPS_WORKER_COMMAND", "")
	o, err := OptionsFromConfig(backendsConfig(map[string]string{"worker_command": " /usr/local/bin/loops  worker "}))
	require.NoError(t, err)
	require.Equal(t, []string{"/usr/local/bin/loops", "worker"}, o.Command)
	b := &Backend{opts: o}
	require.Equal(t, []string{"/usr/local/bin/loops", "worker"}, b.workerCommand())
	b = &Backend{opts: Options{Python: "python3"}}
	require.Equal(t, []string{"python3", "-m", "loops_worker"}, b.workerCommand(), "the default is unchanged")
}

// TestPoolModeGoWorker: pool mode with provider=local whose worker_command is the Go worker
// (2 replicas of loops/tiny): an adapter trains and samples on the replica AdapterReplica
// names; after that replica's process is killed the adapter is gone (NotFound, the
// gateway's reload path) and the provider restarts the replica as a new incarnation.
func TestPoolModeGoWorker(t *testing.T) {
	dir := t.TempDir()
	b, err := New(t.Context(), Options{Command: []string{testBinary()}, DataDir: dir,
		Args:           []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 2, HeartbeatTimeout: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	prov, reg := b.Pools()
	pool := PoolID(tiny.Name)
	require.Eventually(t, func() bool { return len(reg.Members(pool)) == 2 }, 20*time.Second, 20*time.Millisecond)
	require.NoError(t, b.WaitReady(ctx))
	for _, m := range reg.Members(pool) {
		require.Equal(t, "reference", m.Capabilities.GetImplementation(), "the replicas are Go workers")
	}

	lora := &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMlp: true}
	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	fb, err := b.Trainer().ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
		{AdapterId: "a", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 16, "cross_entropy")}}}})
	require.NoError(t, err)
	require.NotNil(t, fb.GetResults()[0].GetResult(), "%v", fb.GetResults()[0].GetError())
	_, err = b.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a", Adam: &loopsv1.AdamParams{LearningRate: 0.01, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}})
	require.NoError(t, err)
	ck := filepath.Join(dir, "ck") // in the data dir: the folders the local workers may use
	_, err = b.Trainer().SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Dir: ck})
	require.NoError(t, err)
	sr, err := b.Sampler().Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: ck, Prompt: []int32{5, 17, 42},
		Params: &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 1, TopP: 1, Seed: proto.Uint64(3)}})
	require.NoError(t, err)
	require.NotEmpty(t, sr.GetResult().GetSequences()[0].GetTokens())

	gotPool, replica, ok := b.AdapterReplica("a")
	require.True(t, ok, "the adapter is held by a replica")
	require.Equal(t, pool, gotPool)
	var before string
	for _, m := range reg.Members(pool) {
		if m.Replica == replica {
			before = m.Incarnation
		}
	}
	require.NotEmpty(t, before, "AdapterReplica names a registered replica")
	_, _, ok = b.AdapterReplica("unknown")
	require.False(t, ok)

	pid := prov.(*local.Provider).PID(pool, replica)
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	var odd []error // answers other than NotFound and Unavailable
	require.Eventually(t, func() bool {
		_, err := b.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a", Adam: &loopsv1.AdamParams{LearningRate: 0.01}})
		switch connect.CodeOf(err) {
		case connect.CodeNotFound:
			return true
		case connect.CodeUnavailable: // the replica is down, not yet forgotten
		default:
			odd = append(odd, err)
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "the adapter of a dead replica is gone")
	require.Empty(t, odd, "after the kill the adapter answers NotFound, or Unavailable meanwhile")
	_, _, ok = b.AdapterReplica("a")
	require.False(t, ok, "a lost adapter is held by no replica")
	require.Eventually(t, func() bool {
		for _, m := range reg.Members(pool) {
			if m.Replica == replica && m.Incarnation != before {
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "the provider restarts the replica as a new incarnation")
	require.NotEqual(t, pid, prov.(*local.Provider).PID(pool, replica))
	require.Eventually(t, func() bool {
		_, err := b.Trainer().LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "a", Dir: ck})
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "the run's checkpoint loads again")
	_, _, ok = b.AdapterReplica("a")
	require.True(t, ok)
}

// TestLocalWorkersGoWorker: the default mode (local workers) starts worker_command through
// the local pool provider, as one pool; a killed worker is restarted.
func TestLocalWorkersGoWorker(t *testing.T) {
	dir := t.TempDir()
	b, err := New(t.Context(), Options{Command: []string{testBinary()}, DataDir: dir, Args: []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, StartTimeout: 30 * time.Second, RestartBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	caps, err := b.Trainer().GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	require.Equal(t, tiny.Name, caps.GetModels()[0].GetName())
	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}})
	require.NoError(t, err)
	pool, _, ok := b.AdapterReplica("a")
	require.True(t, ok)
	require.Equal(t, PoolID(tiny.Name), pool, "local workers are the replicas of one pool")
	// A worker declared lost that comes back as itself still holds the adapter the backend
	// forgot: creating it again replaces that orphan instead of answering AlreadyExists.
	b.mu.Lock()
	delete(b.adapters, "a")
	b.mu.Unlock()
	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}})
	require.NoError(t, err)
	pid := b.WorkerPID(0)
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { p := b.WorkerPID(0); return p != 0 && p != pid }, 20*time.Second, 50*time.Millisecond)
	require.NoError(t, b.WaitReady(ctx))
	_, err = b.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "the adapter went with the worker")
}

// TestSamplerPool: with sampler_replicas, each model has a pool of sampler replicas beside
// its trainers: adapters are placed on trainers only, samples go to the sampler replicas
// (to the trainers while none serves), and deployments scale the sampler pool.
func TestSamplerPool(t *testing.T) {
	dir := t.TempDir()
	o, err := OptionsFromConfig(backends.Config{Models: []string{tiny.Name}, Options: map[string]string{"provider": "local", "replicas": "1", "sampler_replicas": "1"}})
	require.NoError(t, err)
	o.Pool.HeartbeatTimeout = 6 * time.Second
	o.Command, o.DataDir, o.Args = []string{testBinary()}, dir, []string{"--data-dir", dir, "--threads", "1"}
	o.Env = []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"}
	o.HealthInterval, o.HealthTimeout, o.StartTimeout = 200*time.Millisecond, 2*time.Second, 30*time.Second
	b, err := New(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	prov, reg := b.Pools()
	trainers, samplers := PoolID(tiny.Name), SamplerPoolID(tiny.Name)
	require.Eventually(t, func() bool { return len(reg.Members(trainers)) == 1 && len(reg.Members(samplers)) == 1 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, b.WaitReady(ctx))

	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}})
	require.NoError(t, err)
	pool, _, ok := b.AdapterReplica("a")
	require.True(t, ok)
	require.Equal(t, trainers, pool, "adapters go to the trainers")
	ck := filepath.Join(dir, "ck") // in the data dir: the folders the local workers may use
	_, err = b.Trainer().SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Dir: ck})
	require.NoError(t, err)
	sample := func() string { // the pool that sampled; "" when the sample failed
		t.Helper()
		_, err := b.Sampler().Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: ck, Prompt: []int32{5, 17}, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1, TopP: 1, Seed: proto.Uint64(1)}})
		if err != nil {
			return ""
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, w := range b.workers { // the replica that sampled now holds the adapter
			w.mu.Lock()
			held, p := slices.Contains(w.load.held, "dir:"+ck), w.pool
			w.load.held = nil
			w.mu.Unlock()
			if held {
				return p
			}
		}
		return ""
	}
	require.Equal(t, samplers, sample(), "samples go to the sampler replicas")
	// deployments scale the sampler pool
	n, placed, err := b.ScaleSamplers(ctx, tiny.Name, 2)
	require.NoError(t, err)
	require.True(t, placed)
	require.Equal(t, 2, n)
	require.Eventually(t, func() bool { return len(reg.Members(samplers)) == 2 }, 30*time.Second, 20*time.Millisecond)
	require.Len(t, reg.Members(trainers), 1)
	// with no sampler replica, the trainers sample (a sample may fail while the replica
	// being stopped is still attached)
	require.NoError(t, prov.ScalePool(ctx, samplers, 0))
	require.Eventually(t, func() bool { return len(reg.Members(samplers)) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return sample() == trainers }, 10*time.Second, 100*time.Millisecond)
}

// TestHungReplicaIsRestarted: a pool replica whose process stops answering (SIGSTOP) is
// declared lost by its missed heartbeats; as it does not register again, the local provider
// kills it and starts a new incarnation.
func TestHungReplicaIsRestarted(t *testing.T) {
	dir := t.TempDir()
	b, err := New(t.Context(), Options{Command: []string{testBinary()}, DataDir: dir,
		Args:           []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 1, HeartbeatTimeout: 1500 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	prov, reg := b.Pools()
	pool := PoolID(tiny.Name)
	require.Eventually(t, func() bool { return len(reg.Members(pool)) == 1 }, 20*time.Second, 20*time.Millisecond)
	before := reg.Members(pool)[0].Incarnation
	pid := prov.(*local.Provider).PID(pool, 0)
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	require.Eventually(t, func() bool { return len(reg.Members(pool)) == 0 }, 10*time.Second, 20*time.Millisecond, "lost by its heartbeats")
	require.Eventually(t, func() bool {
		m := reg.Members(pool)
		return len(m) == 1 && m[0].Incarnation != before
	}, 20*time.Second, 50*time.Millisecond, "killed and started again")
	require.NotEqual(t, pid, prov.(*local.Provider).PID(pool, 0))
}

// TestLocalWorkerThatCannotStart: a local worker whose process exits at once fails the
// backend's start right away, with what it printed, instead of after the start timeout.
func TestLocalWorkerThatCannotStart(t *testing.T) {
	start := time.Now()
	_, err := New(t.Context(), Options{Command: []string{"sh", "-c", "echo no torch here >&2; exit 3", "--"}, DataDir: t.TempDir(),
		StartTimeout: 10 * time.Minute})
	require.ErrorContains(t, err, "exited during start")
	require.ErrorContains(t, err, "no torch here")
	require.Less(t, time.Since(start), 5*time.Minute, "it did not wait for the start timeout")
}

// TestDedicatedPoolSlowerToStartThanItsIdleTime: a dedicated pool whose replica takes longer
// to start than IdleToZero is not scaled to zero while a call waits for it (it was: the idle
// clock ran from the call's start, the pool went to zero mid-start and the call failed with
// "no replica served in time"; TestDedicatedRuns failed so on a loaded machine).
func TestDedicatedPoolSlowerToStartThanItsIdleTime(t *testing.T) {
	dir := t.TempDir()
	// The worker command sleeps before it starts the Go worker: a slow cold start.
	slow := []string{"sh", "-c", `sleep 2 && exec "$0" "$@"`, testBinary()}
	b, err := New(t.Context(), Options{Command: slow, DataDir: dir,
		Args:           []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 1, HeartbeatTimeout: 6 * time.Second, IdleToZero: 300 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	g, err := b.AcquirePool(t.Context(), backends.PoolRequest{BaseModel: tiny.Name, Replicas: 1, Workspace: "ws", Owner: "run-1"})
	require.NoError(t, err, "the pool started although its start took longer than its idle time")
	_, err = b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: "run-1", BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}, Pool: g.Pool})
	require.NoError(t, err)
}

// TestScaleIdleToZero: the gateway scales a bound dedicated pool to zero for a reason of its
// own (a workspace at its budget's cap): refused while the pool had a call within idle, done
// once it idled, shown with the reason (and the pool's GPU kind) in ListPools, not done twice;
// the run's next call scales the pool up again and the reason is gone.
func TestScaleIdleToZero(t *testing.T) {
	dir := t.TempDir()
	b, err := New(t.Context(), Options{Command: []string{testBinary()}, DataDir: dir,
		Args:           []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		Pool: &PoolOptions{Provider: "local", Replicas: 1, HeartbeatTimeout: 6 * time.Second, GPUKind: "H100"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	g, err := b.AcquirePool(t.Context(), backends.PoolRequest{BaseModel: tiny.Name, Replicas: 1, Workspace: "ws", Owner: "run-1"})
	require.NoError(t, err)
	require.Equal(t, "H100", g.GPUKind)
	create := func(id string) {
		_, err := b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: tiny.Name,
			Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}, Pool: g.Pool})
		require.NoError(t, err)
	}
	create("run-1")
	info := func() backends.PoolInfo {
		ps, err := b.ListPools(t.Context())
		require.NoError(t, err)
		for _, p := range ps {
			if p.ID == g.Pool {
				return p
			}
		}
		t.Fatalf("pool %s not listed", g.Pool)
		return backends.PoolInfo{}
	}
	const why = "workspace ws reached its budget_usd_total"
	down, err := b.ScaleIdleToZero(t.Context(), g.Pool, time.Hour, why)
	require.NoError(t, err)
	require.False(t, down, "it had a call within the hour")
	down, err = b.ScaleIdleToZero(t.Context(), g.Pool, 0, why)
	require.NoError(t, err)
	require.True(t, down)
	p := info()
	require.True(t, p.Idle)
	require.Equal(t, why, p.ZeroReason)
	require.Equal(t, "H100", p.GPUKind)
	require.Equal(t, 0, p.DesiredReplicas)
	down, err = b.ScaleIdleToZero(t.Context(), g.Pool, 0, why)
	require.NoError(t, err)
	require.False(t, down, "at zero already")
	// The run comes back: the pool scales up. A call right after the scale-down can reach
	// the old replica before the backend has heard of its exit and fail Unavailable, as
	// after idle_to_zero; callers retry it (the core's step recovery), and so does this.
	require.Eventually(t, func() bool {
		_, err := b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: "run-1-again", BaseModel: tiny.Name,
			Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}, Pool: g.Pool})
		require.True(t, err == nil || connect.CodeOf(err) == connect.CodeUnavailable, "%v", err)
		return err == nil
	}, 60*time.Second, 50*time.Millisecond)
	p = info()
	require.False(t, p.Idle)
	require.Empty(t, p.ZeroReason)
	require.Equal(t, 1, p.DesiredReplicas)
}
