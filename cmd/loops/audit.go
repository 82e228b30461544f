package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// maxAuditLimit caps --limit: a bigger export pages through AuditService itself.
const maxAuditLimit = 100000

func auditCmd() *cobra.Command {
	var cf clientFlags
	var since, key, action, resource string
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the workspace's audit log: every mutating call, newest first",
		Long: "Show the audit log of the API key's workspace (docs/security.md): each mutating call on any\n" +
			"surface, with when, the caller's key id, the client address, the surface, the event, the id\n" +
			"it acted on and the outcome. Reads are not recorded; checkpoint downloads are (checkpoint_read).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := parseSince(since)
			if err != nil {
				return err
			}
			if limit < 1 || limit > maxAuditLimit {
				return fmt.Errorf("--limit %d: use 1 to %d", limit, maxAuditLimit)
			}
			end := time.Now()
			cl := loopsv1connect.NewAuditServiceClient(http.DefaultClient, cf.url, cf.options()...)
			req := &loopsv1.ListAuditEventsRequest{StartTime: timestamppb.New(end.Add(-d)), EndTime: timestamppb.New(end.Add(time.Minute)),
				KeyId: key, Action: action, Resource: resource, PageSize: int32(min(limit, 1000))}
			var events []*loopsv1.AuditEvent
			for len(events) < limit {
				res, err := cl.ListAuditEvents(cmd.Context(), req)
				if err != nil {
					return err
				}
				events = append(events, res.GetEvents()...)
				if res.GetNextPageToken() == "" {
					break
				}
				req.PageToken = res.GetNextPageToken()
			}
			if len(events) > limit {
				events = events[:limit]
			}
			return printAudit(os.Stdout, events)
		},
	}
	cmd.Flags().StringVar(&since, "since", "24h", "how far back to look: a Go duration, or a number of days such as 7d")
	cmd.Flags().StringVar(&key, "key", "", "only the calls of this API key id (key-…)")
	cmd.Flags().StringVar(&action, "action", "", "only this event (checkpoint_delete) or action (POST /api/v1/create_model)")
	cmd.Flags().StringVar(&resource, "resource", "", "only the events of this resource (checkpoint, session, training_run, …)")
	cmd.Flags().IntVar(&limit, "limit", 100, "show at most this many events")
	cf.register(cmd)
	return cmd
}

// printAudit writes one row per event.
func printAudit(w io.Writer, events []*loopsv1.AuditEvent) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME (UTC)\tKEY\tFROM\tSURFACE\tEVENT\tTARGET\tSTATUS")
	for _, e := range events {
		target := e.GetTarget()
		if target == "" {
			target = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d %s\n", e.GetTime().AsTime().UTC().Format("2006-01-02 15:04:05"),
			e.GetKeyId(), e.GetClientAddr(), e.GetSurface(), e.GetEvent(), target, e.GetHttpStatus(), e.GetCode())
	}
	return tw.Flush()
}

func checkpointStorageCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "checkpoint-storage",
		Short: "Show how many checkpoints the workspace holds now and their total size",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl := loopsv1connect.NewAuditServiceClient(http.DefaultClient, cf.url, cf.options()...)
			res, err := cl.GetCheckpointStorage(cmd.Context(), &loopsv1.GetCheckpointStorageRequest{})
			if err != nil {
				return err
			}
			return printCheckpointStorage(os.Stdout, res)
		},
	}
	cf.register(cmd)
	return cmd
}

func printCheckpointStorage(w io.Writer, res *loopsv1.GetCheckpointStorageResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINTS\tBYTES\tGB")
	fmt.Fprintf(tw, "%d\t%d\t%.3f\n", res.GetCheckpointCount(), res.GetSizeBytes(), float64(res.GetSizeBytes())/1e9)
	return tw.Flush()
}
