package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
)

func workspaceCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "workspace",
		Short: "Show the API key's workspace: its limits and current use",
		Long: "Show the workspace of the API key: the base models it may use (with its limits on\n" +
			"each, access grants included), its limits on runs, queued operations and sampling, and\n" +
			"what it uses now; `loops access request` asks a workspace admin for more.\n" +
			"The server's --workspace-policy sets the limits; \"none\" means no limit of the\n" +
			"workspace's own. Under a price sheet (loops serve --prices), its budgets\n" +
			"(budget_usd_month, budget_usd_total) show with what was spent, the work running and\n" +
			"the alerts crossed (50%, 80%, 100%; each also in `loops audit --resource budget`),\n" +
			"and so do the budgets of its API keys (loops keys update --budget-usd-month/total).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, cf.url, cf.options()...)
			ws, err := cl.GetWorkspace(cmd.Context(), &loopsv1.GetWorkspaceRequest{})
			if err != nil {
				return err
			}
			return printWorkspace(os.Stdout, ws)
		},
	}
	cf.register(cmd)
	return cmd
}

// budgetUse is a budget's spend, its period, the work running and the alerts crossed:
// "0.000014 of 0.00002 USD spent in 2026-12 (70%), 0 running; alerts: 50%".
func budgetUse(b *loopsv1.WorkspaceBudget) string {
	s := fmt.Sprintf("%s of %s USD spent", b.GetSpentUsd(), b.GetLimitUsd())
	if b.GetPeriod() != "" {
		s += " in " + b.GetPeriod()
	}
	s += ", " + b.GetReservedUsd() + " running"
	if a := b.GetAlerts(); len(a) > 0 {
		parts := make([]string, len(a))
		for i, p := range a {
			parts[i] = fmt.Sprintf("%d%%", p)
		}
		s += "; alerts: " + strings.Join(parts, ", ")
	}
	return s
}

// printWorkspace writes the workspace's limits beside its use, then its models.
func printWorkspace(w io.Writer, ws *loopsv1.Workspace) error {
	l, u := ws.GetLimits(), ws.GetUse()
	limit := func(n int32) string {
		if n <= 0 {
			return "none"
		}
		return strconv.Itoa(int(n))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "WORKSPACE %s\n\n", ws.GetName())
	fmt.Fprintln(tw, "LIMIT\tVALUE\tIN USE")
	fmt.Fprintf(tw, "max_concurrent_runs\t%s\t%d live\n", limit(l.GetMaxConcurrentRuns()), u.GetLiveRuns())
	fmt.Fprintf(tw, "max_queued_operations\t%s\t%d queued or running\n", limit(l.GetMaxQueuedOperations()), u.GetQueuedOperations())
	fmt.Fprintf(tw, "sampling_concurrency\t%s\t%d running, %d waiting\n", limit(l.GetSamplingConcurrency()), u.GetRunningSamples(), u.GetWaitingSamples())
	fmt.Fprintf(tw, "max_sequence_length\t%s\n", limit(l.GetMaxSequenceLength()))
	fmt.Fprintf(tw, "max_lora_rank\t%s\n", limit(l.GetMaxLoraRank()))
	if m := l.GetAllowedModalities(); len(m) > 0 {
		fmt.Fprintf(tw, "allowed_modalities\t%s\n", strings.Join(m, ", "))
	}
	fmt.Fprintf(tw, "allow_full_finetune\t%s\n", yesNo(l.GetAllowFullFinetune()))
	for _, b := range ws.GetBudgets() {
		fmt.Fprintf(tw, "%s\t%s USD\t%s\n", b.GetName(), b.GetLimitUsd(), budgetUse(b))
	}
	for _, b := range ws.GetKeyBudgets() {
		fmt.Fprintf(tw, "%s of %s\t%s USD\t%s\n", b.GetName(), b.GetKeyId(), b.GetLimitUsd(), budgetUse(b))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "MODEL\tMAX SEQ LEN\tMAX LORA RANK")
	for _, m := range l.GetModels() {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", m.GetName(), m.GetMaxSequenceLength(), m.GetMaxLoraRank())
	}
	if len(l.GetModels()) == 0 {
		fmt.Fprintln(tw, "(no models)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\nNeed more (another model, longer sequences, a larger rank, more runs, full fine-tuning)? Ask a workspace admin:\n"+
		`  loops access request --model M [--max-seq-len N] [--max-rank R] [--runs K] [--full-finetune] --reason "..."`)
	return err
}

// yesNo writes a policy switch.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
