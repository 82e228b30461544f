package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/serve"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// goWorkerEnv, set to 1, makes the test binary the Go worker (serve.Main, what loops worker
// runs): the pool's worker_command is the test binary itself.
const goWorkerEnv = "LOOPS_TEST_GO_WORKER"

func init() {
	if os.Getenv(goWorkerEnv) == "1" {
		os.Exit(serve.Main(os.Args[1:]))
	}
}

// TestPoolsCommands drives loops pools list|show|scale|delete and loops allocations (table
// and --json) against loops serve with a local pool of two Go workers, an API key and an
// operator key: the run's adapter shows on its replica; a workspace key is refused with how
// to configure an operator key.
func TestPoolsCommands(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(goWorkerEnv, "1") // the workers inherit it; this process is past init
	t.Setenv("HF_HUB_CACHE", filepath.Join(dir, "hub"))
	t.Setenv(serve.LogLevelEnv, "WARN")
	t.Setenv("LOOPS_OPERATOR_KEY", "")
	const wsKey, opKey, pool = "tml-cli-workspace", "tml-cli-operator", "torch-loops-tiny"
	url, _ := startServe(t, dir, "--backend", "torch", "--api-key", wsKey, "--operator-key", opKey,
		"--backend-opt", "provider=local", "--backend-opt", "replicas=2",
		"--backend-opt", "worker_command="+os.Args[0], "--backend-opt", "args=--data-dir "+dir+" --threads 1")
	op := []string{"--url", url, "--operator-key", opKey}
	allocations := func(want int) *loopsv1.ListAllocationsResponse {
		t.Helper()
		var got loopsv1.ListAllocationsResponse
		require.Eventually(t, func() bool {
			out, err := runCLI(t, append([]string{"allocations", "--json"}, op...)...)
			require.NoError(t, err, out)
			require.NoError(t, protojson.Unmarshal([]byte(out), &got), out)
			attached := 0
			for _, a := range got.GetAllocations() {
				if a.GetState() == loopsv1.AllocationState_ALLOCATION_STATE_ATTACHED {
					attached++
				}
			}
			return len(got.GetAllocations()) == want && attached == want
		}, 60*time.Second, 100*time.Millisecond)
		return &got
	}
	allocations(2)

	out, err := runCLI(t, append([]string{"pools", "list"}, op...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "POOL              ROLE     BASE MODEL  PROVIDER  DESIRED  REGISTERED  GPUS/REPLICA  PREEMPTIBLE  GPU-SECONDS  REPLICA-SECONDS\n")
	require.Contains(t, out, "torch-loops-tiny  trainer  loops/tiny  local     2        2           0             false        0 ")

	// a run's adapter on its replica
	run := createRun(t, url, wsKey)
	got := allocations(2)
	var holder *loopsv1.Allocation
	for _, a := range got.GetAllocations() {
		if len(a.GetTrainingRunIds()) > 0 {
			require.Nil(t, holder, "one replica holds the adapter")
			holder = a
		}
	}
	require.NotNil(t, holder)
	require.Equal(t, []string{run}, holder.GetTrainingRunIds())
	out, err = runCLI(t, append([]string{"allocations"}, op...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "POOL              REPLICA  STATE     SINCE")
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, run) {
			line = l
		}
	}
	f := strings.Fields(line)
	require.GreaterOrEqual(t, len(f), 11, out)
	require.Equal(t, []string{pool, "attached"}, []string{f[0], f[2]}, line)
	require.Equal(t, []string{holder.GetAddress(), "1", run}, f[6:9], line)

	// refusals
	t.Setenv("LOOPS_OPERATOR_KEY", "")
	_, err = runCLI(t, "pools", "list", "--url", url, "--api-key", wsKey)
	require.ErrorContains(t, err, "permission_denied")
	require.ErrorContains(t, err, "--operator-key")
	_, err = runCLI(t, append([]string{"pools", "scale", pool, "--replicas", "2000"}, op...)...)
	require.ErrorContains(t, err, "between 0 and 1024")
	_, err = runCLI(t, append([]string{"pools", "scale", pool}, op...)...)
	require.ErrorContains(t, err, `"replicas" not set`)

	// scale 2 → 1 → 2, the key from the environment
	t.Setenv("LOOPS_OPERATOR_KEY", opKey)
	out, err = runCLI(t, "pools", "scale", pool, "--replicas", "1", "--url", url)
	require.NoError(t, err, out)
	require.Contains(t, out, "replicas          1 desired")
	allocations(1)
	out, err = runCLI(t, "pools", "scale", pool, "--replicas", "2", "--url", url)
	require.NoError(t, err, out)
	allocations(2)
	out, err = runCLI(t, "pools", "show", pool, "--url", url)
	require.NoError(t, err, out)
	require.Contains(t, out, "replicas          2 desired, 2 registered\n")
	require.Contains(t, out, "\nPOOL              REPLICA  STATE")
	require.Equal(t, 2, strings.Count(out, pool+"  "), out)

	out, err = runCLI(t, "pools", "delete", pool, "--url", url)
	require.NoError(t, err, out)
	require.Equal(t, "deleted pool "+pool+"\n", out)
	out, err = runCLI(t, "pools", "list", "--url", url)
	require.NoError(t, err, out)
	require.Contains(t, out, "(no pools)")
	out, err = runCLI(t, "allocations", "--url", url)
	require.NoError(t, err, out)
	require.Contains(t, out, "(no replicas)")
}

// withKey is a client option that sends key.
// createRun creates a training run of loops/tiny with key and returns its id once created.
func createRun(t *testing.T, url, key string) string {
	t.Helper()
	cl := withKey(key)
	created, err := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, cl).CreateTrainingRun(t.Context(),
		&loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.NoError(t, err)
	done, err := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, cl).WaitOperation(t.Context(),
		&loopsv1.WaitOperationRequest{Id: created.GetId(), Timeout: durationpb.New(60 * time.Second)})
	require.NoError(t, err)
	require.NotEmpty(t, done.GetTrainingRunId(), done.GetError().GetMessage())
	return done.GetTrainingRunId()
}

func withKey(key string) connect.ClientOption {
	return (&clientFlags{apiKey: key}).options()[0]
}
