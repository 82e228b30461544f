package gateway

import (
	"context"
	"io"
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
	j, err := jobs.New(ctx, jobs.Options{
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
