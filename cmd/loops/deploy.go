package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
)

// deployCmd is `loops deploy`: deployments (loops.v1 DeploymentService).
func deployCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "deploy",
		Short: "Serve sampler checkpoints under a name on the OpenAI-compatible API",
		Long: "Deployments serve checkpoints of one base model under a stable name on /oai/api/v1 (model\n" +
			"\"NAME\", or \"NAME/CHECKPOINT\" when it serves several; \"OWNER:NAME[/CHECKPOINT]\" from a\n" +
			"workspace it was shared with). A deployment pins its checkpoints: they are neither deleted\n" +
			"nor expired while it exists. See docs/deployments.md.",
	}
	cf.register(cmd)
	client := func() loopsv1connect.DeploymentServiceClient {
		return loopsv1connect.NewDeploymentServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}

	var name string
	var checkpoints []string
	var replicas int32
	var requireEvals []string
	create := &cobra.Command{
		Use:   "create --name NAME --checkpoint tinker://… [--checkpoint …] [--replicas N]",
		Short: "Deploy one or more sampler checkpoints of one base model",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reqs, err := parseEvalRequirements(requireEvals)
			if err != nil {
				return err
			}
			d, err := client().CreateDeployment(cmd.Context(), &loopsv1.CreateDeploymentRequest{
				Name: name, Checkpoints: checkpoints, Replicas: replicas, RequireEvals: reqs,
			})
			if err != nil {
				return err
			}
			return printDeployment(cmd.OutOrStdout(), d)
		},
	}
	create.Flags().StringVar(&name, "name", "", "deployment name (letters, digits, '_', '-', '.')")
	create.Flags().StringArrayVar(&checkpoints, "checkpoint", nil, "tinker:// path of a checkpoint to serve (repeat for several)")
	create.Flags().Int32Var(&replicas, "replicas", 1, "sampler replicas; without worker pools they are local (see docs/deployments.md)")
	create.Flags().StringArrayVar(&requireEvals, "require-eval", nil, `deploy only if every checkpoint's result of an eval passes a threshold: "NAME>=0.6" or "NAME<=2.5" (repeat for several; docs/deployments.md)`)
	_ = create.MarkFlagRequired("name")
	_ = create.MarkFlagRequired("checkpoint")

	list := &cobra.Command{
		Use:   "list",
		Short: "List your deployments and those shared with you",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := client().ListDeployments(cmd.Context(), &loopsv1.ListDeploymentsRequest{})
			if err != nil {
				return err
			}
			return printDeployments(cmd.OutOrStdout(), resp.GetDeployments())
		},
	}

	show := &cobra.Command{
		Use:   "show [OWNER:]NAME",
		Short: "Show a deployment",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &loopsv1.GetDeploymentRequest{Name: args[0]}
			if o, n, ok := strings.Cut(args[0], ":"); ok {
				req.Owner, req.Name = o, n
			}
			d, err := client().GetDeployment(cmd.Context(), req)
			if err != nil {
				return err
			}
			return printDeployment(cmd.OutOrStdout(), d)
		},
	}

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a deployment (its checkpoints stay, unpinned)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := client().DeleteDeployment(cmd.Context(), &loopsv1.DeleteDeploymentRequest{Name: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted deployment %s\n", args[0])
			return nil
		},
	}

	grant := &cobra.Command{
		Use:   "grant NAME WORKSPACE",
		Short: "Share a deployment read-only with another workspace",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := client().GrantDeployment(cmd.Context(), &loopsv1.GrantDeploymentRequest{Name: args[0], Workspace: args[1]})
			if err != nil {
				return err
			}
			return printDeployment(cmd.OutOrStdout(), d)
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke NAME WORKSPACE",
		Short: "Stop sharing a deployment with a workspace",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := client().RevokeDeployment(cmd.Context(), &loopsv1.RevokeDeploymentRequest{Name: args[0], Workspace: args[1]})
			if err != nil {
				return err
			}
			return printDeployment(cmd.OutOrStdout(), d)
		},
	}
	cmd.AddCommand(create, list, show, del, grant, revoke)
	return cmd
}

// printDeployments writes one line per deployment.
func printDeployments(w io.Writer, ds []*loopsv1.Deployment) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tOWNER\tBASE MODEL\tCHECKPOINTS\tREPLICAS\tPLACED\tSHARED WITH\tCREATED")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", d.GetName(), d.GetOwner(), d.GetBaseModel(), len(d.GetCheckpoints()),
			d.GetReplicas(), d.GetPlacedReplicas(), strings.Join(d.GetGrants(), ","), d.GetCreateTime().AsTime().Format("2006-01-02 15:04:05"))
	}
	if len(ds) == 0 {
		fmt.Fprintln(tw, "(no deployments)")
	}
	return tw.Flush()
}

// printDeployment writes a deployment in detail, with the model strings that address it.
func printDeployment(w io.Writer, d *loopsv1.Deployment) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "name\t%s\n", d.GetName())
	fmt.Fprintf(tw, "owner\t%s\n", d.GetOwner())
	fmt.Fprintf(tw, "base model\t%s\n", d.GetBaseModel())
	fmt.Fprintf(tw, "replicas\t%d\n", d.GetReplicas())
	fmt.Fprintf(tw, "placed\t%d: %s\n", d.GetPlacedReplicas(), d.GetPlacement())
	fmt.Fprintf(tw, "created\t%s\n", d.GetCreateTime().AsTime().Format("2006-01-02 15:04:05"))
	if len(d.GetGrants()) > 0 {
		fmt.Fprintf(tw, "shared with\t%s\n", strings.Join(d.GetGrants(), ", "))
	}
	for _, c := range d.GetCheckpoints() {
		fmt.Fprintf(tw, "checkpoint\t%s\t%s\n", c.GetName(), c.GetTinkerPath())
		if c.GetTrainingRunId() != "" {
			fmt.Fprintf(tw, "  lineage\trun %s, base model %s, step %d\n", c.GetTrainingRunId(), c.GetBaseModel(), c.GetStep())
		}
		for _, r := range c.GetEvals() {
			if r.GetState() == loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED {
				fmt.Fprintf(tw, "  eval\t%s = %.4f (n %d, dataset sha256 %s)\n", r.GetEvalName(), r.GetScore(), r.GetN(), r.GetDatasetSha256())
			}
		}
	}
	for _, m := range d.GetModels() {
		fmt.Fprintf(tw, "model\t%s\n", m)
	}
	return tw.Flush()
}

// parseEvalRequirements reads --require-eval values: "NAME>=THRESHOLD" or "NAME<=THRESHOLD".
func parseEvalRequirements(specs []string) ([]*loopsv1.EvalRequirement, error) {
	var out []*loopsv1.EvalRequirement
	for _, s := range specs {
		op := ">="
		i := strings.Index(s, op)
		if i < 0 {
			op = "<="
			i = strings.Index(s, op)
		}
		if i <= 0 {
			return nil, fmt.Errorf("--require-eval %q: write NAME>=THRESHOLD or NAME<=THRESHOLD", s)
		}
		th, err := strconv.ParseFloat(strings.TrimSpace(s[i+2:]), 64)
		if err != nil {
			return nil, fmt.Errorf("--require-eval %q: the threshold is not a number", s)
		}
		out = append(out, &loopsv1.EvalRequirement{Eval: strings.TrimSpace(s[:i]), Op: op, Threshold: th})
	}
	return out, nil
}
