package core

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestWorkspacePolicyReloaded: with the policy's file (Options.PolicyFile), a change of the
// file is in force at the core's next poll, without a restart: a workspace at its
// max_concurrent_runs gets another run once the operator raises it. A changed file that
// does not parse, or names a model the gateway does not serve, is refused and the policy in
// force kept.
func TestWorkspacePolicyReloaded(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	edit := func(body string, age time.Duration) { // an older stamp for each edit: a change
		require.NoError(t, os.WriteFile(file, []byte(body), 0o600))
		at := time.Now().Add(-age)
		require.NoError(t, os.Chtimes(file, at, at))
	}
	edit("workspaces:\n  ws-a: {max_concurrent_runs: 1}\n", time.Hour)
	w, err := policy.Watch(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	h := newHarness(t, dir, Options{PolicyFile: w})
	h.newRun()
	create := func() error {
		_, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
		return err
	}
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(create()), "one run at most")

	edit("workspaces:\n  ws-a: {max_concurrent_runs: 2}\n", 50*time.Minute)
	h.core.reloadPolicy()
	require.NoError(t, create(), "raised without a restart")
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(create()), "two at most")

	for i, bad := range []string{
		"workspaces:\n  ws-a: {max_concurrent_runs: many}\n",                // does not parse
		"workspaces:\n  ws-a: {models: [Qwen/*], max_concurrent_runs: 3}\n", // no model served
	} {
		edit(bad, time.Duration(40-10*i)*time.Minute)
		h.core.reloadPolicy()
		require.Equal(t, 2, h.core.Policy().Limits("ws-a").MaxConcurrentRuns, "the policy in force kept")
	}
}
