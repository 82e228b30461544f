package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/loops-dev/loops/cookbook"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/jobs"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
)

const jobsHelp = `Run training scripts next to the gateway as managed jobs (docs/jobs.md).

A job is a Python script (its folder uploaded as a tar.gz) or a cookbook recipe, run in a
bubblewrap sandbox on the gateway's host with TINKER_API_KEY set to your key and
TINKER_BASE_URL to the gateway. It keeps running when this command ends; its log and exit
status stay. Only workspaces whose policy sets allow_jobs: true may run jobs.

  loops jobs submit train.py -- --steps 10      # uploads train.py's folder
  loops jobs submit --recipe sft_chat -f -- steps=20
  loops jobs list
  loops jobs logs JOB_ID -f
  loops jobs cancel JOB_ID

With -f, submit and logs follow the log to the job's end and exit with its status (1 when
it failed without one, 130 when it was cancelled).`

func jobsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "jobs", Short: "Submit, list, follow and cancel managed training jobs", Long: jobsHelp}
	cf.register(cmd)
	client := func() loopsv1connect.JobServiceClient {
		return loopsv1connect.NewJobServiceClient(http.DefaultClient, cf.url, cf.options()...)
	}

	var recipe, dir string
	var follow bool
	submit := &cobra.Command{
		Use:   "submit [--recipe NAME | SCRIPT] [-- ARGS...]",
		Short: "Upload a script's folder (or name a recipe) and start it as a job",
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &loopsv1.SubmitJobRequest{Recipe: recipe}
			rest := args
			if recipe == "" {
				if len(args) == 0 || cmd.ArgsLenAtDash() == 0 {
					return &exitError{2, "give a script to run, or --recipe NAME"}
				}
				script := args[0]
				rest = args[1:]
				if dir == "" {
					dir = filepath.Dir(script)
				}
				rel, err := filepath.Rel(dir, script)
				if err != nil || strings.HasPrefix(rel, "..") {
					return &exitError{2, fmt.Sprintf("%s is not inside --dir %s", script, dir)}
				}
				req.Entrypoint = filepath.ToSlash(rel)
			} else if cmd.ArgsLenAtDash() > 0 {
				return &exitError{2, "with --recipe, put the recipe's arguments after --"}
			}
			if dir != "" {
				b, err := tarDir(dir, jobs.DefaultMaxArchiveBytes)
				if err != nil {
					return &exitError{2, err.Error()}
				}
				req.Archive = b
			}
			req.Args = rest
			j, err := client().SubmitJob(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "job %s started; follow it with: loops jobs logs %s -f\n", j.GetId(), j.GetId())
			if !follow {
				fmt.Println(j.GetId())
				return nil
			}
			return followJob(cmd.Context(), client(), j.GetId(), true)
		},
	}
	submit.Flags().StringVar(&recipe, "recipe", "", "run a cookbook recipe (loops cookbook list) instead of a script")
	submit.Flags().StringVar(&dir, "dir", "", "folder to upload (default: the script's folder; none for a recipe)")
	submit.Flags().BoolVarP(&follow, "follow", "f", false, "follow the log to the job's end and exit with its status")

	var limit int32
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workspace's jobs, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := client().ListJobs(cmd.Context(), &loopsv1.ListJobsRequest{PageSize: limit})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tRUNS\tCREATED\tEXIT\tLOG\tREASON")
			for _, j := range res.GetJobs() {
				what := j.GetEntrypoint()
				if j.GetRecipe() != "" {
					what = "recipe " + j.GetRecipe()
				}
				exit := ""
				if j.GetState() != loopsv1.JobState_JOB_STATE_RUNNING {
					exit = fmt.Sprint(j.GetExitCode())
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", j.GetId(), jobState(j), what,
					j.GetCreateTime().AsTime().Local().Format(time.DateTime), exit, j.GetLogBytes(), j.GetReason())
			}
			return tw.Flush()
		},
	}
	list.Flags().Int32Var(&limit, "limit", 50, "how many to list")

	var followLogs bool
	logs := &cobra.Command{
		Use:   "logs JOB_ID",
		Short: "Print a job's log (-f: follow it to the job's end)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return followJob(cmd.Context(), client(), args[0], followLogs)
		},
	}
	logs.Flags().BoolVarP(&followLogs, "follow", "f", false, "follow the log to the job's end and exit with its status")

	cancel := &cobra.Command{
		Use:   "cancel JOB_ID",
		Short: "Stop a running job (SIGTERM, SIGKILL after the gateway's grace)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			j, err := client().CancelJob(cmd.Context(), &loopsv1.CancelJobRequest{Id: args[0]})
			if err != nil {
				return err
			}
			fmt.Printf("%s %s %s\n", j.GetId(), jobState(j), j.GetReason())
			return nil
		},
	}

	relay := &cobra.Command{
		Use:    "relay [FLAGS] -- COMMAND...",
		Short:  "Inside a job's sandbox: carry the gateway's port to its socket and run the job",
		Hidden: true,
		// The job's own arguments must reach it untouched.
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			os.Exit(jobs.RelayMain(args, os.Stderr))
			return nil
		},
	}
	cmd.AddCommand(submit, list, logs, cancel, relay)
	return cmd
}

func jobState(j *loopsv1.Job) string {
	return strings.ToLower(strings.TrimPrefix(j.GetState().String(), "JOB_STATE_"))
}

// followJob prints a job's log from the start; with follow it long-polls to the job's end
// and ends with the job's exit status.
func followJob(ctx context.Context, cl loopsv1connect.JobServiceClient, id string, follow bool) error {
	var off int64
	for {
		var wait int32
		if follow {
			wait = 30
		}
		res, err := cl.ReadJobLogs(ctx, &loopsv1.ReadJobLogsRequest{Id: id, Offset: off, WaitSeconds: wait})
		if err != nil {
			return err
		}
		_, _ = os.Stdout.Write(res.GetData())
		off = res.GetNextOffset()
		j := res.GetJob()
		if len(res.GetData()) > 0 && off < j.GetLogBytes() {
			continue // more to read at once
		}
		if !follow {
			return nil
		}
		if j.GetState() == loopsv1.JobState_JOB_STATE_RUNNING || off < j.GetLogBytes() {
			continue
		}
		switch j.GetState() {
		case loopsv1.JobState_JOB_STATE_SUCCEEDED:
			return nil
		case loopsv1.JobState_JOB_STATE_CANCELLED:
			return &exitError{130, fmt.Sprintf("job %s was cancelled: %s", id, j.GetReason())}
		}
		code := int(j.GetExitCode())
		if code <= 0 || code > 125 {
			code = 1
		}
		return &exitError{code, fmt.Sprintf("job %s failed: %s", id, j.GetReason())}
	}
}

// tarDir packs a folder as a tar.gz for upload: regular files and folders, skipping hidden
// entries, __pycache__ and links; an error when the archive passes limit bytes.
func tarDir(dir string, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		name := d.Name()
		if strings.HasPrefix(name, ".") || name == "__pycache__" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.IsDir() && !info.Mode().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			_ = f.Close()
			if err != nil {
				return err
			}
		}
		if int64(buf.Len()) > limit {
			return fmt.Errorf("the folder %s packs to more than %d bytes, the upload cap: upload less (pass data paths as arguments, or use --dir on a smaller folder)", dir, limit)
		}
		return nil
	})
	if err == nil {
		err = errors.Join(tw.Close(), zw.Close())
	}
	if err == nil && int64(buf.Len()) > limit {
		err = fmt.Errorf("the folder %s packs to %d bytes, over the %d-byte upload cap", dir, buf.Len(), limit)
	}
	return buf.Bytes(), err
}

// jobsServeFlags are `loops serve`'s flags for jobs' sandboxes.
type jobsServeFlags struct {
	cgroup  string
	weak    bool
	uidBase int
}

func (f *jobsServeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.cgroup, "jobs-cgroup", env("LOOPS_JOBS_CGROUP", ""), "where jobs' cgroups go: empty finds one (the gateway's own cgroup v2 cgroup, else cgroup v1 as root), a delegated cgroup v2 folder holding no process, or \"none\" (docs/jobs.md)")
	fl.BoolVar(&f.weak, "jobs-weak-limits", os.Getenv("LOOPS_JOBS_WEAK_LIMITS") == "1", "run jobs without a cgroup, each process held to the job's memory but not the job as a whole (otherwise jobs are refused where no cgroup can bound them; LOOPS_JOBS_WEAK_LIMITS=1)")
	fl.IntVar(&f.uidBase, "jobs-uid-base", envInt("LOOPS_JOBS_UID_BASE", jobs.DefaultUIDBase), "under a root gateway, the host uid of the first running job; each of the 8 job slots gets the next (never 0, never a real user's)")
}

// envInt is an integer environment variable, or def when unset or not a number.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// config is how `loops serve` runs jobs: with the cookbook's cached venv (or
// LOOPS_COOKBOOK_PYTHON / LOOPS_COOKBOOK_DIR, as `loops cookbook` does), and this binary as
// the relay inside the sandbox.
func (f *jobsServeFlags) config() gateway.JobsConfig {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	// The recipe list of the cookbook jobs run (LOOPS_COOKBOOK_DIR, else the embedded one):
	// an unknown recipe is refused at submit. One that cannot be read leaves the check to
	// the recipe's start.
	var src fs.FS = cookbook.Files
	if dir := os.Getenv("LOOPS_COOKBOOK_DIR"); dir != "" {
		src = os.DirFS(dir)
	}
	recipes, err := cookbook.Recipes(src)
	if err != nil {
		slog.Warn("jobs: the cookbook's recipe list cannot be read; recipe names are checked when a job starts", "err", err)
	}
	return gateway.JobsConfig{
		Recipes:      recipes,
		Relay:        []string{exe, "jobs", "relay"},
		CgroupParent: f.cgroup,
		WeakLimits:   f.weak,
		UIDBase:      f.uidBase,
		Python: func(ctx context.Context, log io.Writer) (jobs.Python, error) {
			cf := cookbookFlags{python: os.Getenv("LOOPS_COOKBOOK_PYTHON"), dir: os.Getenv("LOOPS_COOKBOOK_DIR")}
			py, err := cf.prepare(ctx, log)
			if err != nil {
				return jobs.Python{}, err
			}
			return jobs.Python{Exe: py.exe, Env: py.env, Binds: pythonBinds(py)}, nil
		},
	}
}

// pythonBinds are the folders a job's sandbox needs read-only to run py: the cookbook's
// source (PYTHONPATH), the venv, and the installation its interpreter links to.
func pythonBinds(py *cookbookPython) []string {
	var out []string
	add := func(p string) {
		if p == "" || p == "/" || p == "/usr" {
			return
		}
		for _, o := range out {
			if o == p {
				return
			}
		}
		out = append(out, p)
	}
	for _, e := range py.env {
		if v, ok := strings.CutPrefix(e, "PYTHONPATH="); ok {
			add(v)
		}
	}
	exe, _ := filepath.Abs(py.exe)
	add(filepath.Dir(filepath.Dir(exe)))
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		add(filepath.Dir(filepath.Dir(real)))
	}
	return out
}
