package main

import (
	"strings"
	"testing"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

func TestPrintWorkspaceShowsLimitsBesideUse(t *testing.T) {
	var out strings.Builder
	require.NoError(t, printWorkspace(&out, &loopsv1.Workspace{
		Name: "team-a",
		Limits: &loopsv1.WorkspaceLimits{
			Models:            []*loopsv1.ModelInfo{{Name: "loops/tiny", MaxSequenceLength: 128, MaxLoraRank: 8}},
			MaxLoraRank:       8,
			MaxConcurrentRuns: 2, MaxQueuedOperations: 100, MaxSequenceLength: 128,
		},
		Use: &loopsv1.WorkspaceUse{LiveRuns: 1, QueuedOperations: 3, RunningSamples: 1, WaitingSamples: 2},
	}))
	require.Equal(t, strings.Join([]string{
		"WORKSPACE team-a",
		"",
		"LIMIT                  VALUE  IN USE",
		"max_concurrent_runs    2      1 live",
		"max_queued_operations  100    3 queued or running",
		"sampling_concurrency   none   1 running, 2 waiting",
		"max_sequence_length    128",
		"max_lora_rank          8",
		"",
		"MODEL       MAX SEQ LEN  MAX LORA RANK",
		"loops/tiny  128          8",
		"",
		"Need more (another model, longer sequences, a larger rank, more runs)? Ask a workspace admin:",
		`  loops access request --model M [--max-seq-len N] [--max-rank R] [--runs K] --reason "..."`,
		"",
	}, "\n"), out.String())
}
