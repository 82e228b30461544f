package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// accessCmd is `loops access`: access requests a member files when the workspace policy
// stops it, and the grants and denials of its admins (loops.v1 AccessService, docs/access.md).
func accessCmd() *cobra.Command {
	var of operatorFlags
	cmd := &cobra.Command{
		Use:   "access",
		Short: "Ask for more than the workspace policy allows, and grant or deny such requests (admins)",
		Long: "A member whose script hits the workspace policy (a base model it does not list, the\n" +
			"sequence-length or LoRA-rank cap, max_concurrent_runs) gets an error that ends with the exact\n" +
			"`loops access request ...` command to run. A workspace admin key (or an operator key, naming\n" +
			"--workspace) lists, grants and denies the workspace's requests; a grant changes the policy at\n" +
			"once, is audited, and may expire (--for), after which it reverts by itself (docs/access.md).",
	}
	of.register(cmd)
	client := func() loopsv1connect.AccessServiceClient {
		cf := of.clientFlags
		if of.operatorKey != "" {
			cf.apiKey = of.operatorKey
		}
		return loopsv1connect.NewAccessServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}
	show := func(cmd *cobra.Command, r *loopsv1.AccessRequest) error {
		if of.json {
			return printJSON(cmd.OutOrStdout(), r)
		}
		return printAccessRequest(cmd.OutOrStdout(), r)
	}

	var model, reason, workspace, state string
	var seq, rank, runs int32
	var fullFT bool
	var dur time.Duration
	request := &cobra.Command{
		Use:   "request --model M [--max-seq-len N] [--max-rank R] [--runs K] [--full-finetune] --reason \"...\"",
		Short: "Ask your workspace's admins for a model, longer sequences, a larger rank, more runs or full fine-tuning",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := client().RequestAccess(cmd.Context(), &loopsv1.RequestAccessRequest{
				Amounts: &loopsv1.AccessAmounts{Model: model, MaxSequenceLength: seq, MaxLoraRank: rank, MaxConcurrentRuns: runs, FullFinetune: fullFT},
				Reason:  reason})
			if err != nil {
				return err
			}
			if !of.json {
				fmt.Fprintf(cmd.ErrOrStderr(), "request %s is pending: a workspace admin grants it (loops access grant %s)\n", r.GetId(), r.GetId())
			}
			return show(cmd, r)
		},
	}
	amountFlags := func(c *cobra.Command) {
		c.Flags().StringVar(&model, "model", "", "the base model")
		c.Flags().Int32Var(&seq, "max-seq-len", 0, "tokens per sequence on that model")
		c.Flags().Int32Var(&rank, "max-rank", 0, "LoRA rank of a new run on that model")
		c.Flags().Int32Var(&runs, "runs", 0, "training runs live at once in the workspace")
	}
	amountFlags(request)
	request.Flags().BoolVar(&fullFT, "full-finetune", false, "full fine-tuning (LoRA rank 0: every weight trained) on that model")
	request.Flags().StringVar(&reason, "reason", "", "why you need it (at most 1024 bytes)")
	_ = request.MarkFlagRequired("model")
	_ = request.MarkFlagRequired("reason")

	list := &cobra.Command{
		Use:   "list",
		Short: "List access requests: an admin's workspace's, a member's own",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st := loopsv1.AccessState_ACCESS_STATE_UNSPECIFIED
			if state != "" {
				v, ok := loopsv1.AccessState_value["ACCESS_STATE_"+strings.ToUpper(state)]
				if !ok {
					return fmt.Errorf("--state %q: use pending, granted, denied or expired", state)
				}
				st = loopsv1.AccessState(v)
			}
			res, err := client().ListAccessRequests(cmd.Context(), &loopsv1.ListAccessRequestsRequest{Workspace: workspace, State: st})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tBY\tMODEL\tSEQ LEN\tRANK\tRUNS\tREASON")
			for _, r := range res.GetRequests() {
				a := r.GetRequested()
				if r.GetGranted() != nil {
					a = r.GetGranted()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GetId(), accessStateName(r.GetState()), r.GetRequestedBy(), a.GetModel(),
					amount(a.GetMaxSequenceLength()), amount(a.GetMaxLoraRank()), amount(a.GetMaxConcurrentRuns()), oneLine(r.GetReason()))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&state, "state", "", "only pending, granted, denied or expired requests")

	grant := &cobra.Command{
		Use:   "grant ID [--max-seq-len N] [--max-rank R] [--runs K] [--for 24h] [--reason \"...\"]",
		Short: "Grant a pending request (workspace admins, operators), as asked or with other amounts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &loopsv1.GrantAccessRequestRequest{Id: args[0], Workspace: workspace, Reason: reason, DurationSeconds: int64(dur / time.Second)}
			if cmd.Flags().Changed("max-seq-len") || cmd.Flags().Changed("max-rank") || cmd.Flags().Changed("runs") {
				cur, err := client().GetAccessRequest(cmd.Context(), &loopsv1.GetAccessRequestRequest{Id: args[0], Workspace: workspace})
				if err != nil {
					return err
				}
				a := cur.GetRequested()
				req.Amounts = &loopsv1.AccessAmounts{Model: a.GetModel(), MaxSequenceLength: a.GetMaxSequenceLength(), MaxLoraRank: a.GetMaxLoraRank(),
					MaxConcurrentRuns: a.GetMaxConcurrentRuns(), FullFinetune: a.GetFullFinetune()}
				if cmd.Flags().Changed("max-seq-len") {
					req.Amounts.MaxSequenceLength = seq
				}
				if cmd.Flags().Changed("max-rank") {
					req.Amounts.MaxLoraRank = rank
				}
				if cmd.Flags().Changed("runs") {
					req.Amounts.MaxConcurrentRuns = runs
				}
			}
			r, err := client().GrantAccessRequest(cmd.Context(), req)
			if err != nil {
				return err
			}
			return show(cmd, r)
		},
	}
	grant.Flags().Int32Var(&seq, "max-seq-len", 0, "grant this sequence length instead of the one asked for")
	grant.Flags().Int32Var(&rank, "max-rank", 0, "grant this LoRA rank instead")
	grant.Flags().Int32Var(&runs, "runs", 0, "grant this many runs at once instead")
	grant.Flags().DurationVar(&dur, "for", 0, "the grant reverts by itself after this long (0: it does not)")
	grant.Flags().StringVar(&reason, "reason", "", "a note the member sees")

	deny := &cobra.Command{
		Use:   "deny ID --reason \"...\"",
		Short: "Deny a pending request with a reason the member sees",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := client().DenyAccessRequest(cmd.Context(), &loopsv1.DenyAccessRequestRequest{Id: args[0], Workspace: workspace, Reason: reason})
			if err != nil {
				return err
			}
			return show(cmd, r)
		},
	}
	deny.Flags().StringVar(&reason, "reason", "", "why (the member sees it)")
	_ = deny.MarkFlagRequired("reason")

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show one request and its decision",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := client().GetAccessRequest(cmd.Context(), &loopsv1.GetAccessRequestRequest{Id: args[0], Workspace: workspace})
			if err != nil {
				return err
			}
			return show(cmd, r)
		},
	}

	webhooks := &cobra.Command{
		Use:   "webhooks",
		Short: "List the workspace's webhook deliveries, failing ones included (admins, operators)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := client().ListWebhookDeliveries(cmd.Context(), &loopsv1.ListWebhookDeliveriesRequest{Workspace: workspace})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT ID\tEVENT\tREQUEST\tSTATE\tATTEMPTS\tLAST ERROR")
			for _, d := range res.GetDeliveries() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", d.GetId(), d.GetEvent(), d.GetRequestId(), d.GetState(), d.GetAttempts(), oneLine(d.GetLastError()))
			}
			return tw.Flush()
		},
	}
	for _, c := range []*cobra.Command{list, grant, deny, get, webhooks} {
		c.Flags().StringVar(&workspace, "workspace", "", "the workspace (operators must name it)")
	}
	cmd.AddCommand(request, list, grant, deny, get, webhooks)
	return cmd
}

func printAccessRequest(w io.Writer, r *loopsv1.AccessRequest) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	a := r.GetRequested()
	fmt.Fprintf(tw, "ID\t%s\nWORKSPACE\t%s\nSTATE\t%s\nREQUESTED BY\t%s\n", r.GetId(), r.GetWorkspace(), accessStateName(r.GetState()), r.GetRequestedBy())
	fmt.Fprintf(tw, "ASKED\tmodel %s, max_sequence_length %s, max_lora_rank %s, runs %s%s\nREASON\t%s\n", a.GetModel(),
		amount(a.GetMaxSequenceLength()), amount(a.GetMaxLoraRank()), amount(a.GetMaxConcurrentRuns()), fullNote(a), oneLine(r.GetReason()))
	if g := r.GetGranted(); g != nil {
		fmt.Fprintf(tw, "GRANTED\tmodel %s, max_sequence_length %s, max_lora_rank %s, runs %s%s\n", g.GetModel(),
			amount(g.GetMaxSequenceLength()), amount(g.GetMaxLoraRank()), amount(g.GetMaxConcurrentRuns()), fullNote(g))
	}
	if r.GetExpireTime() != nil {
		fmt.Fprintf(tw, "EXPIRES\t%s\n", r.GetExpireTime().AsTime().Format(time.RFC3339))
	}
	if r.GetDecidedBy() != "" {
		fmt.Fprintf(tw, "DECIDED BY\t%s\nDECISION\t%s\n", r.GetDecidedBy(), oneLine(r.GetDecisionReason()))
	}
	if r.GetPolicyAfter() != "" {
		fmt.Fprintf(tw, "POLICY BEFORE\t%s\nPOLICY AFTER\t%s\n", r.GetPolicyBefore(), r.GetPolicyAfter())
	}
	return tw.Flush()
}

func accessStateName(s loopsv1.AccessState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ACCESS_STATE_"))
}

func amount(n int32) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// fullNote is ", full fine-tuning" for amounts that ask for or grant it, else nothing.
func fullNote(a *loopsv1.AccessAmounts) string {
	if a.GetFullFinetune() {
		return ", full fine-tuning"
	}
	return ""
}
