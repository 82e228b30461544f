// Package jobs runs workspaces' training scripts next to the gateway as managed processes
// and serves loops.v1 JobService (`loops jobs submit|list|logs|cancel`, docs/jobs.md).
//
// A job is an uploaded script (a tar archive of its folder and an entrypoint) or a cookbook
// recipe, run with the cookbook's cached venv. Its files are unpacked under the data dir
// (jobs/<id>/files, bounded in size, file count and path shape: Unpack) and it runs as
//
//	prlimit --as=MEMORY -- bwrap --unshare-all ... -- relay 127.0.0.1:PORT SOCKET -- python SCRIPT ARGS
//
// with TINKER_API_KEY set to the submitting request's key and TINKER_BASE_URL to
// http://127.0.0.1:PORT, PORT being the gateway's. The sandbox sees the system folders and the
// venv read-only, its own folder as /job, a fresh /tmp, and nothing of the data dir or other
// jobs.
//
// # Network
//
// The sandbox has its own network namespace, so it has a loopback interface and no route
// anywhere, not even to the host's loopback where the gateway listens. The gateway binds a
// Unix socket of its own (jobs/<id>/run/gw.sock) into the sandbox, and the first process in
// the sandbox, the relay (RelayMain, `loops jobs relay`), listens on 127.0.0.1:PORT inside
// and carries each connection to that socket, which the gateway connects to its own
// listener. A job therefore reaches the gateway and nothing else: no other host, no other
// port of this host, no cloud metadata address. (Sharing the host's network namespace would
// have been simpler and would let a job reach every service on the host.)
//
// # Quotas and policy
//
// A workspace may submit jobs only when its policy sets allow_jobs (403 JOBS_NOT_ALLOWED
// otherwise, naming the flag and how to set it). max_running_jobs (default 2), max_job_seconds (3600) and
// max_job_memory_mb (8192, an address-space limit through prlimit: a script over it gets
// MemoryError) apply per workspace; the gateway caps jobs of all workspaces at
// Options.MaxRunningAll (8). A full quota is 429 JOB_QUOTA. A log is one file, capped at
// Options.MaxLogBytes (16 MiB) with a note where it was cut.
//
// # Lifecycle
//
// A job runs on after its client disconnects. CancelJob, the wall time and Close (gateway
// shutdown) stop it: SIGTERM to the job's processes, SIGKILL to its process group after the
// grace (10 s). Its end (state, exit status, reason, log size) is written to the store; its
// files are removed and its log kept, with the workspace's newest Options.MaxKeptJobs (100)
// jobs: older finished ones are deleted then, record and log. A gateway that dies without Close leaves running
// records behind: New marks them failed with ReasonRestarted.
package jobs
