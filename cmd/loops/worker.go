package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/loops-dev/loops/backends/serve"
)

// workerCmd is `loops worker`: the pure-Go CPU worker (package backends/serve). Its flags
// are the Python worker's and are defined once, in serve.ParseArgs; cobra passes the
// command line through untouched.
func workerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worker [flags]",
		Short: "Serve the pure-Go CPU engine as a worker (loops.backend.v1 over gRPC; no Python needed)",
		Long: `worker serves the reference engine (the built-in loops/tiny model and local Hugging Face
folders, on the CPU) as a Loops worker, the Go twin of python -m loops_worker. The gateway
starts it as a pool's workers with the torch backend's worker_command option, e.g.
  loops serve --backend torch --backend-opt provider=local --backend-opt worker_command="loops worker"
Run loops worker --help for its flags.`,
		DisableFlagParsing: true, // serve.ParseArgs reads them, --help included
		RunE: func(_ *cobra.Command, args []string) error {
			if code := serve.Main(args); code != serve.ExitOK {
				os.Exit(code)
			}
			return nil
		},
	}
	cmd.SetHelpFunc(func(c *cobra.Command, _ []string) { serve.Usage(c.OutOrStdout()) })
	return cmd
}
