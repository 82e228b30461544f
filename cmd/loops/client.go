package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
)

// clientFlags are the flags of the commands that talk to a running server.
type clientFlags struct {
	url    string
	apiKey string
}

func (c *clientFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&c.url, "url", env("LOOPS_URL", env("TINKER_BASE_URL", "http://127.0.0.1:8000")), "server URL (LOOPS_URL or TINKER_BASE_URL)")
	cmd.PersistentFlags().StringVar(&c.apiKey, "api-key", env("LOOPS_API_KEY", env("TINKER_API_KEY", "")), "API key (LOOPS_API_KEY or TINKER_API_KEY)")
}

func (c *clientFlags) options() []connect.ClientOption {
	key := c.apiKey
	return []connect.ClientOption{connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if key != "" {
				req.Header().Set("X-API-Key", key)
			}
			return next(ctx, req)
		}
	}))}
}

func runsCmd() *cobra.Command {
	var cf clientFlags
	var limit int32
	var pageToken, project string
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List training runs",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, cf.url, cf.options()...)
			resp, err := cl.ListTrainingRuns(cmd.Context(), &loopsv1.ListTrainingRunsRequest{Limit: limit, PageToken: pageToken, ProjectId: project})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tBASE MODEL\tRANK\tLAST REQUEST\tLAST CHECKPOINT\tCORRUPTED")
			for _, r := range resp.GetTrainingRuns() {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%v\n", r.GetId(), r.GetBaseModel(), r.GetLora().GetRank(),
					r.GetLastRequestTime().AsTime().Format("2006-01-02 15:04:05"), r.GetLastCheckpoint().GetTinkerPath(), r.GetCorrupted())
			}
			fmt.Fprintf(tw, "(%d of %d)\n", len(resp.GetTrainingRuns()), resp.GetTotalCount())
			printNextPage(tw, resp.GetNextPageToken())
			return tw.Flush()
		},
	}
	cmd.Flags().Int32Var(&limit, "limit", 50, "how many to list")
	cmd.Flags().StringVar(&pageToken, "page-token", "", "continue a list where the previous page ended (the token it printed)")
	cmd.Flags().StringVar(&project, "project", "", "only the runs of this project's sessions (loops projects list)")
	cf.register(cmd)
	cmd.AddCommand(runsShowCmd(&cf), runsUnloadCmd(&cf), runsReceiptCmd(&cf), runsReplayCmd(&cf))
	return cmd
}

func checkpointsCmd() *cobra.Command {
	var cf clientFlags
	var limit int32
	var pageToken string
	cmd := &cobra.Command{
		Use:   "checkpoints [RUN]",
		Short: "List checkpoints, of one run or of the workspace",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, cf.url, cf.options()...)
			req := &loopsv1.ListCheckpointsRequest{Limit: limit, PageToken: pageToken}
			if len(args) == 1 {
				req.TrainingRunId = args[0]
			}
			resp, err := cl.ListCheckpoints(cmd.Context(), req)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PATH\tSIZE\tCREATED\tPUBLIC\tEXPIRES")
			for _, c := range resp.GetCheckpoints() {
				exp := "never"
				if c.GetExpireTime() != nil {
					exp = c.GetExpireTime().AsTime().Format("2006-01-02 15:04:05")
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%v\t%s\n", c.GetTinkerPath(), c.GetSizeBytes(), c.GetCreateTime().AsTime().Format("2006-01-02 15:04:05"), c.GetPublic(), exp)
			}
			fmt.Fprintf(tw, "(%d of %d)\n", len(resp.GetCheckpoints()), resp.GetTotalCount())
			printNextPage(tw, resp.GetNextPageToken())
			return tw.Flush()
		},
	}
	cmd.Flags().Int32Var(&limit, "limit", 50, "how many to list")
	cmd.Flags().StringVar(&pageToken, "page-token", "", "continue a list where the previous page ended (the token it printed)")
	cf.register(cmd)
	cmd.AddCommand(checkpointsExportCmd(&cf), checkpointsImportCmd(&cf), checkpointsShareCmd(&cf), checkpointsCopyCmd(&cf))
	return cmd
}

// printNextPage tells how to get the next page of a list, when there is one.
func printNextPage(w io.Writer, token string) {
	if token != "" {
		fmt.Fprintf(w, "next page: --page-token %s\n", token)
	}
}
