package worker

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools/poolstest"
	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// startGoWorker starts a Go worker by hand (the test binary as loops worker) with
// credentials of the backend whose data dir is dir, and returns its address and process.
func startGoWorker(t *testing.T, dir string) (string, *exec.Cmd) {
	t.Helper()
	creds, err := authority(t, dir).Issue(PoolID(tiny.Name), 0)
	require.NoError(t, err)
	files, err := creds.Write(filepath.Join(t.TempDir(), "creds"))
	require.NoError(t, err)
	return poolstest.StartWorkerProcess(t, []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		testBinary(), append([]string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--threads", "1", "--allow-dir", dir}, files.Args()...)...)
}

// TestKilledWorkerAnswersAtOnce: when a worker is killed, a batch whose items are on it
// and on a healthy worker of the same model answers at once: the healthy worker's items
// with their results, the dead one's Unavailable (and the dead worker is marked down, its
// adapters lost), without waiting for the health checks (an hour apart here). Before, the
// dead worker's call slept HealthInterval × (HealthFailures+1) before answering, and the
// batch, with the healthy items, waited for it.
func TestKilledWorkerAnswersAtOnce(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	a, _ := startGoWorker(t, dir)
	b, victim := startGoWorker(t, dir)
	be, err := New(t.Context(), Options{Workers: []string{a, b}, DataDir: dir, HealthInterval: time.Hour, HealthTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	ctx := t.Context()
	lora := &loopsv1.LoraConfig{Rank: 2, Seed: 1, TrainAttn: true}
	for _, id := range []string{"on-a", "on-b"} {
		_, err := be.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: tiny.Name, Lora: lora})
		require.NoError(t, err)
	}
	// the adapter on the worker to kill, and the other
	healthy, doomed := "on-a", "on-b"
	if w, err := be.adapterWorker(healthy); err == nil && w.name() == "worker "+b {
		healthy, doomed = doomed, healthy
	}
	wd, err := be.adapterWorker(doomed)
	require.NoError(t, err)
	require.Equal(t, "worker "+b, wd.name(), "one adapter on each worker")
	require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
	_, _ = victim.Process.Wait()

	req := &backendv1.ForwardBackwardRequest{}
	for _, id := range []string{healthy, doomed} {
		req.Items = append(req.Items, &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 16, "cross_entropy")}})
	}
	type answer struct {
		resp *backendv1.ForwardBackwardResponse
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := be.Trainer().ForwardBackward(ctx, req)
		got <- answer{resp, err}
	}()
	var ans answer
	select {
	case ans = <-got:
	case <-time.After(time.Minute): // a hang check, not a timing claim: before, an hour
		t.Fatal("the batch waits on the dead worker")
	}
	require.NoError(t, ans.err)
	res := ans.resp.GetResults()
	require.NotNil(t, res[0].GetResult(), "the healthy worker's item: %v", res[0].GetError())
	require.Equal(t, int32(connect.CodeUnavailable), res[1].GetError().GetCode(), "the dead worker's item: %v", res[1])
	_, err = be.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: doomed})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "the dead worker is down and its adapter lost: %v", err)
}
