package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/cookbook"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/money"
	"github.com/loops-dev/loops/scripts"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Exit codes of `loops cookbook` (also in its help and cookbook/README.md). 1-4 are the
// Python CLI's own (loops_cookbook/cli.py), passed through.
const (
	exitCookbookFailed = 1 // a check failed, or the recipe failed
	exitCookbookUsage  = 2 // unknown recipe or config field, bad value
	exitCookbookData   = 3 // a data file does not parse
	exitCookbookServer = 4 // server unreachable, key refused, request rejected
	exitCookbookEnv    = 5 // the Python environment could not be prepared
)

// exitError ends the command with a given exit status (main honours ExitCode).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// ExitCode is the process exit status for this error.
func (e *exitError) ExitCode() int { return e.code }

// cookbookFlags are the flags every cookbook subcommand has.
type cookbookFlags struct {
	clientFlags
	python   string
	dir      string
	estimate bool
	pilot    int
}

const cookbookHelp = `Check and run the Loops cookbook's recipes (Python, tinker SDK only; see cookbook/README.md).

The recipes come with this binary. On first use it writes them to ~/.cache/loops/cookbook and
builds a cached venv (~/.cache/loops/venvs/cookbook-<hash>, pip installs the package and the
tinker SDK); later calls reuse both. --python uses an interpreter as it is instead (its
packages must be installed), --cookbook-dir a source folder instead of the embedded copy.

Exit codes: 0 success; 1 a check or the recipe failed; 2 unknown recipe or config field, or
a bad value; 3 a data file does not parse; 4 the server is unreachable, refused the key or
rejected a request; 5 the Python environment could not be prepared.`

func cookbookCmd() *cobra.Command {
	var cf cookbookFlags
	cmd := &cobra.Command{
		Use:   "cookbook",
		Short: "List, show, check and run the cookbook's recipes",
		Long:  cookbookHelp,
	}
	cf.register(cmd)
	cmd.PersistentFlags().StringVar(&cf.python, "python", os.Getenv("LOOPS_COOKBOOK_PYTHON"), "Python interpreter to use as is, no venv (LOOPS_COOKBOOK_PYTHON)")
	cmd.PersistentFlags().StringVar(&cf.dir, "cookbook-dir", os.Getenv("LOOPS_COOKBOOK_DIR"), "cookbook source folder instead of the embedded copy (LOOPS_COOKBOOK_DIR)")
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the recipes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			py, err := cf.prepare(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			recipes, err := listRecipes(cmd.Context(), py)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RECIPE\tSUMMARY")
			for _, r := range recipes {
				fmt.Fprintf(tw, "%s\t%s\n", r.Name, r.Summary)
			}
			return tw.Flush()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "show NAME",
		Short: "Show a recipe: purpose, data format, config fields and defaults",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			py, err := cf.prepare(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return py.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), nil, "show", args[0])
		},
	})
	check := &cobra.Command{
		Use:   "check NAME [key=value ...]",
		Short: "Check a recipe without training: server, key, model limits, data, sequence lengths, chat template, sandbox",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			py, err := cf.prepare(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			rows, est, err := cf.check(cmd.Context(), py, args[0], args[1:])
			if err != nil {
				return err
			}
			printChecks(cmd.OutOrStdout(), rows)
			if est != nil {
				printEstimate(cmd.OutOrStdout(), est, cf.pilot > 0)
			}
			for _, r := range rows {
				if !r.OK {
					return &exitError{exitCookbookFailed, "some checks failed"}
				}
			}
			return nil
		},
	}
	check.Flags().BoolVar(&cf.estimate, "estimate", false, "also estimate the run's cost from its data and settings with the server's price sheet (UsageService.EstimateCost)")
	check.Flags().IntVar(&cf.pilot, "pilot", 0, "with --estimate: run the recipe's first K RL steps for real (metered and billed) and extrapolate the rest of the run from them (RL and agent recipes; docs/operations.md, \"Estimates\")")
	cmd.AddCommand(check)
	var resume string
	run := &cobra.Command{
		Use:   "run NAME [key=value ...]",
		Short: "Run a recipe against the server with live progress",
		Long: "Run a recipe against --url with --api-key (passed to the SDK as TINKER_BASE_URL and\n" +
			"TINKER_API_KEY). It prints the run id and `loops runs show RUN` to watch it, a progress\n" +
			"bar, and at the end a JSON summary on stdout. Config fields are key=value (see `show`).\n\n" +
			"--resume DIR continues the run logged in DIR from its last checkpoint, with the config it\n" +
			"ran with: a pilot's (`check --estimate --pilot K` prints its folder), or one saved every\n" +
			"save_every steps by a run that was interrupted. The steps done are not run again, and the\n" +
			"run draws and trains what the uninterrupted run would have.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			py, err := cf.prepare(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			pyArgs := append([]string{"run"}, args...)
			if resume != "" {
				pyArgs = append(pyArgs, "--resume", resume)
			}
			return py.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), cf.sdkEnv(), pyArgs...)
		},
	}
	run.Flags().StringVar(&resume, "resume", "", "continue the run logged in this folder (a pilot's, or an interrupted run's with save_every) from its last checkpoint")
	cmd.AddCommand(run)
	return cmd
}

// sdkEnv is the environment that points a recipe's tinker SDK at --url with --api-key.
func (cf *cookbookFlags) sdkEnv() []string {
	env := []string{"TINKER_BASE_URL=" + strings.TrimRight(cf.url, "/"), "LOOPS_CONSOLE_URL=" + strings.TrimRight(cf.url, "/") + "/"}
	if cf.apiKey != "" {
		env = append(env, "TINKER_API_KEY="+cf.apiKey)
	}
	return env
}

// cookbookPython is how to run `python -m loops_cookbook`: an interpreter and extra environment.
type cookbookPython struct {
	exe string
	env []string
}

// prepare finds the cookbook's source and a Python that can run it (see cookbookHelp).
func (cf *cookbookFlags) prepare(ctx context.Context, stderr io.Writer) (*cookbookPython, error) {
	src := cf.dir
	if src == "" {
		var err error
		if src, err = extractCookbook(); err != nil {
			return nil, &exitError{exitCookbookEnv, "cookbook: " + err.Error()}
		}
	} else if _, err := os.Stat(filepath.Join(src, "loops_cookbook", "registry.py")); err != nil {
		return nil, &exitError{exitCookbookEnv, fmt.Sprintf("--cookbook-dir %s: not a cookbook source folder (no loops_cookbook/registry.py)", src)}
	}
	src, _ = filepath.Abs(src)
	// PYTHONPATH first: the source folder wins over an installed copy, so --cookbook-dir edits apply.
	env := []string{"PYTHONPATH=" + src, "PYTHONUNBUFFERED=1"}
	if cf.python != "" {
		return &cookbookPython{exe: cf.python, env: env}, nil
	}
	venv, err := cookbookVenv(ctx, src, stderr)
	if err != nil {
		return nil, &exitError{exitCookbookEnv, "cookbook: preparing the Python environment: " + err.Error()}
	}
	return &cookbookPython{exe: filepath.Join(venv, "bin", "python"), env: env}, nil
}

// cookbookDigest is a short hash of the embedded cookbook: it names the extracted folder and
// the venv, so a new binary gets fresh ones and an unchanged one reuses them.
func cookbookDigest() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(cookbook.Files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := cookbook.Files.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12], err
}

// cacheDir is ~/.cache/loops (XDG_CACHE_HOME honoured).
func cacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "loops"), nil
}

// extractCookbook writes the embedded cookbook to CACHE/cookbook/<digest> once (written to a
// temporary folder and renamed, so a half-written copy is never used).
func extractCookbook() (string, error) {
	digest, err := cookbookDigest()
	if err != nil {
		return "", err
	}
	cache, err := cacheDir()
	if err != nil {
		return "", err
	}
	dst := filepath.Join(cache, "cookbook", digest)
	if _, err := os.Stat(filepath.Join(dst, "pyproject.toml")); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), digest+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.CopyFS(tmp, cookbook.Files); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		if _, statErr := os.Stat(filepath.Join(dst, "pyproject.toml")); statErr == nil {
			return dst, nil // another process got there first
		}
		return "", err
	}
	return dst, nil
}

// cookbookVenv builds or reuses the venv cookbook-<digest of src> with the package installed
// from src (its pyproject.toml lists the dependencies), through scripts/pyenv.sh.
func cookbookVenv(ctx context.Context, src string, stderr io.Writer) (string, error) {
	digest, err := dirDigest(src)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", "-c", scripts.Pyenv, "pyenv.sh", "cookbook-"+digest, src)
	// A first build takes a minute or more (pip fetches the tinker SDK and transformers):
	// pip's own lines show that it is getting on, one per package.
	cmd.Env = append(os.Environ(), "LOOPS_PYENV_PROGRESS=1")
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("pyenv.sh: %w", err)
	}
	venv := strings.TrimSpace(string(out))
	if venv == "" {
		return "", errors.New("pyenv.sh printed no venv path")
	}
	return venv, nil
}

// dirDigest hashes the package files of a cookbook folder (pyproject.toml and loops_cookbook/,
// without caches), the same files the embedded copy has.
func dirDigest(src string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			if d.Name() == "__pycache__" || strings.HasSuffix(d.Name(), ".egg-info") || d.Name() == "build" || d.Name() == "runs" {
				return filepath.SkipDir
			}
			return nil
		}
		if rel != "pyproject.toml" && !strings.HasPrefix(rel, "loops_cookbook"+string(filepath.Separator)) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12], err
}

// command is `python -m loops_cookbook ARGS...` with the cookbook's environment added.
func (p *cookbookPython) command(ctx context.Context, extraEnv []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, p.exe, append([]string{"-m", "loops_cookbook"}, args...)...)
	cmd.Env = append(append(os.Environ(), p.env...), extraEnv...)
	// Ctrl-C: the recipe gets SIGINT (it stops and says so), and SIGKILL 10 s later.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// run runs the Python CLI with its output passed through and its exit status kept.
func (p *cookbookPython) run(ctx context.Context, stdout, stderr io.Writer, env []string, args ...string) error {
	cmd := p.command(ctx, env, args...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = stdout, stderr, os.Stdin
	return pythonExit(cmd.Run(), p.exe)
}

// output runs the Python CLI and returns its stdout (stderr passed through).
func (p *cookbookPython) output(ctx context.Context, stderr io.Writer, args ...string) ([]byte, error) {
	return p.outputEnv(ctx, stderr, nil, args...)
}

// outputEnv is output with extra environment.
func (p *cookbookPython) outputEnv(ctx context.Context, stderr io.Writer, env []string, args ...string) ([]byte, error) {
	cmd := p.command(ctx, env, args...)
	cmd.Stderr = stderr
	out, err := cmd.Output()
	return out, pythonExit(err, p.exe)
}

// pythonExit maps the Python CLI's outcome onto the command's exit status.
func pythonExit(err error, exe string) error {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee) && ee.ExitCode() > 0:
		return &exitError{ee.ExitCode(), fmt.Sprintf("cookbook: exit status %d", ee.ExitCode())}
	case errors.As(err, &ee):
		return &exitError{exitCookbookFailed, "cookbook: " + err.Error()}
	default:
		return &exitError{exitCookbookEnv, fmt.Sprintf("cookbook: cannot run %s: %v", exe, err)}
	}
}

// recipeInfo is one entry of `python -m loops_cookbook list --json`.
type recipeInfo struct {
	Name    string `json:"name"`
	Summary string `json:"summary"`
}

// listRecipes asks the cookbook for its recipes: the list lives only in loops_cookbook.registry.
func listRecipes(ctx context.Context, py *cookbookPython) ([]recipeInfo, error) {
	out, err := py.output(ctx, os.Stderr, "list", "--json")
	if err != nil {
		return nil, err
	}
	return parseRecipeList(out)
}

// parseRecipeList parses `list --json` output: a JSON array of {name, summary}, names non-empty.
func parseRecipeList(out []byte) ([]recipeInfo, error) {
	var recipes []recipeInfo
	if err := json.Unmarshal(bytes.TrimSpace(out), &recipes); err != nil {
		return nil, fmt.Errorf("cookbook: list --json printed no recipe list: %w", err)
	}
	for i, r := range recipes {
		if r.Name == "" {
			return nil, fmt.Errorf("cookbook: list --json: recipe %d has no name", i)
		}
	}
	return recipes, nil
}

// checkRow is one line of the check table.
type checkRow struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// recipeShow is the part of `show NAME --json` that check needs: the config's defaults.
type recipeShow struct {
	Config []struct {
		Name    string          `json:"name"`
		Default json.RawMessage `json:"default"`
	} `json:"config"`
}

// recipeSettings are the config values the server checks need: the base model and LoRA rank.
type recipeSettings struct {
	Model    string
	LoraRank int
}

// parseSettings takes the model and lora_rank from the key=value overrides, else from the
// recipe's defaults (show --json output).
func parseSettings(showJSON []byte, overrides []string) (recipeSettings, error) {
	var s recipeSettings
	var show recipeShow
	if err := json.Unmarshal(showJSON, &show); err != nil {
		return s, fmt.Errorf("cookbook: show --json: %w", err)
	}
	for _, f := range show.Config {
		switch f.Name {
		case "model":
			_ = json.Unmarshal(f.Default, &s.Model)
		case "lora_rank":
			_ = json.Unmarshal(f.Default, &s.LoraRank)
		}
	}
	for _, kv := range overrides {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return s, &exitError{exitCookbookUsage, fmt.Sprintf("%q: want key=value", kv)}
		}
		switch k {
		case "model":
			s.Model = v
		case "lora_rank":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return s, &exitError{exitCookbookUsage, fmt.Sprintf("lora_rank=%q: want a positive whole number", v)}
			}
			s.LoraRank = n
		}
	}
	if s.Model == "" {
		return s, errors.New("cookbook: the recipe names no model")
	}
	return s, nil
}

// check runs the server checks here and the local ones (data, tokenizer, chat template,
// sequence lengths, sandbox) in Python, and returns every row. With --estimate and every
// check passed, it also prices the run (UsageService.EstimateCost, from the token counts and
// settings the recipe's Python computes) and adds a "cost estimate" row.
func (cf *cookbookFlags) check(ctx context.Context, py *cookbookPython, name string, overrides []string) ([]checkRow, *loopsv1.EstimateCostResponse, error) {
	showJSON, err := py.output(ctx, os.Stderr, "show", name, "--json")
	if err != nil {
		return nil, nil, err
	}
	settings, err := parseSettings(showJSON, overrides)
	if err != nil {
		return nil, nil, err
	}
	rows, maxSeqLen := serverChecks(ctx, cf.url, cf.apiKey, settings)
	if cf.pilot < 0 || (cf.pilot > 0 && !cf.estimate) {
		return nil, nil, &exitError{exitCookbookUsage, "--pilot K takes a number of steps K >= 1, with --estimate"}
	}
	// Overrides right after the name: argparse takes positionals before the options.
	args := append(append([]string{"check", name}, overrides...), "--json", "--max-seq-len", strconv.Itoa(maxSeqLen))
	var env []string
	if cf.estimate {
		args = append(args, "--estimate")
	}
	usage := loopsv1connect.NewUsageServiceClient(&http.Client{Timeout: time.Minute}, strings.TrimRight(cf.url, "/"), cf.options()...)
	started := time.Now()
	if cf.pilot > 0 && !slices.ContainsFunc(rows, func(r checkRow) bool { return !r.OK }) {
		// The pilot trains for real: it is billed, and what its own sessions and runs were
		// metered is reported (pilotCost), not the workspace's other work meanwhile.
		args = append(args, "--pilot", strconv.Itoa(cf.pilot))
		env = cf.sdkEnv()
	}
	out, err := py.outputEnv(ctx, os.Stderr, env, args...)
	var ee *exitError
	if err != nil && !(errors.As(err, &ee) && ee.code == exitCookbookFailed) {
		return nil, nil, err // a usage or environment error: no table to show
	}
	local, estReq, estErr, used, perr := parseCheckOutput(out)
	if perr != nil {
		return nil, nil, perr
	}
	rows = append(rows, local...)
	if !cf.estimate || slices.ContainsFunc(rows, func(r checkRow) bool { return !r.OK }) {
		return rows, nil, nil
	}
	if cf.pilot > 0 {
		pilot := pilotRow(ctx, usage, cf.pilot, started, used)
		if dir := resumeDir(out); dir != "" {
			pilot.Detail += fmt.Sprintf("; the run continues from them (not run twice): loops cookbook run %s --resume %s", name, dir)
		}
		rows = append(rows, pilot)
	}
	switch {
	case estErr != "":
		return append(rows, checkRow{"cost estimate", false, estErr}), nil, nil
	case estReq == nil:
		return append(rows, checkRow{"cost estimate", false, name + " cannot estimate its run (the recipe has no estimate function)"}), nil, nil
	}
	est, err := usage.EstimateCost(ctx, estReq)
	if err != nil {
		return append(rows, checkRow{"cost estimate", false, err.Error()}), nil, nil
	}
	detail := "$" + est.GetTotalUsd()
	if cf.pilot > 0 && est.GetTotalLowUsd() != "" {
		detail += fmt.Sprintf(" (band $%s to $%s, from %d pilot steps)", est.GetTotalLowUsd(), est.GetTotalHighUsd(), cf.pilot)
	}
	return append(rows, checkRow{"cost estimate", true, detail + " (prices " + est.GetPriceVersion() + ")"}), est, nil
}

// pilotUsage names what a pilot used: the server sessions its runs (and its OpenAI-route
// evaluation, X-Loops-Session) were metered to, and its training runs (the usage kept per
// run: dedicated pool time).
type pilotUsage struct {
	Sessions []string `json:"pilot_sessions"`
	Runs     []string `json:"pilot_runs"`
}

// pilotRow is the "pilot" row: what the pilot's own sessions and runs were metered since
// it started.
func pilotRow(ctx context.Context, usage loopsv1connect.UsageServiceClient, steps int, started time.Time, used pilotUsage) checkRow {
	if len(used.Sessions) == 0 {
		return checkRow{"pilot", false, "the pilot named no server session, so its cost is unknown"}
	}
	cost, err := pilotCost(ctx, usage, started, used)
	if err != nil {
		return checkRow{"pilot", false, "reading the pilot's usage: " + err.Error()}
	}
	return checkRow{"pilot", true, fmt.Sprintf("ran its first %d RL steps for real: its %s metered $%s",
		steps, plural(len(used.Sessions), "session was", "sessions were"), cost)}
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// pilotCost is what the usage buckets of a pilot's sessions and runs cost, from the hour
// it started to now (the sum of their costs). Other work of the workspace meanwhile is in
// other sessions and does not count.
func pilotCost(ctx context.Context, usage loopsv1connect.UsageServiceClient, started time.Time, used pilotUsage) (money.USD, error) {
	sessions := map[string]bool{}
	for _, s := range used.Sessions {
		sessions[s] = true
	}
	runs := map[string]bool{}
	for _, r := range used.Runs {
		runs[r] = true
	}
	return usageCost(ctx, usage, started.Add(-time.Hour), func(b *loopsv1.UsageBucket) bool {
		return (b.GetSessionId() != "" && sessions[b.GetSessionId()]) || (b.GetTrainingRunId() != "" && runs[b.GetTrainingRunId()])
	})
}

// usageCost is the sum of the costs of the caller's workspace's usage buckets from start to
// now that keep says to count.
func usageCost(ctx context.Context, usage loopsv1connect.UsageServiceClient, start time.Time, keep func(*loopsv1.UsageBucket) bool) (money.USD, error) {
	end := time.Now().Add(time.Minute)
	resp, err := usage.GetUsage(ctx, &loopsv1.GetUsageRequest{StartTime: timestamppb.New(start), EndTime: timestamppb.New(end)})
	if err != nil {
		return 0, err
	}
	var total money.USD
	for _, b := range resp.GetBuckets() {
		if b.GetCostUsd() == "" || !keep(b) {
			continue
		}
		c, err := money.ParseUSD(b.GetCostUsd(), money.Digits)
		if err != nil {
			return 0, err
		}
		if total, err = money.Add(total, c); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// resumeDir is the pilot's log folder in `check --json --pilot K` output ("resume"), which
// `run NAME --resume DIR` continues from; "" when there is none.
func resumeDir(out []byte) string {
	var res struct {
		Resume string `json:"resume"`
	}
	if json.Unmarshal(bytes.TrimSpace(out), &res) != nil {
		return ""
	}
	return res.Resume
}

// parseCheckOutput parses `check --json` output: {"checks": [{check, ok, detail}, ...],
// "estimate": EstimateCostRequest (with --estimate), "estimate_error": why the recipe
// cannot give one, "pilot_sessions" and "pilot_runs": what a pilot used (pilotUsage)}.
func parseCheckOutput(out []byte) ([]checkRow, *loopsv1.EstimateCostRequest, string, pilotUsage, error) {
	var res struct {
		pilotUsage
		Checks        []checkRow      `json:"checks"`
		Estimate      json.RawMessage `json:"estimate"`
		EstimateError string          `json:"estimate_error"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &res); err != nil {
		return nil, nil, "", pilotUsage{}, fmt.Errorf("cookbook: check --json printed no result: %w", err)
	}
	for i, r := range res.Checks {
		if r.Check == "" {
			return nil, nil, "", pilotUsage{}, fmt.Errorf("cookbook: check --json: row %d has no name", i)
		}
	}
	if len(res.Estimate) == 0 || string(res.Estimate) == "null" {
		return res.Checks, nil, res.EstimateError, res.pilotUsage, nil
	}
	var req loopsv1.EstimateCostRequest
	if err := protojson.Unmarshal(res.Estimate, &req); err != nil {
		return nil, nil, "", pilotUsage{}, fmt.Errorf("cookbook: check --json: estimate: %w", err)
	}
	return res.Checks, &req, res.EstimateError, res.pilotUsage, nil
}

// printEstimate writes an estimate's tokens and cost by usage kind, and its total; with
// pilot (an estimate extrapolated from a pilot), also its band. An estimate computed exactly
// from the recipe's data (vision_sft's tokens by kind, each line's band its amount) has none.
func printEstimate(w io.Writer, est *loopsv1.EstimateCostResponse, pilot bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	banded := pilot && est.GetTotalLowUsd() != ""
	orDash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	if banded {
		fmt.Fprintln(tw, "KIND\tTOKENS\tUSD\tTOKENS LOW-HIGH\tUSD LOW-HIGH")
	} else {
		fmt.Fprintln(tw, "KIND\tTOKENS\tUSD")
	}
	for _, u := range est.GetUsage() {
		kind := strings.ToLower(strings.TrimPrefix(u.GetKind().String(), "USAGE_KIND_"))
		fmt.Fprintf(tw, "%s\t%d\t%s", kind, u.GetAmount(), orDash(u.GetCostUsd()))
		if banded {
			fmt.Fprintf(tw, "\t%d-%d\t%s-%s", u.GetAmountLow(), u.GetAmountHigh(), orDash(u.GetCostLowUsd()), orDash(u.GetCostHighUsd()))
		}
		fmt.Fprintln(tw)
	}
	if banded {
		fmt.Fprintf(tw, "total\t\t%s\t\t%s-%s\n", est.GetTotalUsd(), est.GetTotalLowUsd(), est.GetTotalHighUsd())
	} else {
		fmt.Fprintf(tw, "total\t\t%s\n", est.GetTotalUsd())
	}
	_ = tw.Flush()
}

// serverChecks: reachable (/healthz), key valid and base model allowed (loops.v1
// WorkspaceService.GetWorkspace: the workspace's models with their effective max sequence
// length and LoRA rank), LoRA rank within the limit. It returns the rows and the model's max
// sequence length for the workspace (0 when unknown).
func serverChecks(ctx context.Context, url, apiKey string, s recipeSettings) ([]checkRow, int) {
	url = strings.TrimRight(url, "/")
	hc := &http.Client{Timeout: 10 * time.Second}
	var rows []checkRow
	add := func(check string, ok bool, format string, a ...any) {
		rows = append(rows, checkRow{check, ok, fmt.Sprintf(format, a...)})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
	if err != nil {
		add("server reachable", false, "%s: %v", url, err)
		return rows, 0
	}
	resp, err := hc.Do(req)
	if err != nil {
		add("server reachable", false, "%s: %v (start one with `loops serve`, or set --url / TINKER_BASE_URL)", url, err)
		return rows, 0
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		add("server reachable", false, "%s/healthz answered %s", url, resp.Status)
		return rows, 0
	}
	add("server reachable", true, "%s", url)
	if apiKey == "" {
		add("API key", false, "no key: set TINKER_API_KEY or --api-key (a tml-… key)")
		return rows, 0
	}
	cf := clientFlags{url: url, apiKey: apiKey}
	ws, err := loopsv1connect.NewWorkspaceServiceClient(hc, url, cf.options()...).GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{})
	if err != nil {
		if code := connect.CodeOf(err); code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied {
			add("API key", false, "refused: %v", connect.CodeOf(err))
		} else {
			add("API key", false, "workspace lookup failed: %v", err)
		}
		return rows, 0
	}
	add("API key", true, "workspace %s", ws.GetName())
	models := ws.GetLimits().GetModels()
	i := slices.IndexFunc(models, func(m *loopsv1.ModelInfo) bool { return m.GetName() == s.Model })
	if i < 0 {
		names := make([]string, len(models))
		for j, m := range models {
			names[j] = m.GetName()
		}
		add("base model", false, "%s is not allowed for this key; allowed: %s", s.Model, strings.Join(names, ", "))
		return rows, 0
	}
	m := models[i]
	add("base model", true, "%s allowed, max sequence length %d, max LoRA rank %d", s.Model, m.GetMaxSequenceLength(), m.GetMaxLoraRank())
	if r := int(m.GetMaxLoraRank()); r > 0 && s.LoraRank > r {
		add("LoRA rank", false, "lora_rank=%d is over the limit %d: pass lora_rank=%d or less", s.LoraRank, r, r)
	} else {
		add("LoRA rank", true, "lora_rank=%d", s.LoraRank)
	}
	return rows, int(m.GetMaxSequenceLength())
}

// printChecks writes the pass/fail table.
func printChecks(w io.Writer, rows []checkRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, r := range rows {
		res := "PASS"
		if !r.OK {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Check, res, r.Detail)
	}
	tw.Flush()
}
