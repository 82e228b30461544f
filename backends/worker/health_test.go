package worker

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools/poolstest"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestNotServingWorkerIsDown: the health checks ask the worker's grpc.health.v1 service
// (over the worker protocol's mutual TLS): a remote worker that answers NOT_SERVING
// (shutting down, or its engine broke) is declared down after HealthFailures checks, its
// calls answer Unavailable and WorkerHealth counts it down; once it serves again it is
// back.
func TestNotServingWorkerIsDown(t *testing.T) {
	dir := t.TempDir()
	fw, err := poolstest.StartFakeWorker("127.0.0.1:0", []string{"m"}, poolstest.Credentials(t, authority(t, dir), PoolID("m")))
	require.NoError(t, err)
	t.Cleanup(fw.Close)
	b, err := New(t.Context(), Options{DataDir: dir, Models: []string{"m"}, Workers: []string{fw.Addr},
		HealthInterval: 50 * time.Millisecond, HealthTimeout: 2 * time.Second, HealthFailures: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	up, down := b.WorkerHealth()
	require.Equal(t, [2]int{1, 0}, [2]int{up, down})

	fw.Health.SetStatus("", grpchealth.StatusNotServing)
	require.Eventually(t, func() bool { up, down = b.WorkerHealth(); return up == 0 && down == 1 }, 10*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err = b.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: "m", Lora: &loopsv1.LoraConfig{Rank: 1, TrainAttn: true}})
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "NOT_SERVING")

	fw.Health.SetStatus("", grpchealth.StatusServing)
	require.Eventually(t, func() bool { up, down = b.WorkerHealth(); return up == 1 && down == 0 }, 10*time.Second, 20*time.Millisecond)
}
