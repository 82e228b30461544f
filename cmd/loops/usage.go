package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func usageCmd() *cobra.Command {
	var cf clientFlags
	var since string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show the API key's metered usage by hour, with totals per kind",
		Long: "Show the workspace's metered usage (training tokens, sampling prompt and generated tokens,\n" +
			"checkpoint saves) in hour buckets, summed over sessions, and the totals per kind.",
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
			return printUsage(os.Stdout, resp.GetBuckets())
		},
	}
	cmd.Flags().StringVar(&since, "since", "24h", "how far back to look: a Go duration, or a number of days such as 7d (at most 366d)")
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
	loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS:           "training_tokens",
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS:   "sampling_prefill_tokens",
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:    "sampling_sample_tokens",
	loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS:               "checkpoints",
	loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS: "dedicated_replica_seconds",
	loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS:     "dedicated_gpu_seconds",
}

func usageKindName(k loopsv1.UsageKind) string {
	if n, ok := usageKindNames[k]; ok {
		return n
	}
	return k.String()
}

// printUsage writes one row per (bucket, model, deployment, kind), summed over sessions, in
// bucket order, then the total of each kind. The DEPLOYMENT column (usage sampled through a
// deployment, "<owner>:<name>") is shown only when some usage has one.
func printUsage(w io.Writer, buckets []*loopsv1.UsageBucket) error {
	type row struct {
		start      time.Time
		model      string
		deployment string
		kind       loopsv1.UsageKind
	}
	sums := map[row]int64{}
	totals := map[loopsv1.UsageKind]int64{}
	deployments := false
	for _, b := range buckets {
		sums[row{b.GetStartTime().AsTime().UTC(), b.GetBaseModel(), b.GetDeployment(), b.GetKind()}] += b.GetAmount()
		totals[b.GetKind()] += b.GetAmount()
		deployments = deployments || b.GetDeployment() != ""
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
	fmt.Fprintf(tw, "BUCKET (UTC)\tMODEL\t%sKIND\tAMOUNT\n", map[bool]string{true: "DEPLOYMENT\t"}[deployments])
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s%s\t%d\n", r.start.Format("2006-01-02 15:04"), r.model, dep(r.deployment), usageKindName(r.kind), sums[r])
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no usage in this range)")
	}
	kinds := make([]loopsv1.UsageKind, 0, len(totals))
	for k := range totals {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		fmt.Fprintf(tw, "TOTAL\t\t%s%s\t%d\n", map[bool]string{true: "\t"}[deployments], usageKindName(k), totals[k])
	}
	return tw.Flush()
}
