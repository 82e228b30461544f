package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestJobsKeys(t *testing.T) {
	p, err := Parse([]byte(`
default:
  max_job_seconds: 600
workspaces:
  team-a:
    allow_jobs: true
    max_running_jobs: 3
    max_job_memory_mb: 2048
  team-b:
    max_job_seconds: 60
`))
	require.NoError(t, err)
	require.Equal(t, Limits{AllowJobs: true, MaxRunningJobs: 3, MaxJobSeconds: 600, MaxJobMemoryMB: 2048}, p.For("team-a"))
	require.Equal(t, Limits{MaxJobSeconds: 60}, p.For("team-b"))
	require.False(t, p.For("other").AllowJobs, "jobs are off by default")
	require.False(t, Default().For("any").AllowJobs)

	_, err = Parse([]byte("default:\n  max_running_jobs: -1\n"))
	require.ErrorContains(t, err, "default.max_running_jobs is -1")
	_, err = Parse([]byte("default:\n  allow_job: true\n"))
	require.ErrorContains(t, err, "allow_jobs")
}

// max_job_memory_mb below what a job needs to start is refused with the minimum; 0 is the
// server's default.
func TestJobsMemoryMinimum(t *testing.T) {
	_, err := Parse([]byte("workspaces:\n  team-a:\n    max_job_memory_mb: 100\n"))
	require.ErrorContains(t, err, "workspaces.team-a.max_job_memory_mb is 100")
	require.ErrorContains(t, err, "256")
	p, err := Parse([]byte("default:\n  max_job_memory_mb: 0\nworkspaces:\n  team-a:\n    max_job_memory_mb: 256\n"))
	require.NoError(t, err)
	require.Equal(t, 256, p.For("team-a").MaxJobMemoryMB)
}
