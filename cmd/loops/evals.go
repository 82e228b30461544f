package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

const evalsHelp = `Evals score a run's sampler checkpoints on the server each time the run saves one
(or every N optimizer steps): a JSONL dataset plus a kind. See docs/evals.md.

  loops evals create heldout --kind nll --file heldout.jsonl    # {"prompt", "completion"}
  loops evals create arc --kind multiple_choice --file arc.jsonl  # {"prompt", "choices", "answer"}
  loops evals create math --kind generation --match regex --max-tokens 32 --stop "\n" --file m.jsonl
  loops evals create helpful --kind reward --reward-script reward.py --max-tokens 64 --file prompts.jsonl
  loops evals attach RUN heldout --every-n-steps 50
  loops evals list
  loops evals show heldout            # the eval and its results on every run

A tinker script attaches evals itself: create_lora_training_client(...,
user_metadata={"loops.evals": "heldout,arc"}).`

// evalKinds and evalMatches name the enum values on the command line.
var (
	evalKinds = map[string]loopsv1.EvalKind{
		"nll": loopsv1.EvalKind_EVAL_KIND_NLL, "multiple_choice": loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE,
		"generation": loopsv1.EvalKind_EVAL_KIND_GENERATION, "reward": loopsv1.EvalKind_EVAL_KIND_REWARD,
	}
	evalMatches = map[string]loopsv1.EvalMatch{
		"": loopsv1.EvalMatch_EVAL_MATCH_UNSPECIFIED, "exact": loopsv1.EvalMatch_EVAL_MATCH_EXACT,
		"contains": loopsv1.EvalMatch_EVAL_MATCH_CONTAINS, "regex": loopsv1.EvalMatch_EVAL_MATCH_REGEX,
	}
)

func evalsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "evals", Short: "Create evals and attach them to training runs; list their results", Long: evalsHelp}
	cf.register(cmd)
	client := func() loopsv1connect.EvalServiceClient {
		return loopsv1connect.NewEvalServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}
	var (
		kind, match, file, description string
		rewardFile                     string
		maxTokens                      int32
		stops                          []string
		every                          int64
	)
	create := &cobra.Command{
		Use:   "create NAME --kind nll|multiple_choice|generation|reward --file DATA.jsonl",
		Short: "Upload a JSONL dataset as an eval",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ok := evalKinds[kind]
			if !ok {
				return fmt.Errorf("--kind must be nll, multiple_choice or generation, got %q", kind)
			}
			m, ok := evalMatches[match]
			if !ok {
				return fmt.Errorf("--match must be exact, contains or regex, got %q", match)
			}
			data, err := readBounded(file, 4<<20)
			if err != nil {
				return err
			}
			var script []byte
			if rewardFile != "" {
				if script, err = readBounded(rewardFile, 64<<10); err != nil {
					return err
				}
			}
			for i, s := range stops {
				stops[i] = strings.ReplaceAll(s, `\n`, "\n")
			}
			e, err := client().CreateEval(cmd.Context(), &loopsv1.CreateEvalRequest{
				Name: args[0], Kind: k, Match: m, MaxTokens: maxTokens, Stop: stops, Description: description, Dataset: data,
				RewardScript: string(script),
			})
			if err != nil {
				return err
			}
			return printEvals(cmd.OutOrStdout(), []*loopsv1.Eval{e})
		},
	}
	create.Flags().StringVar(&kind, "kind", "", "nll, multiple_choice, generation or reward")
	create.Flags().StringVar(&rewardFile, "reward-script", "", "reward: a Python file defining reward(prompt, completion, info) -> float (run in the jobs sandbox)")
	create.Flags().StringVar(&file, "file", "", "the JSONL dataset (at most 4 MiB, 2000 rows)")
	create.Flags().StringVar(&match, "match", "", "generation: exact (default), contains or regex")
	create.Flags().Int32Var(&maxTokens, "max-tokens", 0, "generation: the most tokens generated per row (1-256; default 64)")
	create.Flags().StringArrayVar(&stops, "stop", nil, `generation: a stop string (repeat; "\n" is a newline)`)
	create.Flags().StringVar(&description, "description", "", "what the eval measures")
	_ = create.MarkFlagRequired("kind")
	_ = create.MarkFlagRequired("file")

	attach := &cobra.Command{
		Use:   "attach RUN EVAL",
		Short: "Run an eval on each sampler save of a training run",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := client().AttachEval(cmd.Context(), &loopsv1.AttachEvalRequest{TrainingRunId: args[0], EvalId: args[1], EveryNSteps: every})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "attached eval %s to run %s (every %d steps; 0: every sampler save)\n", a.GetEvalName(), a.GetTrainingRunId(), a.GetEveryNSteps())
			return err
		},
	}
	attach.Flags().Int64Var(&every, "every-n-steps", 0, "score a sampler save only when the run made this many optimizer steps since the last one scored")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the workspace's evals",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := client().ListEvals(cmd.Context(), &loopsv1.ListEvalsRequest{})
			if err != nil {
				return err
			}
			return printEvals(cmd.OutOrStdout(), res.GetEvals())
		},
	}
	show := &cobra.Command{
		Use:   "show EVAL",
		Short: "Show an eval and its results on every run",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := client().GetEval(cmd.Context(), &loopsv1.GetEvalRequest{Id: args[0]})
			if err != nil {
				return err
			}
			res, err := client().ListEvalResults(cmd.Context(), &loopsv1.ListEvalResultsRequest{EvalId: e.GetId()})
			if err != nil {
				return err
			}
			if err := printEvals(cmd.OutOrStdout(), []*loopsv1.Eval{e}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dataset sha256: %s\n\n", e.GetSha256())
			return printEvalResults(cmd.OutOrStdout(), res.GetResults(), true)
		},
	}
	del := &cobra.Command{
		Use:   "delete EVAL",
		Short: "Delete an eval and its attachments (results stay with their checkpoints)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := client().DeleteEval(cmd.Context(), &loopsv1.DeleteEvalRequest{Id: args[0]}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "deleted eval %s\n", args[0])
			return err
		},
	}
	cmd.AddCommand(create, attach, list, show, del)
	return cmd
}

// readBounded reads a file of at most limit bytes ("-": standard input).
func readBounded(path string, limit int64) ([]byte, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is more than %d bytes, the most an eval's dataset may be: split it into several evals", path, limit)
	}
	return b, nil
}

// kindName is an eval kind's command-line name.
func kindName(k loopsv1.EvalKind) string {
	for n, v := range evalKinds {
		if v == k {
			return n
		}
	}
	return k.String()
}

// printEvals writes one line per eval.
func printEvals(w io.Writer, es []*loopsv1.Eval) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tKIND\tROWS\tBYTES\tCREATED")
	for _, e := range es {
		k := kindName(e.GetKind())
		if e.GetKind() == loopsv1.EvalKind_EVAL_KIND_GENERATION {
			k += "/" + strings.ToLower(strings.TrimPrefix(e.GetMatch().String(), "EVAL_MATCH_"))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", e.GetId(), e.GetName(), k, e.GetRows(), e.GetSizeBytes(), e.GetCreateTime().AsTime().Format("2006-01-02 15:04:05"))
	}
	if len(es) == 0 {
		fmt.Fprintln(tw, "(no evals)")
	}
	return tw.Flush()
}

// printEvalResults writes one line per result, by step then eval (withRun: a run column).
func printEvalResults(w io.Writer, rs []*loopsv1.EvalResult, withRun bool) error {
	rs = append([]*loopsv1.EvalResult(nil), rs...)
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].GetStep() != rs[j].GetStep() {
			return rs[i].GetStep() < rs[j].GetStep()
		}
		return rs[i].GetEvalName() < rs[j].GetEvalName()
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "EVAL\tCHECKPOINT\tSTEP\tSTATE\tSCORE\tN\tMETRICS"
	if withRun {
		head = "RUN\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, r := range rs {
		state := strings.ToLower(strings.TrimPrefix(r.GetState().String(), "EVAL_RESULT_STATE_"))
		score, metrics := "-", ""
		if r.GetState() == loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED {
			score = fmt.Sprintf("%.4f", r.GetScore())
			keys := make([]string, 0, len(r.GetMetrics()))
			for k := range r.GetMetrics() {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				metrics += fmt.Sprintf("%s=%.4g ", k, r.GetMetrics()[k])
			}
		} else if r.GetError() != "" {
			metrics = r.GetError()
		}
		if withRun {
			fmt.Fprintf(tw, "%s\t", r.GetTrainingRunId())
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\n", r.GetEvalName(), r.GetCheckpointId(), r.GetStep(), state, score, r.GetN(), strings.TrimSpace(metrics))
	}
	if len(rs) == 0 {
		fmt.Fprintln(tw, "(no eval results)")
	}
	return tw.Flush()
}
