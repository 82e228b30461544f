package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "loops:", err)
		// A command that documents its exit codes returns an error that carries one.
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "loops",
		Short:         "Loops: a self-hosted, Tinker-compatible LoRA post-training service",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), modelsCmd(), runsCmd(), checkpointsCmd(), usageCmd(), auditCmd())
	root.AddCommand(workspaceCmd(), deployCmd(), sessionsCmd())
	root.AddCommand(conformanceCmd())
	root.AddCommand(cookbookCmd(), jobsCmd(), projectsCmd(), evalsCmd())
	root.AddCommand(workerCmd())
	root.AddCommand(poolsCmd(), allocationsCmd())
	root.AddCommand(keysCmd())
	root.AddCommand(accessCmd())
	return root
}
