package gateway

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/loops-dev/loops/gateway/jobs"
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
}

// newJobs starts the job service on the server's store, under DATA_DIR/jobs.
func (s *Server) newJobs(ctx context.Context) (*jobs.Service, error) {
	// Jobs read the base models' files (get_tokenizer() loads the tokenizer from the path the
	// server gives): the data dir's built-in models and the Hugging Face cache, read-only.
	// Nothing else of the data dir is visible to them.
	var binds, env []string
	if fi, err := os.Stat(filepath.Join(s.cfg.DataDir, "models")); err == nil && fi.IsDir() {
		binds = append(binds, filepath.Join(s.cfg.DataDir, "models"))
	}
	if hf := hfHome(); hf != "" {
		binds = append(binds, hf)
		env = append(env, "HF_HOME="+hf)
	}
	j, err := jobs.New(ctx, jobs.Options{
		Binds:   binds,
		Env:     env,
		Dir:     filepath.Join(s.cfg.DataDir, "jobs"),
		Store:   s.store,
		Policy:  s.cfg.Core.Policy,
		Gateway: s.ln.Addr().String(),
		Python:  s.cfg.Jobs.Python,
		Relay:   s.cfg.Jobs.Relay,
		Logger:  s.log,
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.jobs = j
	s.mu.Unlock()
	return j, nil
}

// hfHome is the Hugging Face cache folder when it exists (HF_HOME, else
// ~/.cache/huggingface), as an absolute path.
func hfHome() string {
	hf := os.Getenv("HF_HOME")
	if hf == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		hf = filepath.Join(cache, "huggingface")
	}
	hf, err := filepath.Abs(hf)
	if err != nil {
		return ""
	}
	if fi, err := os.Stat(hf); err != nil || !fi.IsDir() {
		return ""
	}
	return hf
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
