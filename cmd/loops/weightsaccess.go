package main

import (
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// checkpointsShareCmd is `loops checkpoints share`: weights-access tokens of the workspace's
// checkpoints (issue, list, revoke).
func checkpointsShareCmd(cf *clientFlags) *cobra.Command {
	var ttl time.Duration
	var description string
	cmd := &cobra.Command{
		Use:   "share PATH",
		Short: "Issue a weights-access token that lets another workspace copy one checkpoint",
		Long: "Issue a weights-access token for one of your checkpoints (tinker://…) and print its secret,\n" +
			"once: Loops keeps only its hash. Whoever holds it copies that checkpoint, and nothing else,\n" +
			"into their workspace: `loops checkpoints copy PATH --token SECRET`, or the tinker SDK's\n" +
			"copy_weights(PATH, weights_access_token=SECRET). It expires after --ttl; revoke it sooner with\n" +
			"`loops checkpoints share revoke ID`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: args[0], Description: description}
			if cmd.Flags().Changed("ttl") {
				s := int64(ttl / time.Second)
				req.TtlSeconds = &s
			}
			cl := loopsv1connect.NewWeightsAccessServiceClient(http.DefaultClient, cf.url, cf.options()...)
			res, err := cl.CreateWeightsAccessToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			t := res.GetWeightsAccessToken()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "token %s for %s, expires %s\n", t.GetId(), t.GetCheckpointPath(), t.GetExpireTime().AsTime().Format(time.RFC3339))
			fmt.Fprintf(out, "secret (shown once): %s\n", res.GetToken())
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 7*24*time.Hour, "how long the token works (1m to 8760h)")
	cmd.Flags().StringVar(&description, "description", "", "who the token is for (at most 256 bytes)")
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the workspace's live weights-access tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl := loopsv1connect.NewWeightsAccessServiceClient(http.DefaultClient, cf.url, cf.options()...)
			res, err := cl.ListWeightsAccessTokens(cmd.Context(), &loopsv1.ListWeightsAccessTokensRequest{})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCHECKPOINT\tEXPIRES\tBY\tDESCRIPTION")
			for _, t := range res.GetWeightsAccessTokens() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.GetId(), t.GetCheckpointPath(),
					t.GetExpireTime().AsTime().Format("2006-01-02 15:04:05"), t.GetCreatedBy(), t.GetDescription())
			}
			return tw.Flush()
		},
	}, &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a weights-access token: copies with it fail from now on (copies made stay)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := loopsv1connect.NewWeightsAccessServiceClient(http.DefaultClient, cf.url, cf.options()...)
			if _, err := cl.RevokeWeightsAccessToken(cmd.Context(), &loopsv1.RevokeWeightsAccessTokenRequest{Id: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", args[0])
			return nil
		},
	})
	return cmd
}

// checkpointsCopyCmd is `loops checkpoints copy`.
func checkpointsCopyCmd(cf *clientFlags) *cobra.Command {
	var token, project string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "copy PATH [--token SECRET] [--project NAME] [--ttl DURATION]",
		Short: "Copy a checkpoint into a new run of your workspace (another workspace's with its token)",
		Long: "Copy a checkpoint (tinker://…) into a new run of your workspace that holds the copy only:\n" +
			"your own, a public one, or another workspace's with the weights-access token its owner\n" +
			"issued (`loops checkpoints share`). The copy has its own files: the source being deleted\n" +
			"later does not affect it. Prints the copy's path. The token may also come from\n" +
			"LOOPS_WEIGHTS_ACCESS_TOKEN.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if token == "" {
				token = os.Getenv("LOOPS_WEIGHTS_ACCESS_TOKEN")
			}
			req := &loopsv1.CopyWeightsRequest{SourcePath: args[0], WeightsAccessToken: token, DestinationProjectId: project}
			if cmd.Flags().Changed("ttl") {
				s := int64(ttl / time.Second)
				req.TtlSeconds = &s
			}
			cl := loopsv1connect.NewWeightsAccessServiceClient(http.DefaultClient, cf.url, cf.options()...)
			res, err := cl.CopyWeights(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.GetTinkerPath())
			return nil
		},
	}
	cmd.Flags().StringVar(&token, "token", "", "the weights-access token for another workspace's checkpoint")
	cmd.Flags().StringVar(&project, "project", "", "the project the copy belongs to")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "expire the copy after this long (default: never)")
	return cmd
}
