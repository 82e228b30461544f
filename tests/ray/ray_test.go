package ray

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway"
)

const backendName = "torch-ray-test"

var (
	beMu sync.Mutex
	be   *worker.Backend
)

func init() {
	// the torch backend, kept at hand so the test can scale its pool
	backends.Register(backendName, func(ctx context.Context, cfg backends.Config) (backends.Backend, error) {
		o, err := worker.OptionsFromConfig(cfg)
		if err != nil {
			return nil, err
		}
		b, err := worker.New(ctx, o)
		if err == nil {
			beMu.Lock()
			be = b
			beMu.Unlock()
		}
		return b, err
	})
}

type line struct {
	Event  string    `json:"event"`
	Step   int       `json:"step"`
	Loss   float64   `json:"loss"`
	Secs   float64   `json:"secs"`
	Error  string    `json:"error"`
	Tokens any       `json:"tokens"`
	Losses []float64 `json:"losses"`
	What   string    `json:"what"`
	T      float64   `json:"t"`
}

type script struct {
	t     *testing.T
	stdin io.WriteCloser
	lines chan line

	stop string // the file that ends `steps N` early

	mu       sync.Mutex
	losses   []float64 // of every step, in order
	errors   []string  // what failed, as the script saw it
	reloaded int       // load_state calls after a lost adapter
}

// do sends a command and waits for its outcome line, logging the errors seen meanwhile.
func (s *script) do(cmd, want string) line {
	s.t.Helper()
	_, err := fmt.Fprintln(s.stdin, cmd)
	require.NoError(s.t, err)
	return s.wait(want)
}

func (s *script) wait(want string) line {
	s.t.Helper()
	timeout := time.After(8 * time.Minute)
	for {
		select {
		case l, ok := <-s.lines:
			require.True(s.t, ok, "the script ended while waiting for %s", want)
			if l.Event == want {
				return l
			}
		case <-timeout:
			s.t.Fatalf("no %s from the script within 8 minutes", want)
		}
	}
}

// startDriver starts tests/ray/drive.py, the tinker script both tests drive line by line,
// against the gateway at addr, and reads its events (losses, errors, reloads) as it runs.
func startDriver(t *testing.T, ctx context.Context, py, root, addr string) *script {
	t.Helper()
	cmd := exec.CommandContext(ctx, py, filepath.Join(root, "tests/ray/drive.py"))
	stopFile := filepath.Join(t.TempDir(), "stop")
	cmd.Env = append(os.Environ(), "TINKER_BASE_URL=http://"+addr, "TINKER_API_KEY=tml-ray-test", "HF_HUB_OFFLINE=1", "LOOPS_DRIVE_STOP="+stopFile)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	s := &script{t: t, stdin: stdin, lines: make(chan line, 256), stop: stopFile}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			t.Logf("SCRIPT %s", sc.Text())
			var l line
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				s.mu.Lock()
				switch l.Event {
				case "step":
					s.losses = append(s.losses, l.Loss)
				case "error":
					s.errors = append(s.errors, l.What)
				case "reloaded":
					s.reloaded++
				}
				s.mu.Unlock()
				s.lines <- l
			}
		}
	}()
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	return s
}

// rayState calls the dashboard's state API (GET /api/v0/<kind>) and returns its rows.
func rayState(t *testing.T, dash, kind string, filter url.Values) []map[string]any {
	t.Helper()
	resp, err := http.Get(dash + "/api/v0/" + kind + "?" + filter.Encode())
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Result struct {
				Result []map[string]any `json:"result"`
			} `json:"result"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Data.Result.Result
}

// actor returns the live actor of a replica (its pid and node id).
func actor(t *testing.T, dash, name string) (pid int, node string) {
	t.Helper()
	rows := rayState(t, dash, "actors", url.Values{"filter_keys": {"name", "state"}, "filter_predicates": {"=", "="}, "filter_values": {name, "ALIVE"}, "detail": {"true"}})
	require.NotEmpty(t, rows, "no live actor %s", name)
	return int(rows[0]["pid"].(float64)), rows[0]["node_id"].(string)
}

// raylet finds the raylet process of a node by its id on its command line.
func raylet(t *testing.T, node string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "/raylet ") && strings.Contains(cmd, node) {
			var pid int
			_, _ = fmt.Sscanf(strings.Split(p, "/")[2], "%d", &pid)
			return pid
		}
	}
	t.Fatalf("no raylet process for node %s", node)
	return 0
}

func TestRayPool(t *testing.T) {
	if os.Getenv("LOOPS_TEST_RAY") != "1" {
		t.Skip("needs a local Ray cluster: make test-ray")
	}
	dash, py := os.Getenv("LOOPS_RAY_ADDRESS"), os.Getenv("LOOPS_RAY_PYTHON")
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t0 := time.Now()
	dataDir := t.TempDir()
	srv, err := gateway.New(ctx, ln, gateway.Config{DataDir: dataDir, Backend: backendName, BackendConfig: backends.Config{
		Models: []string{"loops/tiny"},
		// the actors run on this host: they may use the gateway's checkpoint folders (the
		// local checkpoint store), as actors on other hosts would with a shared file system
		Options: map[string]string{"provider": "ray", "ray_address": dash, "ray_python": py, "registry_listen": "127.0.0.1:0",
			"gpus_per_replica": "1", "device": "cpu", "args": "--threads 1 --allow-dir " + dataDir, "heartbeat_timeout": "5s",
			"pythonpath": root + "/backends/torch:" + root + "/gen/python", "start_timeout": "10m", "preemptible": "true"}}})
	require.NoError(t, err)
	cold := time.Since(t0)
	t.Logf("FIGURE pool cold start (gateway start → first replica attached, Ray job submit + actor + model load): %.1fs", cold.Seconds())
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	beMu.Lock()
	b := be
	beMu.Unlock()
	prov, reg := b.Pools()
	pool := worker.PoolID("loops/tiny")

	// every membership change, logged with its time
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

	s := startDriver(t, ctx, py, root, ln.Addr().String())
	s.wait("ready")
	first := s.do("step", "step")
	s.do("step", "step")
	s.do("save s2", "saved")
	s.do("sample w2", "sampled")

	members := func(n int) {
		require.Eventually(t, func() bool { return len(reg.Members(pool)) == n }, 8*time.Minute, 100*time.Millisecond, "pool size %d", n)
		require.NoError(t, b.WaitReady(ctx))
	}
	t1 := time.Now()
	require.NoError(t, prov.ScalePool(ctx, pool, 3))
	members(3)
	t.Logf("FIGURE scale 1→3: %.1fs until 3 replicas registered and attached", time.Since(t1).Seconds())
	s.do("step", "step")
	s.do("sample w3", "sampled")
	t1 = time.Now()
	require.NoError(t, prov.ScalePool(ctx, pool, 1))
	members(1)
	t.Logf("FIGURE scale 3→1: %.1fs", time.Since(t1).Seconds())
	s.do("step", "step")
	s.do("save s4", "saved")
	drain(ups)

	// kill the worker actor's process while the script trains: Ray restarts it, a new
	// incarnation registers, the script reloads its last state and goes on
	name := "loops-" + pool + "-0"
	pid, _ := actor(t, dash, name)
	midTraining(t, s, ups, "an actor kill", func() {
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		t.Logf("killed actor %s (pid %d)", name, pid)
	})
	s.do("save s5", "saved")

	// kill the raylet of the node holding replica 0 while the script trains: Ray places the
	// replica's group on the other node
	_, node := actor(t, dash, name)
	rp := raylet(t, node)
	midTraining(t, s, ups, "a raylet kill", func() {
		require.NoError(t, syscall.Kill(rp, syscall.SIGKILL))
		t.Logf("killed raylet pid %d of node %s", rp, node)
	})
	s.do("sample w6", "sampled")
	last := s.do("step", "step")
	require.Less(t, last.Loss, first.Loss, "training went on: the loss fell across the failures")

	// The pool is preemptible, so the gateway kept step recovery: the losses of the replicas
	// dropped by the scale-down, the killed actor and the killed raylet cost no step. The
	// script never reloaded, no step failed, and a second client with the same seed and data,
	// undisturbed, takes the same steps to the same losses, bit for bit.
	s.mu.Lock()
	losses, errs, reloaded := append([]float64(nil), s.losses...), append([]string(nil), s.errors...), s.reloaded
	s.mu.Unlock()
	t.Logf("FIGURE the script saw %d errors (%v) and reloaded %d times over %d steps", len(errs), errs, reloaded, len(losses))
	require.Zero(t, reloaded, "no state was lost")
	require.NotContains(t, errs, "step", "no step failed")
	shadow := s.do(fmt.Sprintf("shadow %d", len(losses)), "shadow")
	require.Equal(t, losses, shadow.Losses, "the disturbed run's losses equal an undisturbed run's")
	reportRecovery(t, "http://"+ln.Addr().String())

	// dedicated runs: the first starts a pool of its own (a Ray job, an actor, a model load);
	// once its session ends the pool is kept warm, and the next binds it at once
	dedicatedPools := func() (ids []string) {
		for _, p := range reg.Pools() {
			if strings.HasPrefix(p, "ded-") {
				ids = append(ids, p)
			}
		}
		return ids
	}
	require.Empty(t, dedicatedPools())
	dcold := s.do("dedicated", "dedicated")
	t.Logf("FIGURE dedicated run, cold pool (Ray job submitted, actor placed, model loaded): %.1fs to create the run and take its first step", dcold.Secs)
	dfirst := dedicatedPools()
	require.Len(t, dfirst, 1, "the run had a pool of its own")
	warm := s.do("dedicated", "dedicated")
	t.Logf("FIGURE dedicated run, warm pool reused: %.2fs to create the run and take its first step (a step alone: %.2fs)", warm.Secs, last.Secs)
	require.Equal(t, dfirst, dedicatedPools(), "the second run bound the first one's pool, kept warm")
	require.Equal(t, dcold.Loss, warm.Loss, "the same first step on a fresh adapter")
	s.do("quit", "bye")
	require.NoError(t, prov.DeletePool(ctx, pool))
	// the warm dedicated pool too: its job would keep its actor (a GPU) on the cluster,
	// which the next test (TestRayShardedReplica) needs
	for _, id := range dfirst {
		require.NoError(t, prov.DeletePool(ctx, id))
	}
}

// midTraining has the script train until told to stop, kills something after its first
// step, and reports how long until a new incarnation registered and until the script's next
// step succeeded; then the script stops.
func midTraining(t *testing.T, s *script, ups chan pools.Event, what string, kill func()) {
	t.Helper()
	drain(ups)
	require.NoError(t, os.RemoveAll(s.stop))
	_, err := fmt.Fprintln(s.stdin, "steps 100000")
	require.NoError(t, err)
	s.wait("step")
	tk := time.Now()
	kill()
	var up pools.Event
	select {
	case up = <-ups:
		t.Logf("FIGURE failover after %s: %.1fs until the new incarnation registered", what, up.Time.Sub(tk).Seconds())
	case <-time.After(8 * time.Minute):
		t.Fatalf("no new incarnation within 8 minutes of %s", what)
	}
	for {
		// the first step done on the new incarnation (steps may still succeed on the old
		// one until its process notices the loss)
		l := s.wait("step")
		if l.T > float64(up.Time.UnixMilli())/1000 {
			t.Logf("FIGURE failover after %s: %.1fs until the script's first step on the new incarnation (step %d, loss %.4f, %.1fs in retries)", what, l.T-float64(tk.UnixMilli())/1000, l.Step, l.Loss, l.Secs)
			break
		}
	}
	require.NoError(t, os.WriteFile(s.stop, nil, 0o644))
	s.wait("steps_done")
	require.NoError(t, os.RemoveAll(s.stop))
}

func drain(ch chan pools.Event) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// reportRecovery prints the gateway's step recovery figures from its /metrics.
func reportRecovery(t *testing.T, base string) {
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	v := map[string]float64{}
	for _, l := range strings.Split(string(raw), "\n") {
		var name string
		var x float64
		if _, err := fmt.Sscanf(l, "%s %g", &name, &x); err == nil && strings.HasPrefix(name, "loops_step_") {
			v[name] = x
		}
	}
	mean := func(m string) float64 {
		if v[m+"_count"] == 0 {
			return 0
		}
		return v[m+"_sum"] / v[m+"_count"]
	}
	t.Logf("FIGURE step snapshots: %.0f stored, mean %.0f ms each (beside the next step, not in it)", v["loops_step_snapshot_seconds_count"], 1000*mean("loops_step_snapshot_seconds"))
	t.Logf("FIGURE adapter rebuilds: %.0f, mean %.2f s each (waiting for a replica, loading the snapshot, replaying), %.0f calls replayed",
		v["loops_step_rebuild_seconds_count"], mean("loops_step_rebuild_seconds"), v["loops_step_recovery_replayed_calls_total"])
}
