// Package policy is the workspace policy: which base models a workspace may use, the longest
// sequence and the largest LoRA rank it may send, and how many training runs, queued
// operations and running samples it may have at once. `loops serve --workspace-policy FILE`
// loads it (Load); the core asks an Enforcer at its validation points and keeps the
// per-workspace counters of current use here.
//
// # File format
//
// YAML or JSON (YAML is a superset; unknown keys are errors):
//
//	# Workspaces not listed under workspaces get the default section.
//	default:
//	  models: ["*"]              # base models allowed: names, "*" (every model) or path.Match patterns ("Qwen/*")
//	  max_sequence_length: 0     # tokens per sequence (prompt + max_tokens when sampling)
//	  max_lora_rank: 0           # rank of a new training run
//	  max_concurrent_runs: 0     # training runs live at once
//	  max_queued_operations: 0   # operations queued or running at once
//	  sampling_concurrency: 0    # samples running at once; more wait (and count as queued)
//	  allow_jobs: false          # may its keys run managed jobs (`loops jobs`, docs/jobs.md)
//	  allow_full_finetune: false # may it start full fine-tuning runs (LoRA rank 0, docs/semantics.md)
//	  max_running_jobs: 0        # jobs running at once (0: the server's default, 2)
//	  max_job_seconds: 0         # a job's wall time (0: the server's default, 3600)
//	  max_job_memory_mb: 0       # a job's memory in MiB, at least 256 (0: the server's default, 8192)
//	  max_deployment_replicas: 0 # replicas one deployment may ask for (0: the server's bound, 8)
//	  dedicated: allowed         # runs with pools of their own: off, allowed (when asked), always
//	  allowed_modalities: [text, image] # input it may send: text, image (left out: every modality)
//	  budget_usd_month: "0"      # US dollars it may spend in a UTC month, priced by --prices (0: no budget)
//	  budget_usd_total: "0"      # US dollars it may spend in all (0: no budget)
//	workspaces:
//	  team-a:                    # a workspace name, as --api-key KEY=WORKSPACE gives it
//	    models: [loops/tiny]
//	    max_sequence_length: 128
//	    max_concurrent_runs: 2
//
// Every limit is a whole number: positive is the limit, 0 is "no limit of the workspace's
// own" (the model's limits and the server's queues still apply), negative is an error. A key
// left out of a workspace's section is taken from the default section; one left out of the
// default section is 0, and models left out means every served model. With no policy file
// every workspace gets that empty default: the server behaves as it does without a policy.
// Each models entry must match at least one model the server serves; an empty list is an
// error.
//
// # Errors
//
// A base model the workspace may not use is PermissionDenied (HTTP 403) naming the model and
// the allowed ones; so is input of a modality its allowed_modalities leaves out (an image
// chunk, an OpenAI image_url part, an Anthropic image block), refused before any work, and a
// full fine-tuning run (LoRA rank 0) where allow_full_finetune is off and no access grant
// allows it on the model (reason FULL_FINETUNE_NOT_ALLOWED). A sequence or LoRA rank over the workspace's limit is InvalidArgument
// (400). A workspace at max_concurrent_runs or max_queued_operations gets ResourceExhausted
// (429, which the tinker SDK backs off and retries) naming the limit. Sampling over
// sampling_concurrency is not refused: the sample waits for one of the workspace's slots
// (so one workspace cannot take every sampler slot), counted against max_queued_operations.
// The operations that create and unload a run always enter the queue: a new run is checked
// for room in the queue when it is admitted, and an unload frees capacity.
//
// # Current use
//
// Live runs are the runs created since the server started that have not been unloaded,
// ended with their session, or failed to create; runs recovered after a restart hold no
// adapter and are not counted. Queued operations are operations created and not yet
// finished. The counters are per workspace, kept only while non-zero, and updated through
// the Enforcer's Start/End hooks, each idempotent by id.
package policy
