package ray

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	rayprov "github.com/loops-dev/loops/backends/pools/ray"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway"
)

// rankNodes returns the node of each rank of replica 0 (rank 0's actor is
// loops-<pool>-0, rank i's loops-<pool>-0-rank<i>).
func rankNodes(t *testing.T, dash, pool string, world int) []string {
	t.Helper()
	nodes := make([]string, world)
	for i := range world {
		name := "loops-" + pool + "-0"
		if i > 0 {
			name += fmt.Sprintf("-rank%d", i)
		}
		_, nodes[i] = actor(t, dash, name)
	}
	return nodes
}

// TestRayShardedReplica: a trainer pool of gpus_per_replica = 2 on a cluster whose GPU
// nodes hold one (logical) GPU each is one placement group of two bundles packed across
// two raylets, one actor per rank, the ranks rendezvoused through Ray (gloo). A tinker
// script trains through it; the raylet of rank 1's node is killed mid-training: the whole
// replica is lost and placed again, and step recovery replays, so no step is lost.
func TestRayShardedReplica(t *testing.T) {
	if os.Getenv("LOOPS_TEST_RAY") != "1" {
		t.Skip("needs a local Ray cluster: make test-ray")
	}
	dash, py := os.Getenv("LOOPS_RAY_ADDRESS"), os.Getenv("LOOPS_RAY_PYTHON")
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	ctx := t.Context()
	pool := worker.PoolID("loops/tiny")
	// The pool (and so its driver job's id) is TestRayPool's, whose job that test stopped:
	// delete that job and wait until Ray has let its supervisor go. A submission under the
	// id right after the delete can find the supervisor's name still taken (seen here).
	job := dash + "/api/jobs/" + rayprov.JobID(pool)
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodDelete, job, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		resp, err := http.Get(job)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusNotFound && len(rayState(t, dash, "actors", url.Values{"filter_keys": {"name", "state"},
			"filter_predicates": {"=", "="}, "filter_values": {"_ray_internal_job_actor_" + rayprov.JobID(pool), "ALIVE"}})) == 0
	}, 3*time.Minute, time.Second, "the previous driver job is still there")
	time.Sleep(3 * time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t0 := time.Now()
	dataDir := t.TempDir()
	srv, err := gateway.New(ctx, ln, gateway.Config{DataDir: dataDir, Backend: backendName, BackendConfig: backends.Config{
		Models: []string{"loops/tiny"},
		Options: map[string]string{"provider": "ray", "ray_address": dash, "ray_python": py, "registry_listen": "127.0.0.1:0",
			"gpus_per_replica": "2", "device": "cpu", "args": "--threads 1 --allow-dir " + dataDir, "heartbeat_timeout": "5s",
			"pythonpath": root + "/backends/torch:" + root + "/gen/python", "start_timeout": "10m", "preemptible": "true"}}})
	require.NoError(t, err)
	t.Logf("FIGURE 2-rank replica cold start (gateway start → replica attached: Ray job, 2 actors, 2 model loads, rendezvous, FSDP2): %.1fs", time.Since(t0).Seconds())
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	beMu.Lock()
	b := be
	beMu.Unlock()
	prov, _ := b.Pools()
	t.Cleanup(func() { _ = prov.DeletePool(context.Background(), pool) })
	ups := make(chan pools.Event, 64)
	evs, err := prov.Watch(ctx, pool)
	require.NoError(t, err)
	go func() {
		for ev := range evs {
			t.Logf("EVENT %s %v", ev.Time.Format("15:04:05.000"), ev)
			if ev.Kind == pools.Up {
				ups <- ev
			}
		}
	}()
	<-ups
	nodes := rankNodes(t, dash, pool, 2)
	t.Logf("ranks on nodes %v", nodes)
	require.NotEqual(t, nodes[0], nodes[1], "no node holds two GPUs: the replica spans two raylets")

	s := startDriver(t, ctx, py, root, ln.Addr().String())
	s.wait("ready")
	first := s.do("step", "step")
	s.do("step", "step")
	s.do("save s2", "saved")
	// the model has no sampler pool: the 2-rank replica samples (every rank runs each pass)
	sampled := s.do("sample w2", "sampled")
	require.NotEmpty(t, sampled.Tokens, "the 2-rank replica sampled")
	t.Logf("FIGURE the 2-rank replica sampled %v", sampled.Tokens)

	// kill the raylet of rank 1's node (a follower: rank 0, the endpoint, lives on): the
	// replica is lost whole and placed again
	rp := raylet(t, nodes[1])
	drain(ups)
	midTraining(t, s, ups, "a raylet kill under rank 1", func() {
		require.NoError(t, syscall.Kill(rp, syscall.SIGKILL))
		t.Logf("killed raylet pid %d of node %s (rank 1)", rp, nodes[1])
	})
	again := rankNodes(t, dash, pool, 2)
	t.Logf("ranks placed again on nodes %v", again)
	require.NotContains(t, again, nodes[1], "the dead node holds no rank")
	require.NotEqual(t, again[0], again[1], "the new replica spans two raylets too")
	last := s.do("step", "step")
	require.Less(t, last.Loss, first.Loss, "training went on: the loss fell across the failure")

	s.mu.Lock()
	losses, errs, reloaded := append([]float64(nil), s.losses...), append([]string(nil), s.errors...), s.reloaded
	s.mu.Unlock()
	t.Logf("FIGURE the script saw %d errors (%v) and reloaded %d times over %d steps", len(errs), errs, reloaded, len(losses))
	require.Zero(t, reloaded, "no state was lost")
	require.NotContains(t, errs, "step", "no step failed")
	shadow := s.do(fmt.Sprintf("shadow %d", len(losses)), "shadow")
	require.Equal(t, losses, shadow.Losses, "the disturbed run's losses equal an undisturbed run's on the same 2-rank replica")
	reportRecovery(t, "http://"+ln.Addr().String())
	s.do("quit", "bye")
	require.NoError(t, prov.DeletePool(ctx, pool))
}
