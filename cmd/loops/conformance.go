package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/loops-dev/loops/conformance/blackbox"
	"github.com/loops-dev/loops/conformance/protocol"
)

// conformanceCmd is `loops conformance`: the black-box suite against any Tinker-compatible
// server.
func conformanceCmd() *cobra.Command {
	var (
		cfg          blackbox.Config
		asJSON       bool
		knownFailing string
		verbose      bool
	)
	cmd := &cobra.Command{
		Use:   "conformance --target URL",
		Short: "Check a Tinker-compatible server from the outside (SDK-level checks and protocol cases)",
		Long: `conformance talks to --target with plain HTTP the way the tinker SDK does: it runs a short
SFT-then-sample session (client/config, create_session, create_model, forward_backward with a
protobuf body, optim_step, save_weights_for_sampler, asample, listings, heartbeat), then every
protocol case that has a Tinker form. It prints one line per check and exits non-zero when
anything fails. See docs/conformance.md.`,
		Example: `  loops conformance --target http://127.0.0.1:8000 --api-key tml-dev
  TINKER_API_KEY=tml-… loops conformance --target https://tinker.thinkingmachines.dev/services/tinker-prod \
      --base-model "$MODEL" --known-failing hosted.txt --json`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Target == "" {
				return errors.New("--target is required (the server root, without /api/v1)")
			}
			if knownFailing != "" {
				k, err := protocol.LoadKnownFailing(knownFailing)
				if err != nil {
					return err
				}
				cfg.KnownFailing = k
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			rep, err := blackbox.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else if err := printReport(out, rep); err != nil {
				return err
			}
			if !rep.OK() {
				return fmt.Errorf("%d of %d conformance checks failed", rep.Failed, len(rep.Results))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Target, "target", "", "server root URL, e.g. http://127.0.0.1:8000 (required)")
	f.StringVar(&cfg.APIKey, "api-key", env("TINKER_API_KEY", env("LOOPS_API_KEY", "")), "API key sent as X-API-Key (TINKER_API_KEY or LOOPS_API_KEY)")
	f.StringVar(&cfg.OtherAPIKey, "other-api-key", "", "a key of another workspace; enables the isolation cases")
	f.StringVar(&cfg.OperatorAPIKey, "operator-key", "", "an operator key (loops serve --operator-key); enables the API-key cases (keys.yaml)")
	f.StringVar(&cfg.BaseModel, "base-model", "loops/tiny", "base model to train and sample")
	f.Int64Var(&cfg.MaxBodyBytes, "body-limit", 0, "the server's request body limit in bytes, if known; enables the over-limit case")
	f.StringVar(&knownFailing, "known-failing", "", `file of "<glob> # <reason>" lines for checks expected to fail`)
	f.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "limit for each check and each case")
	f.BoolVar(&cfg.SkipProtocol, "sdk-only", false, "run only the SDK-level checks")
	f.StringVar(&cfg.Wire, "wire", blackbox.WireProto, "forward_backward body of the SDK checks: proto (tinker ≥ 0.25, always) or json (tinker ≤ 0.24)")
	f.BoolVar(&cfg.OpenMode, "open", false, "the target accepts any tml- key by design (loops serve without keys); skip the unknown-key check")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVarP(&verbose, "verbose", "v", false, "log each check as it finishes (stderr)")
	return cmd
}

// printReport writes one line per result and a summary.
func printReport(w io.Writer, rep *blackbox.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tTIME\tREASON")
	for _, r := range rep.Results {
		reason := strings.ReplaceAll(r.Reason, "\n", " ")
		if len(reason) > 300 {
			reason = reason[:300] + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, strings.ToUpper(string(r.Status)), r.Duration.Round(time.Millisecond), reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%s: %d passed, %d failed, %d known failing, %d skipped\n",
		rep.Target, rep.Passed, rep.Failed, rep.KnownFailing, rep.Skipped)
	return err
}
