package main

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/replay"
	"github.com/spf13/cobra"
)

// runsReceiptCmd is `loops runs receipt RUN`: the run's whole receipt, as JSON
// (docs/receipts.md).
func runsReceiptCmd(cf *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "receipt RUN",
		Short: "Print a training run's receipt (JSON): client, base model revision, LoRA config and seed, every step's loss, config, optimizer parameters and batch hash, checkpoints",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rc := loopsv1connect.NewReceiptServiceClient(http.DefaultClient, cf.url, cf.options()...)
			rec, err := replay.Receipt(cmd.Context(), rc, args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), rec)
		},
	}
}

// runsReplayCmd is `loops runs replay RUN`: the run again, from its recorded batches, on a
// fresh run of the same base model, LoRA config and seed; it reports the first step whose
// loss differs (exit status 1), or that all matched.
func runsReplayCmd(cf *clientFlags) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "replay RUN",
		Short: "Replay a run that recorded its data (record_data) and report the first step whose loss differs, bit for bit",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := cf.options()
			cl := replay.Clients{
				Training:   loopsv1connect.NewTrainingServiceClient(http.DefaultClient, cf.url, opts...),
				Operations: loopsv1connect.NewOperationServiceClient(http.DefaultClient, cf.url, opts...),
				Receipts:   loopsv1connect.NewReceiptServiceClient(http.DefaultClient, cf.url, opts...),
			}
			progress := func(done, total int) {
				if !quiet {
					fmt.Fprintf(cmd.ErrOrStderr(), "\rreplayed %d steps of %d", done, total)
				}
			}
			rep, err := replay.Run(cmd.Context(), cl, args[0], progress)
			if !quiet {
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			if err := enc.Encode(rep); err != nil {
				return err
			}
			if !rep.Matched {
				return fmt.Errorf("replay of %s differs at seq_id %d (step %d): %s", rep.TrainingRunID, rep.FirstMismatch.SeqID, rep.FirstMismatch.Step, rep.FirstMismatch.Reason)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "all %d steps matched bit for bit (%d losses compared)\n", rep.Replayed, rep.ForwardBackwards)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress on stderr")
	return cmd
}
