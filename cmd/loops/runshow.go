package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"text/tabwriter"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/money"
	"github.com/loops-dev/loops/internal/runcost"
	"github.com/loops-dev/loops/internal/runhealth"
	"github.com/spf13/cobra"
)

// runsShowCmd is `loops runs show RUN`: the run, sparklines of its loss and KL over its
// whole history, and a table of its last steps.
func runsShowCmd(cf *clientFlags) *cobra.Command {
	var (
		last  int
		width int32
	)
	cmd := &cobra.Command{
		Use:   "show RUN",
		Short: "Show a training run and its per-step metrics (loss, KL between sampler and trainer, learning rate)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, cf.url, cf.options()...)
			run, err := cl.GetTrainingRun(cmd.Context(), &loopsv1.GetTrainingRunRequest{Id: args[0]})
			if err != nil {
				return err
			}
			all, err := cl.GetTrainingRunMetrics(cmd.Context(), &loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: run.GetId(), MaxPoints: width})
			if err != nil {
				return err
			}
			recent, err := cl.GetTrainingRunMetrics(cmd.Context(), &loopsv1.GetTrainingRunMetricsRequest{
				TrainingRunId: run.GetId(), FromStep: max(run.GetOptimSteps()+1-int64(last), 1),
			})
			if err != nil {
				return err
			}
			if err := printRunShow(cmd.OutOrStdout(), run, all.GetSteps(), recent.GetSteps()); err != nil {
				return err
			}
			if err := printRunStorage(cmd, cf, run.GetId(), run.GetSessionId()); err != nil {
				return err
			}
			ev := loopsv1connect.NewEvalServiceClient(http.DefaultClient, cf.url, cf.options()...)
			res, err := ev.ListEvalResults(cmd.Context(), &loopsv1.ListEvalResultsRequest{TrainingRunId: run.GetId()})
			if err != nil {
				return err
			}
			if len(res.GetResults()) == 0 {
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return printEvalResults(cmd.OutOrStdout(), res.GetResults(), false)
		},
	}
	cmd.Flags().IntVar(&last, "last", 20, "how many of the last steps to list")
	cmd.Flags().Int32Var(&width, "width", 60, "points in each sparkline")
	return cmd
}

// printRunShow writes a run's summary, its health alerts (runhealth.Check on the recent
// steps), sparklines of the forward_backward loss (per-token
// mean) and KL (k3) over history, and a table of the steps in recent, one line per step.
func printRunShow(w io.Writer, run *loopsv1.TrainingRun, history, recent []*loopsv1.StepMetrics) error {
	fmt.Fprintf(w, "run:         %s\n", run.GetId())
	fmt.Fprintf(w, "base model:  %s (rank %d)\n", run.GetBaseModel(), run.GetLora().GetRank())
	fmt.Fprintf(w, "optim steps: %d\n", run.GetOptimSteps())
	if run.GetCorrupted() {
		fmt.Fprintln(w, "corrupted:   yes (load a checkpoint to continue)")
	}
	for _, a := range runhealth.Check(recent) {
		fmt.Fprintf(w, "ALERT %s: %s\n      usually: %s\n", a.Rule, a.Message, a.Cause)
	}
	var loss, kl, costs []float64
	var total money.USD
	priced := false
	for _, s := range history {
		if s.GetKind() != loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD {
			continue
		}
		c, ok, err := stepCost(s)
		if err != nil {
			return err
		}
		if ok {
			if total, err = money.Add(total, c); err != nil {
				return fmt.Errorf("summing the run's cost: %w", err)
			}
			priced = true
		}
		costs = append(costs, float64(c)) // the sparkline's shape only
		loss = append(loss, s.GetLossMean())
		if s.GetRl() != nil {
			kl = append(kl, s.GetRl().GetKlSampleTrainK3())
		}
	}
	if len(loss) == 0 {
		fmt.Fprintln(w, "no step metrics recorded yet")
		return nil
	}
	if priced {
		fmt.Fprintf(w, "cost:        %s USD of training tokens (priced with the server's price sheet)\n", total)
	}
	fmt.Fprintf(w, "loss  %s  %s\n", sparkline(loss), spanOf(loss))
	if priced {
		fmt.Fprintf(w, "cost  %s  per step\n", sparkline(costs))
	}
	if len(kl) > 0 {
		fmt.Fprintf(w, "kl    %s  %s\n", sparkline(kl), spanOf(kl))
	}
	fmt.Fprintln(w)

	// One row per step: its forward_backward records summed, its optim_step's rate.
	type row struct {
		step, fbs                    int64
		lossFn                       string
		lossSum, backend             float64
		lossTokens, tokens, examples int64
		rl                           *loopsv1.RLStepMetrics
		lr, gradNorm, updateNorm     *float64
		cost                         money.USD
		priced                       bool
	}
	anyCost := false
	var rows []*row
	byStep := map[int64]*row{}
	for _, s := range recent {
		r := byStep[s.GetStep()]
		if r == nil {
			r = &row{step: s.GetStep()}
			byStep[s.GetStep()] = r
			rows = append(rows, r)
		}
		r.backend += s.GetBackendSeconds()
		switch s.GetKind() {
		case loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD:
			r.fbs += max(s.GetCount(), 1)
			if r.lossFn == "" {
				r.lossFn = s.GetLossFn()
			}
			r.lossSum += s.GetLossSum()
			r.lossTokens += s.GetLossTokens()
			r.tokens += s.GetTokens()
			r.examples += s.GetExamples()
			if c, ok, err := stepCost(s); err != nil {
				return err
			} else if ok {
				if r.cost, err = money.Add(r.cost, c); err != nil {
					return fmt.Errorf("summing step %d's cost: %w", r.step, err)
				}
				r.priced, anyCost = true, true
			}
			if s.GetRl() != nil {
				r.rl = s.GetRl() // the step's last RL record
			}
		case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
			r.lr, r.gradNorm, r.updateNorm = s.LearningRate, s.GradNorm, s.UpdateNorm
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STEP\tFB\tLOSS FN\tLOSS/TOKEN\tTOKENS\tEXAMPLES\tKL(k3)\tRATIO\tADV ZERO\tCLIP\tLR\tGRAD NORM\tUPD NORM\tBACKEND%s\n", map[bool]string{true: "\tCOST (USD)"}[anyCost])
	for _, r := range rows {
		mean := "-"
		if r.lossTokens > 0 {
			mean = fmt.Sprintf("%.4f", r.lossSum/float64(r.lossTokens))
		}
		kl, ratio, zero, clip := "-", "-", "-", "-"
		if r.rl != nil {
			kl = fmt.Sprintf("%.4g", r.rl.GetKlSampleTrainK3())
			ratio = fmt.Sprintf("%.3f±%.3f", r.rl.GetRatioMean(), r.rl.GetRatioStd())
			zero = fmt.Sprintf("%.0f%%", 100*r.rl.GetZeroAdvantageFraction())
			if r.rl.ClipFraction != nil {
				clip = fmt.Sprintf("%.1f%%", 100*r.rl.GetClipFraction())
			}
		}
		cost := ""
		if anyCost {
			cost = "\t-"
			if r.priced {
				cost = "\t" + r.cost.String()
			}
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3fs%s\n", r.step, r.fbs, dash(r.lossFn), mean, r.tokens, r.examples,
			kl, ratio, zero, clip, optionalG(r.lr), optionalG(r.gradNorm), optionalG(r.updateNorm), r.backend, cost)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func optionalG(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3g", *v)
}

// spanOf is "first → last (min … max)" of a series.
func spanOf(v []float64) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return fmt.Sprintf("%.4g → %.4g (min %.4g, max %.4g)", v[0], v[len(v)-1], lo, hi)
}

// sparkBlocks are a sparkline's eight levels.
var sparkBlocks = []rune("▁▂▃▄▅▆▇█")

// sparkline draws v with one block per value, scaled between its minimum and maximum
// (a flat series is drawn at the lowest level; NaN and infinities as a space).
func sparkline(v []float64) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	var b strings.Builder
	for _, x := range v {
		switch {
		case math.IsNaN(x) || math.IsInf(x, 0):
			b.WriteRune(' ')
		case hi <= lo:
			b.WriteRune(sparkBlocks[0])
		default:
			i := int(math.Round((x - lo) / (hi - lo) * float64(len(sparkBlocks)-1)))
			b.WriteRune(sparkBlocks[i])
		}
	}
	return b.String()
}

// printRunStorage writes what the run's checkpoints take in the checkpoint store, and what
// the workspace's retention will delete (retention_delete_time set).
func printRunStorage(cmd *cobra.Command, cf *clientFlags, runID, sessionID string) error {
	cl := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, cf.url, cf.options()...)
	var n, pending int
	var total, pendingBytes int64
	token := ""
	for range 100 { // at most 100 pages of 1000
		res, err := cl.ListCheckpoints(cmd.Context(), &loopsv1.ListCheckpointsRequest{TrainingRunId: runID, Limit: 1000, PageToken: token})
		if err != nil {
			return err
		}
		for _, ck := range res.GetCheckpoints() {
			n++
			total += ck.GetSizeBytes()
			if ck.GetRetentionDeleteTime() != nil {
				pending++
				pendingBytes += ck.GetSizeBytes()
			}
		}
		if token = res.GetNextPageToken(); token == "" {
			break
		}
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "\nstorage:     %d checkpoints, %s", n, mib(total))
	if pending > 0 {
		fmt.Fprintf(w, " (%d, %s, to be deleted by the workspace's retention)", pending, mib(pendingBytes))
	}
	fmt.Fprintln(w)
	usage, err := loopsv1connect.NewUsageServiceClient(http.DefaultClient, cf.url, cf.options()...).GetUsage(cmd.Context(), &loopsv1.GetUsageRequest{})
	if err != nil {
		return err
	}
	return printRunCosts(w, usage.GetBuckets(), runID, sessionID)
}

// printRunCosts writes what the run's checkpoint storage and its dedicated pool's time cost
// in buckets (the last 30 days) (runcost.Of): the run's own storage, and its session's
// storage metered before storage was metered per run, said apart.
func printRunCosts(w io.Writer, buckets []*loopsv1.UsageBucket, runID, sessionID string) error {
	c := runcost.Of(buckets, runID, sessionID)
	for _, line := range []struct {
		format string
		t      money.Tally
	}{
		{"storage cost: %s USD for the run's checkpoints held in the last 30 days (metered by the hour)\n", c.Storage},
		{"              and %s USD for its session's checkpoints metered before storage was metered per run\n", c.SessionStorage},
		{"pool cost:    %s USD for its dedicated pool's time in the last 30 days\n", c.Pool},
	} {
		if line.t.Err != nil {
			return fmt.Errorf("summing the run's cost: %w", line.t.Err)
		}
		if line.t.Priced > 0 {
			fmt.Fprintf(w, line.format, line.t.Cost)
		}
	}
	return nil
}

// mib writes a byte count in MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// stepCost is a step record's cost, and whether it has one.
func stepCost(s *loopsv1.StepMetrics) (money.USD, bool, error) {
	if s.GetCostUsd() == "" {
		return 0, false, nil
	}
	c, err := money.ParseUSD(s.GetCostUsd(), money.Digits)
	if err != nil {
		return 0, false, fmt.Errorf("step %d's cost: %w", s.GetStep(), err)
	}
	return c, true, nil
}
