package main

import (
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

const projectsHelp = `Manage the workspace's projects: named groups of sessions (and of their training runs).

Every workspace has a project named "default", which holds the sessions created without
one. A session names its project when it is created (tinker: ServiceClient(project_id=...)
or TINKER_PROJECT_ID; a project that does not exist yet is created then) and moves with
RestClient.assign_session_project; RestClient.list_training_runs(project_id=...) lists
one project's runs.

  loops projects list
  loops projects create vision --description "image runs"
  loops projects delete vision      # only a project that holds no session
  loops runs --project vision       # the runs of its sessions`

func projectsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "projects", Short: "List, create and delete the workspace's projects", Long: projectsHelp}
	cf.register(cmd)
	client := func() loopsv1connect.ProjectServiceClient {
		return loopsv1connect.NewProjectServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workspace's projects by name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := client().ListProjects(cmd.Context(), &loopsv1.ListProjectsRequest{})
			if err != nil {
				return err
			}
			return printProjects(cmd.OutOrStdout(), res.GetProjects())
		},
	}
	var description string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a project (1 to 64 letters, digits, '.', '_' or '-')",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := client().CreateProject(cmd.Context(), &loopsv1.CreateProjectRequest{Name: args[0], Description: description})
			if err != nil {
				return err
			}
			return printProjects(cmd.OutOrStdout(), []*loopsv1.Project{p})
		},
	}
	create.Flags().StringVar(&description, "description", "", "what the project is for")
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a project that holds no session (move its sessions first)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := client().DeleteProject(cmd.Context(), &loopsv1.DeleteProjectRequest{Name: args[0]}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "deleted project %s\n", args[0])
			return err
		},
	}
	cmd.AddCommand(list, create, del)
	return cmd
}

// printProjects writes projects as a table.
func printProjects(w io.Writer, ps []*loopsv1.Project) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tDESCRIPTION")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.GetName(), p.GetCreateTime().AsTime().UTC().Format(time.DateTime), p.GetDescription())
	}
	return tw.Flush()
}
