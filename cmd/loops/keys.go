package main

import (
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// keysCmd is `loops keys`: API keys kept as records (loops.v1 KeyService).
func keysCmd() *cobra.Command {
	var of operatorFlags
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Create, list, update and revoke API keys (operators: any workspace; workspace admin keys: their own)",
		Long: "API keys kept as records in the server's database, beside the keys given to loops serve by\n" +
			"flag or key file (docs/security.md). An operator key (--operator-key) manages the keys of every\n" +
			"workspace; a workspace admin key (--api-key, made with --role admin) those of its own workspace.\n" +
			"A created key is printed once: the server keeps only its SHA-256.",
	}
	of.register(cmd)
	client := func() loopsv1connect.KeyServiceClient {
		cf := of.clientFlags
		if of.operatorKey != "" {
			cf.apiKey = of.operatorKey
		}
		return loopsv1connect.NewKeyServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}

	var workspace, role, name, month, total string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a key and print it once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := parseRole(role)
			if err != nil {
				return err
			}
			resp, err := client().CreateKey(cmd.Context(), &loopsv1.CreateKeyRequest{Workspace: workspace, Role: r, Name: name,
				BudgetUsdMonth: month, BudgetUsdTotal: total})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			k := resp.GetKey()
			fmt.Fprintf(cmd.ErrOrStderr(), "created %s (workspace %s, role %s); the key is shown once, keep it now:\n", k.GetId(), k.GetWorkspace(), roleName(k.GetRole()))
			fmt.Fprintln(cmd.OutOrStdout(), resp.GetSecret())
			return nil
		},
	}
	create.Flags().StringVar(&workspace, "workspace", "", "the key's workspace (operators must name it; an admin key's own by default)")
	create.Flags().StringVar(&role, "role", "member", "member or admin (an admin key may also manage its workspace's keys)")
	create.Flags().StringVar(&name, "name", "", "a label for people (at most 128 characters)")
	create.Flags().StringVar(&month, "budget-usd-month", "", "what the key's work may cost in a UTC month, in USD (\"25.50\"); none by default")
	create.Flags().StringVar(&total, "budget-usd-total", "", "what the key's work may cost in all, in USD; none by default")

	var listWorkspace string
	var limit int32
	var liveOnly bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List stored keys, newest first (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := client().ListKeys(cmd.Context(), &loopsv1.ListKeysRequest{Workspace: listWorkspace, Limit: limit, LiveOnly: liveOnly})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tWORKSPACE\tROLE\tNAME\tCREATED\tLAST USED\tREVOKED\tSPENT/BUDGET MONTH\tSPENT/BUDGET TOTAL")
			for _, k := range resp.GetKeys() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.GetId(), k.GetWorkspace(), roleName(k.GetRole()), k.GetName(),
					when(k.GetCreateTime()), when(k.GetLastUsedTime()), when(k.GetRevokeTime()), keyBudget(k, "budget_usd_month"), keyBudget(k, "budget_usd_total"))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&listWorkspace, "workspace", "", "only this workspace's keys (operators: every workspace's by default)")
	list.Flags().Int32Var(&limit, "limit", 0, "at most this many (default 100, at most 1000)")
	list.Flags().BoolVar(&liveOnly, "live", false, "leave revoked keys out")

	var upMonth, upTotal string
	update := &cobra.Command{
		Use:   "update KEY_ID",
		Short: "Change a stored key's budgets (0 removes one; a flag left out keeps it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &loopsv1.UpdateKeyRequest{Id: args[0]}
			if cmd.Flags().Changed("budget-usd-month") {
				req.BudgetUsdMonth = &upMonth
			}
			if cmd.Flags().Changed("budget-usd-total") {
				req.BudgetUsdTotal = &upTotal
			}
			k, err := client().UpdateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), k)
			}
			return showKey(cmd, k)
		},
	}
	update.Flags().StringVar(&upMonth, "budget-usd-month", "", "what the key's work may cost in a UTC month, in USD (0: no budget)")
	update.Flags().StringVar(&upTotal, "budget-usd-total", "", "what the key's work may cost in all, in USD (0: no budget)")

	show := &cobra.Command{
		Use:   "show KEY_ID",
		Short: "Show a stored key of the workspace: its role, times, budgets and what it spent against them",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := client().ListKeys(cmd.Context(), &loopsv1.ListKeysRequest{Limit: 1000})
			if err != nil {
				return err
			}
			for _, k := range resp.GetKeys() {
				if k.GetId() == args[0] {
					if of.json {
						return printJSON(cmd.OutOrStdout(), k)
					}
					return showKey(cmd, k)
				}
			}
			return fmt.Errorf("API key %s not found (loops keys list shows the keys you may manage)", args[0])
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke KEY_ID",
		Short: "Revoke a stored key: it and its tokens are refused from now on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := client().RevokeKey(cmd.Context(), &loopsv1.RevokeKeyRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), k)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (workspace %s) at %s\n", k.GetId(), k.GetWorkspace(), when(k.GetRevokeTime()))
			return nil
		},
	}

	whoami := &cobra.Command{
		Use:   "whoami",
		Short: "Show the workspace, key id, role and limits of the key in use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w, err := client().WhoAmI(cmd.Context(), &loopsv1.WhoAmIRequest{})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), w)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "workspace: %s\nkey:       %s\nrole:      %s\nsource:    %s\nin flight: %d at most\n",
				w.GetWorkspace(), w.GetKeyId(), roleName(w.GetRole()), w.GetSource(), w.GetMaxRequestsInFlight())
			return nil
		},
	}
	cmd.AddCommand(create, list, show, update, revoke, whoami)
	return cmd
}

// showKey prints a key record, one field a line; a budget with what the key spent
// against it and the alerts crossed (under a price sheet).
func showKey(cmd *cobra.Command, k *loopsv1.ApiKey) error {
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "id:           %s\nworkspace:    %s\nrole:         %s\nname:         %s\ncreated:      %s\nlast used:    %s\nrevoked:      %s\nbudget/month: %s\nbudget total: %s\n",
		k.GetId(), k.GetWorkspace(), roleName(k.GetRole()), k.GetName(), when(k.GetCreateTime()), when(k.GetLastUsedTime()),
		when(k.GetRevokeTime()), keyBudgetUse(k, "budget_usd_month"), keyBudgetUse(k, "budget_usd_total"))
	return err
}

// keyBudgetUse is one of a key's budgets (name: budget_usd_month or budget_usd_total) with
// its spend, the work running and the alerts crossed, as loops workspace shows budgets; the
// budget alone where the server reports no spend (no price sheet); "-" for none.
func keyBudgetUse(k *loopsv1.ApiKey, name string) string {
	for _, b := range k.GetBudgetStatus() {
		if b.GetName() == name {
			return b.GetLimitUsd() + " USD: " + budgetUse(b)
		}
	}
	return usd(keyLimit(k, name))
}

// keyBudget is a key's budget for loops keys list: "spent/limit USD", with the alerts
// crossed ("0.000036/0.00005 USD !50%"); the budget alone without a reported spend; "-".
func keyBudget(k *loopsv1.ApiKey, name string) string {
	for _, b := range k.GetBudgetStatus() {
		if b.GetName() == name {
			s := b.GetSpentUsd() + "/" + b.GetLimitUsd() + " USD"
			if a := b.GetAlerts(); len(a) > 0 {
				s += fmt.Sprintf(" !%d%%", a[len(a)-1])
			}
			return s
		}
	}
	return usd(keyLimit(k, name))
}

func keyLimit(k *loopsv1.ApiKey, name string) string {
	if name == "budget_usd_month" {
		return k.GetBudgetUsdMonth()
	}
	return k.GetBudgetUsdTotal()
}

// usd shows a budget: "-" for none.
func usd(s string) string {
	if s == "" {
		return "-"
	}
	return s + " USD"
}

func parseRole(s string) (loopsv1.KeyRole, error) {
	switch strings.ToLower(s) {
	case "", "member":
		return loopsv1.KeyRole_KEY_ROLE_MEMBER, nil
	case "admin":
		return loopsv1.KeyRole_KEY_ROLE_ADMIN, nil
	}
	return 0, fmt.Errorf("--role %q: use member or admin", s)
}

func roleName(r loopsv1.KeyRole) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "KEY_ROLE_"))
}

func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.DateTime)
}
