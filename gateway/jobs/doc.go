// Package jobs runs workspaces' training scripts next to the gateway as managed processes
// and serves loops.v1 JobService (`loops jobs submit|list|logs|cancel`, docs/jobs.md).
//
// A job is an uploaded script (a tar archive of its folder and an entrypoint) or a cookbook
// recipe, run with the cookbook's cached venv. Its upload is unpacked under the data dir
// (jobs/<id>/upload, bounded in size, file count and path shape: Unpack) and it runs as
//
//	bwrap --userns FD ... -- relay [FLAGS] -- relay limit [LIMITS] -- python SCRIPT ARGS
//
// with TINKER_API_KEY set to the submitting request's key and TINKER_BASE_URL to
// http://127.0.0.1:PORT, PORT being the gateway's.
//
// # The sandbox
//
// A job is attacked from, not trusted (docs/security.md has the threat model):
//
//   - User: its own user namespace (userNamespace), in which it runs as uid 1000 with no
//     capability, mapped to an unprivileged host user: under a root gateway a uid of its
//     own (Options.UIDBase + its slot, never 0, never the gateway's), under an unprivileged
//     gateway the gateway's own user (the only one it can map). Under a root gateway
//     bubblewrap sets the sandbox up as root of the namespace (so it can bind folders only
//     root may reach) and the relay drops to 1000, bounding set included, before anything
//     of the job's runs. no_new_privs keeps set-uid files inert.
//   - System calls: a seccomp filter (seccomp.go) refuses mounting, tracing, the keyring,
//     BPF, perf, io_uring, new namespaces, handles, kexec, modules, reboot and terminal
//     injection (TIOCSTI, TIOCLINUX), and every call of another architecture's numbering.
//   - Terminal: a new session with no controlling terminal, stdin on /dev/null, and a /dev
//     of null, zero, full, random and urandom only.
//   - Files: the system folders, the venv, the cookbook's source, the data dir's built-in
//     models and the Hugging Face cache's model repositories (snapshots, blobs, refs: not
//     its token) read-only; /job (its files, copied by the relay from the read-only upload),
//     /tmp and /dev/shm are tmpfs of bounded size, gone with the sandbox: nothing a job
//     writes reaches the host's disk or another job, and the gateway never reads or
//     removes a file a job made.
//   - Resources: a cgroup per job where the host gives one (cgroup.go: v2, or v1 as root):
//     memory.max (its tmpfs included), pids.max, an equal CPU share. Without one, jobs are
//     refused (ReasonNoLimits) unless Options.WeakLimits: then each process is held to the
//     job's memory by RLIMIT_AS. RLIMIT_NPROC (per job: the kernel counts it per user
//     namespace) bounds its processes either way. Those limits bind the job's Python, not
//     the relay (`relay limit`).
//
// # Network
//
// The sandbox has its own network namespace, so it has a loopback interface and no route
// anywhere, not even to the host's loopback where the gateway listens. The gateway binds a
// Unix socket of its own (jobs/<id>/run/gw.sock) into the sandbox, and the first process in
// the sandbox, the relay (RelayMain, `loops jobs relay`), listens on 127.0.0.1:PORT inside
// and carries each connection to that socket. The gateway hands the socket's connections
// to its HTTP server through a Listener (at most Options.MaxJobConns open per job, one
// descriptor each, closed by the server's timeouts when idle), their remote address the
// job's id: a job's request is never taken for a loopback client's (in open mode, an
// operator's). A job therefore reaches the gateway and nothing else: no other host, no
// other port of this host, no cloud metadata address.
//
// # Quotas and policy
//
// A workspace may submit jobs only when its policy sets allow_jobs (403 JOBS_NOT_ALLOWED
// otherwise, naming the flag and how to set it). max_running_jobs (default 2),
// max_job_seconds (3600) and max_job_memory_mb (8192, at least 256) apply per workspace;
// the gateway caps jobs of all workspaces at Options.MaxRunningAll (8). A full quota is
// 429 JOB_QUOTA. A log is one file, capped at Options.MaxLogBytes (16 MiB) with a note
// where it was cut.
//
// # Lifecycle
//
// A job runs on after its client disconnects. CancelJob, the wall time and Close (gateway
// shutdown) stop it: SIGTERM to the relay, which passes it on to every process of the job,
// SIGKILL after the grace (10 s). Its end (state, exit status, reason, log size) is
// written to the store; its upload and socket are removed and its log kept, with the
// workspace's newest Options.MaxKeptJobs (100) jobs: older finished ones are deleted then,
// record and log. A gateway that dies without Close kills its sandboxes with it
// (bubblewrap's --die-with-parent) and leaves running records behind: New marks them
// failed with ReasonRestarted and removes what they left but their logs.
package jobs
