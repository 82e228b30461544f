package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/money"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func usageCmd() *cobra.Command {
	var cf clientFlags
	var (
		since string
		view  usageView
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show the API key's metered usage by hour or day, with totals per kind and costs",
		Long: "Show the workspace's metered usage (training tokens, sampling prompt and generated tokens,\n" +
			"checkpoint saves, dedicated replica and GPU seconds) in hour (or --by-day day) buckets, summed\n" +
			"over sessions (--by-key: one row per API key; --by-run: per training run), and the totals per kind. --cost adds what it cost in exact US dollars, each\n" +
			"part priced with the server's price sheet in force when it was metered (loops serve --prices;\n" +
			"docs/operations.md, \"Prices\"); usage metered with no price for it shows \"-\".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := parseSince(since)
			if err != nil {
				return err
			}
			end := time.Now()
			cl := loopsv1connect.NewUsageServiceClient(http.DefaultClient, cf.url, cf.options()...)
			resp, err := cl.GetUsage(cmd.Context(), &loopsv1.GetUsageRequest{
				StartTime: timestamppb.New(end.Add(-d)), EndTime: timestamppb.New(end),
			})
			if err != nil {
				return err
			}
			return printUsage(cmd.OutOrStdout(), resp.GetBuckets(), view)
		},
	}
	cmd.Flags().StringVar(&since, "since", "24h", "how far back to look: a Go duration, or a number of days such as 7d (at most 366d)")
	cmd.Flags().BoolVar(&view.cost, "cost", false, "add what each row and kind cost (exact USD) and the total cost")
	cmd.Flags().BoolVar(&view.byDay, "by-day", false, "one row per UTC day instead of per hour")
	cmd.Flags().BoolVar(&view.byKey, "by-key", false, "one row per API key (its id, as loops keys names it; - for usage no request did)")
	cmd.Flags().BoolVar(&view.byRun, "by-run", false, "one row per training run for checkpoint storage and dedicated pool time (- for usage kept per session)")
	cf.register(cmd)
	cmd.AddCommand(checkpointStorageCmd())
	return cmd
}

// parseSince parses a positive Go duration or a whole number of days ("7d").
func parseSince(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, fmt.Errorf("--since %q: want a duration such as 24h or a number of days such as 7d", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("--since %q: want a duration such as 24h or a number of days such as 7d", s)
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("--since %q: must be positive", s)
	}
	return d, nil
}

// usageKindNames are the short names the table shows.
var usageKindNames = map[loopsv1.UsageKind]string{
	loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS:                "training_tokens",
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS:        "sampling_prefill_tokens",
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS: "sampling_cached_prefill_tokens",
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:         "sampling_sample_tokens",
	loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS:                    "checkpoints",
	loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS:      "dedicated_replica_seconds",
	loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS:          "dedicated_gpu_seconds",
	loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS:        "checkpoint_byte_seconds",
}

func usageKindName(k loopsv1.UsageKind) string {
	if n, ok := usageKindNames[k]; ok {
		return n
	}
	return k.String()
}

// usageView is how printUsage lays usage out: with costs, by day instead of by hour, with a
// row per API key, and per training run.
type usageView struct {
	cost, byDay, byKey, byRun bool
}

// printUsage writes one row per (bucket, model, deployment, kind), summed over sessions, in
// bucket order (hours, or days with v.byDay), then the total of each kind; with v.cost a
// COST column (exact USD; "-" unpriced, "*" partly priced) and the total cost. The
// DEPLOYMENT column (usage sampled through a deployment, "<owner>:<name>") is shown only
// when some usage has one.
func printUsage(w io.Writer, buckets []*loopsv1.UsageBucket, v usageView) error {
	type row struct {
		start      time.Time
		model      string
		deployment string
		key, run   string
		kind       loopsv1.UsageKind
	}
	sums := map[row]*money.Tally{}
	totals := map[loopsv1.UsageKind]*money.Tally{}
	var all money.Tally
	deployments, partly := false, false
	for _, b := range buckets {
		start := b.GetStartTime().AsTime().UTC()
		if v.byDay {
			start = start.Truncate(24 * time.Hour)
		}
		r := row{start: start, model: b.GetBaseModel(), deployment: b.GetDeployment(), kind: b.GetKind()}
		if v.byKey {
			r.key = b.GetKeyId()
		}
		if v.byRun {
			r.run = b.GetTrainingRunId()
		}
		if sums[r] == nil {
			sums[r] = &money.Tally{}
		}
		if totals[b.GetKind()] == nil {
			totals[b.GetKind()] = &money.Tally{}
		}
		sums[r].Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
		totals[b.GetKind()].Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
		all.Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
		deployments = deployments || b.GetDeployment() != ""
	}
	if v.cost && all.Err != nil {
		return all.Err
	}
	rows := make([]row, 0, len(sums))
	for r := range sums {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b row) int {
		if c := a.start.Compare(b.start); c != 0 {
			return c
		}
		if c := strings.Compare(a.model, b.model); c != 0 {
			return c
		}
		if c := strings.Compare(a.deployment, b.deployment); c != 0 {
			return c
		}
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		if c := strings.Compare(a.run, b.run); c != 0 {
			return c
		}
		return int(a.kind) - int(b.kind)
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	dep := func(d string) string {
		if !deployments {
			return ""
		}
		if d == "" {
			d = "-"
		}
		return d + "\t"
	}
	cost := func(c *money.Tally) string {
		if !v.cost {
			return ""
		}
		partly = partly || (c.Priced > 0 && c.Priced < c.Amount)
		return "\t" + c.Text("-")
	}
	bucket, layout := "BUCKET (UTC)", "2006-01-02 15:04"
	if v.byDay {
		bucket, layout = "DAY (UTC)", "2006-01-02"
	}
	column := func(on bool, id string) string { // a KEY or RUN cell
		if !on {
			return ""
		}
		if id == "" {
			id = "-"
		}
		return id + "\t"
	}
	fmt.Fprintf(tw, "%s\tMODEL\t%s%s%sKIND\tAMOUNT%s\n", bucket, map[bool]string{true: "DEPLOYMENT\t"}[deployments], map[bool]string{true: "KEY\t"}[v.byKey],
		map[bool]string{true: "RUN\t"}[v.byRun], map[bool]string{true: "\tCOST (USD)"}[v.cost])
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s%s%s%s\t%d%s\n", r.start.Format(layout), r.model, dep(r.deployment), column(v.byKey, r.key), column(v.byRun, r.run),
			usageKindName(r.kind), sums[r].Amount, cost(sums[r]))
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no usage in this range)")
	}
	pad := map[bool]string{true: "\t"}[deployments] + map[bool]string{true: "\t"}[v.byKey] + map[bool]string{true: "\t"}[v.byRun]
	kinds := make([]loopsv1.UsageKind, 0, len(totals))
	for k := range totals {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		fmt.Fprintf(tw, "TOTAL\t\t%s%s\t%d%s\n", pad, usageKindName(k), totals[k].Amount, cost(totals[k]))
	}
	if v.cost {
		// Summed over kinds: "-" when nothing was priced, "*" when some kind was partly.
		total := "-"
		if all.Priced > 0 {
			total = all.Cost.String() + map[bool]string{true: "*"}[partly]
		}
		fmt.Fprintf(tw, "TOTAL COST\t\t%s\t\t%s\n", pad, total)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case v.cost && all.Priced == 0:
		_, err := fmt.Fprintln(w, "(no cost: the server has no price sheet, or it prices none of this usage)")
		return err
	case partly:
		_, err := fmt.Fprintln(w, "* only part of the amount was priced (usage metered while no price sheet priced it); the cost is that part's")
		return err
	}
	return nil
}
