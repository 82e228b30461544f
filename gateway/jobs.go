package gateway

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/loops-dev/loops/gateway/jobs"
	"github.com/loops-dev/loops/internal/hfcache"
)

// JobsConfig configures managed jobs (gateway/jobs, docs/jobs.md). Whether a workspace may
// run them, and its quotas, come from the workspace policy (Config.Core.Policy).
type JobsConfig struct {
	// Python prepares the interpreter jobs run with (the cookbook's cached venv); nil
	// refuses jobs with FailedPrecondition.
	Python func(ctx context.Context, log io.Writer) (jobs.Python, error)
	// Relay is the command that runs jobs.RelayMain inside a job's sandbox (`loops jobs
	// relay`: the loops binary's path, then "jobs", "relay").
	Relay []string
	// RelayEnv is added to the relay's environment (tests use it to select RelayMain).
	RelayEnv []string
	// Recipes are the cookbook recipes Python's cookbook has (jobs.Options.Recipes).
	Recipes []string
	// CgroupParent, WeakLimits and UIDBase are jobs.Options' (`loops serve --jobs-cgroup,
	// --jobs-weak-limits, --jobs-uid-base`): where the jobs' cgroups go, whether jobs may
	// run without one, and the host uids of a root gateway's jobs.
	CgroupParent string
	WeakLimits   bool
	UIDBase      int
}

// jobsListener is the listener of the jobs' connections, served next to the TCP one.
func (s *Server) jobsListener() *jobs.Listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jobsLn == nil {
		s.jobsLn = jobs.NewListener(s.ln.Addr())
	}
	return s.jobsLn
}

// newJobs starts the job service on the server's store, under DATA_DIR/jobs.
func (s *Server) newJobs(ctx context.Context) (*jobs.Service, error) {
	// Jobs read the base models' files (get_tokenizer() loads the tokenizer from the path the
	// server gives): the data dir's built-in models and the model repositories of the
	// Hugging Face cache, read-only. Nothing else of the data dir, nor of the cache (its
	// token), is visible to them.
	var binds, env []string
	if fi, err := os.Stat(filepath.Join(s.cfg.DataDir, "models")); err == nil && fi.IsDir() {
		binds = append(binds, filepath.Join(s.cfg.DataDir, "models"))
	}
	// The job's huggingface_hub is told the gateway's folders (hfcache), whatever its own
	// environment would make of it.
	var caches []string
	if hf, err := hfcache.Home(); err == nil && isDir(hf) {
		env = append(env, "HF_HOME="+hf)
	}
	if hub, err := hfcache.HubDir(); err == nil && isDir(hub) {
		caches = append(caches, hub)
		env = append(env, "HF_HUB_CACHE="+hub)
	}
	j, err := jobs.New(ctx, jobs.Options{
		Binds:        binds,
		Env:          env,
		ModelCaches:  caches,
		Dir:          filepath.Join(s.cfg.DataDir, "jobs"),
		Store:        s.store,
		Policy:       s.cfg.Core.Policy,
		Gateway:      s.ln.Addr().String(),
		Listener:     s.jobsListener(),
		Python:       s.cfg.Jobs.Python,
		Relay:        s.cfg.Jobs.Relay,
		RelayEnv:     s.cfg.Jobs.RelayEnv,
		Recipes:      s.cfg.Jobs.Recipes,
		CgroupParent: s.cfg.Jobs.CgroupParent,
		WeakLimits:   s.cfg.Jobs.WeakLimits,
		UIDBase:      s.cfg.Jobs.UIDBase,
		Logger:       s.log,
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.jobs = j
	s.mu.Unlock()
	return j, nil
}

// isDir reports whether p is a folder.
func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// closeJobs stops the running jobs within ctx (before the listener closes: they talk to it).
func (s *Server) closeJobs(ctx context.Context) {
	s.mu.Lock()
	j := s.jobs
	s.mu.Unlock()
	if j == nil {
		return
	}
	if err := j.Close(ctx); err != nil {
		s.log.Warn("jobs still stopping at the end of the grace", "err", err)
	}
}
