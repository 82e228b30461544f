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
			AllowedModalities: []string{"text"},
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
		"allowed_modalities     text",
		"allow_full_finetune    no",
		"",
		"MODEL       MAX SEQ LEN  MAX LORA RANK",
		"loops/tiny  128          8",
		"",
		"Need more (another model, longer sequences, a larger rank, more runs, full fine-tuning)? Ask a workspace admin:",
		`  loops access request --model M [--max-seq-len N] [--max-rank R] [--runs K] [--full-finetune] --reason "..."`,
		"",
	}, "\n"), out.String())
}

// TestBudgetsShown: a workspace's budget and its API key's, each with its spend and the
// alerts crossed, in loops workspace, loops keys list (spent/budget and the last alert) and
// loops keys show.
func TestBudgetsShown(t *testing.T) {
	kb := &loopsv1.WorkspaceBudget{Name: "budget_usd_total", LimitUsd: "0.00005", SpentUsd: "0.000048", ReservedUsd: "0", KeyId: "key-0123456789abcdef", Alerts: []int32{50, 80}}
	var out strings.Builder
	require.NoError(t, printWorkspace(&out, &loopsv1.Workspace{
		Name:       "team-k",
		Budgets:    []*loopsv1.WorkspaceBudget{{Name: "budget_usd_month", LimitUsd: "10", SpentUsd: "1.5", ReservedUsd: "0.25", Period: "2026-12"}},
		KeyBudgets: []*loopsv1.WorkspaceBudget{kb},
	}))
	require.Contains(t, out.String(), "budget_usd_month                          10 USD       1.5 of 10 USD spent in 2026-12, 0.25 running\n")
	require.Contains(t, out.String(), "budget_usd_total of key-0123456789abcdef  0.00005 USD  0.000048 of 0.00005 USD spent, 0 running; alerts: 50%, 80%\n")

	k := &loopsv1.ApiKey{Id: kb.GetKeyId(), BudgetUsdMonth: "25.5", BudgetUsdTotal: "0.00005", BudgetStatus: []*loopsv1.WorkspaceBudget{kb}}
	require.Equal(t, "0.000048/0.00005 USD !80%", keyBudget(k, "budget_usd_total"))
	require.Equal(t, "25.5 USD", keyBudget(k, "budget_usd_month"), "no spend reported for it: the budget alone")
	require.Equal(t, "-", keyBudget(&loopsv1.ApiKey{}, "budget_usd_total"))
	require.Equal(t, "0.00005 USD: 0.000048 of 0.00005 USD spent, 0 running; alerts: 50%, 80%", keyBudgetUse(k, "budget_usd_total"))
}
