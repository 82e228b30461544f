package main

import (
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
)

const sessionsHelp = `List and end the workspace's sessions.

A tinker script's ServiceClient holds a session; while it lives (until the script ends it, or
--session-ttl after its last heartbeat), so do its training runs, and they count against the
workspace's max_concurrent_runs. End one that a crashed or forgotten script left behind:

  loops sessions list
  loops sessions end SESSION_ID       # its runs are unloaded; their checkpoints stay`

func sessionsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "sessions", Short: "List and end sessions (a session's end unloads its runs)", Long: sessionsHelp}
	cf.register(cmd)
	client := func() loopsv1connect.SessionServiceClient {
		return loopsv1connect.NewSessionServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}
	var limit int32
	var pageToken string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workspace's sessions, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := client().ListSessions(cmd.Context(), &loopsv1.ListSessionsRequest{Limit: limit, PageToken: pageToken})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tCREATED\tLAST HEARTBEAT\tSTATE\tRUNS")
			for _, s := range resp.GetSessions() {
				state := "live"
				if s.GetExpired() {
					state = "ended"
					if r := s.GetEndReason(); r != "" {
						state += " (" + r + ")"
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.GetId(), s.GetCreateTime().AsTime().Format("2006-01-02 15:04:05"),
					s.GetLastHeartbeatTime().AsTime().Format("2006-01-02 15:04:05"), state, strings.Join(s.GetTrainingRunIds(), ","))
			}
			fmt.Fprintf(tw, "(%d of %d)\n", len(resp.GetSessions()), resp.GetTotalCount())
			printNextPage(tw, resp.GetNextPageToken())
			return tw.Flush()
		},
	}
	list.Flags().Int32Var(&limit, "limit", 50, "how many to list")
	list.Flags().StringVar(&pageToken, "page-token", "", "continue a list where the previous page ended (the token it printed)")
	var reason, detail string
	end := &cobra.Command{
		Use:   "end SESSION_ID",
		Short: "End a session: its training runs are unloaded (checkpoints stay), its samplers closed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := client().FinishSession(cmd.Context(), &loopsv1.FinishSessionRequest{Id: args[0], Reason: reason, Detail: detail})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s ended (%s); runs unloaded: %d\n", s.GetId(), s.GetEndReason(), len(s.GetTrainingRunIds()))
			return nil
		},
	}
	end.Flags().StringVar(&reason, "reason", "interrupted", "why it ended: success, errored or interrupted")
	end.Flags().StringVar(&detail, "detail", "ended with loops sessions end", "a note kept with the session")
	cmd.AddCommand(list, end)
	return cmd
}

// runsUnloadCmd is `loops runs unload RUN`: frees a live run's place (and its memory on the
// backend) without ending its session; its checkpoints stay and a later request loads it again.
func runsUnloadCmd(cf *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "unload RUN",
		Short: "Unload a training run: it stops counting against max_concurrent_runs; checkpoints stay",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, cf.url, cf.options()...)
			op, err := cl.UnloadTrainingRun(cmd.Context(), &loopsv1.UnloadTrainingRunRequest{Id: args[0]})
			if err != nil {
				return err
			}
			ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, cf.url, cf.options()...)
			for op.GetState() == loopsv1.OperationState_OPERATION_STATE_PENDING || op.GetState() == loopsv1.OperationState_OPERATION_STATE_RUNNING {
				if op, err = ops.WaitOperation(cmd.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId()}); err != nil {
					return err
				}
			}
			if e := op.GetError(); e != nil {
				return fmt.Errorf("unloading %s failed: %s", args[0], e.GetMessage())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s unloaded\n", args[0])
			return nil
		},
	}
}
