package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/internal/filewatch"
	"github.com/loops-dev/loops/internal/money"
	"sigs.k8s.io/yaml"
)

// Section is one section of a policy file: the default section or a workspace's. A nil
// field is left out and inherited (see the package doc).
type Section struct {
	// Models are the base models allowed: names, or path.Match patterns such as "*".
	Models *[]string `json:"models,omitempty"`
	// MaxSequenceLength caps the tokens of one sequence.
	MaxSequenceLength *int `json:"max_sequence_length,omitempty"`
	// MaxLoraRank caps the LoRA rank of a new training run.
	MaxLoraRank *int `json:"max_lora_rank,omitempty"`
	// MaxConcurrentRuns caps the training runs live at once.
	MaxConcurrentRuns *int `json:"max_concurrent_runs,omitempty"`
	// MaxQueuedOperations caps the operations queued or running at once.
	MaxQueuedOperations *int `json:"max_queued_operations,omitempty"`
	// SamplingConcurrency caps the sampling operations running at once.
	SamplingConcurrency *int `json:"sampling_concurrency,omitempty"`
	// AllowJobs lets the workspace's keys run managed jobs (`loops jobs`); off by default.
	AllowJobs *bool `json:"allow_jobs,omitempty"`
	// AllowFullFinetune lets the workspace start full fine-tuning runs (LoRA rank 0: every
	// weight of the model trained) on its models; off by default.
	AllowFullFinetune *bool `json:"allow_full_finetune,omitempty"`
	// MaxRunningJobs caps the workspace's jobs running at once (0: the server's default).
	MaxRunningJobs *int `json:"max_running_jobs,omitempty"`
	// MaxJobSeconds caps a job's wall time (0: the server's default).
	MaxJobSeconds *int `json:"max_job_seconds,omitempty"`
	// MaxJobMemoryMB caps a job's memory, in MiB, at least MinJobMemoryMB (0: the server's
	// default).
	MaxJobMemoryMB *int `json:"max_job_memory_mb,omitempty"`
	// MaxDeploymentReplicas caps the sampler replicas one of the workspace's deployments
	// may ask for (0: the server's bound, 8). With worker pools, replicas scale the shared
	// pool of the deployment's base model.
	MaxDeploymentReplicas *int `json:"max_deployment_replicas,omitempty"`
	// Dedicated says whether the workspace's runs get worker pools of their own (dedicated
	// mode): "off" (refused), "allowed" (when a run asks; the default) or "always".
	Dedicated *string `json:"dedicated,omitempty"`
	// AllowedModalities are the input modalities the workspace may send (Modalities:
	// "text", "image"); left out, every modality its models take. text must be listed.
	AllowedModalities *[]string `json:"allowed_modalities,omitempty"`
	// CheckpointKeepNewest and CheckpointKeepBest turn on checkpoint retention: per run the
	// newest N checkpoints of each kind and the N best sampler checkpoints by the eval
	// CheckpointKeepBestEval are kept, the others deleted CheckpointRetentionGraceSeconds
	// after the sweep first finds them outside that set (never a deployed or public one);
	// 0 and 0 keep everything (docs/evals.md, "Retention").
	CheckpointKeepNewest            *int    `json:"checkpoint_keep_newest,omitempty"`
	CheckpointKeepBest              *int    `json:"checkpoint_keep_best,omitempty"`
	CheckpointKeepBestEval          *string `json:"checkpoint_keep_best_eval,omitempty"`
	CheckpointRetentionGraceSeconds *int    `json:"checkpoint_retention_grace_seconds,omitempty"`
	// BudgetUSDMonth and BudgetUSDTotal cap what the workspace may spend, in US dollars
	// (decimals, at most 6 places) priced by the price sheet (loops serve --prices): in a
	// calendar month (UTC) and in all. New work that would pass one is refused.
	BudgetUSDMonth *json.Number `json:"budget_usd_month,omitempty"`
	BudgetUSDTotal *json.Number `json:"budget_usd_total,omitempty"`
}

// MinJobMemoryMB is the smallest max_job_memory_mb accepted: a job's Python interpreter and
// its sandbox's relay need about that much to start.
const MinJobMemoryMB = 256

// File is a policy file as written.
type File struct {
	// Default applies to every workspace not listed, and fills in what a listed one leaves out.
	Default Section `json:"default"`
	// Workspaces are the sections of named workspaces.
	Workspaces map[string]Section `json:"workspaces"`
}

// Limits are one workspace's effective limits. A zero limit means no limit of the
// workspace's own; nil Models means every served model.
type Limits struct {
	Models              []string
	MaxSequenceLength   int
	MaxLoraRank         int
	MaxConcurrentRuns   int
	MaxQueuedOperations int
	SamplingConcurrency int
	// AllowJobs says whether the workspace may run managed jobs.
	AllowJobs bool
	// AllowFullFinetune says whether the workspace may start full fine-tuning runs (LoRA
	// rank 0); an access grant allows it on one model (Grant.FullFinetune).
	AllowFullFinetune bool
	// MaxRunningJobs, MaxJobSeconds and MaxJobMemoryMB are the workspace's job quotas; 0
	// takes the job service's defaults.
	MaxRunningJobs int
	MaxJobSeconds  int
	MaxJobMemoryMB int
	// MaxDeploymentReplicas caps a deployment's replicas; 0 takes the server's bound.
	MaxDeploymentReplicas int
	// Dedicated is DedicatedOff, DedicatedAllowed (the default) or DedicatedAlways.
	Dedicated string
	// AllowedModalities are the input modalities the workspace may send; nil: every one.
	AllowedModalities []string
	// Checkpoint retention (Section.CheckpointKeepNewest): off while both counts are 0.
	CheckpointKeepNewest, CheckpointKeepBest int
	CheckpointKeepBestEval                   string
	CheckpointRetentionGraceSeconds          int
	// BudgetMonth and BudgetTotal cap the workspace's spend in a UTC calendar month and in
	// all (0: no budget).
	BudgetMonth, BudgetTotal money.USD
}

// Retains reports whether the workspace's checkpoints are subject to retention.
func (l Limits) Retains() bool { return l.CheckpointKeepNewest > 0 || l.CheckpointKeepBest > 0 }

// The values of a section's dedicated key.
const (
	DedicatedOff     = "off"
	DedicatedAllowed = "allowed"
	DedicatedAlways  = "always"
)

// The input modalities a policy's allowed_modalities may list (ModelInfo.modalities).
const (
	ModalityText  = "text"
	ModalityImage = "image"
)

// Modalities are the input modalities a policy's allowed_modalities may list.
var Modalities = []string{ModalityText, ModalityImage}

// The availability of a model (ModelInfo.availability): runs on the shared pools of its
// base model (serverless), or on a pool of their own (dedicated, the dedicated key).
const (
	AvailabilityServerless = "serverless"
	AvailabilityDedicated  = "dedicated"
)

// Modalities are the input modalities the limits allow: AllowedModalities, or every one
// (Modalities) when the policy leaves it out.
func (l Limits) Modalities() []string {
	if l.AllowedModalities == nil {
		return slices.Clone(Modalities)
	}
	return slices.Clone(l.AllowedModalities)
}

// AllowsModality reports whether the limits allow input of a modality.
func (l Limits) AllowsModality(m string) bool {
	return l.AllowedModalities == nil || slices.Contains(l.AllowedModalities, m)
}

// Policy is a parsed, validated policy: the limits of each listed workspace and of the rest.
// The zero value and nil give every workspace no limits of its own.
type Policy struct {
	def Limits
	ws  map[string]Limits
}

// Default returns the policy of a server started without a policy file: no workspace has
// limits of its own.
func Default() *Policy { return &Policy{} }

// MaxFileBytes bounds a policy file.
const MaxFileBytes = 4 << 20

// Watcher holds the workspace policy of a file, reloaded when the file changes
// (filewatch: a changed policy that does not parse is logged and the one in force kept).
type Watcher = filewatch.Watcher[Policy]

// Watch reads and parses a policy file (an error names the file and the line or key) and
// returns its Watcher; the core (core.Options.PolicyFile) runs it and puts each change in
// force (Enforcer.SetPolicy).
func Watch(file string, log *slog.Logger) (*Watcher, error) {
	return filewatch.Load(file, filewatch.Options[Policy]{Flag: "workspace policy", What: "workspace policy", MaxBytes: MaxFileBytes,
		Parse: func(data []byte) (*Policy, error) {
			if len(data) > MaxFileBytes {
				return nil, fmt.Errorf("the policy is %d bytes, more than the %d allowed", len(data), MaxFileBytes)
			}
			return Parse(data)
		}}, log)
}

// Parse parses and validates a policy file's contents (YAML or JSON).
func Parse(data []byte) (*Policy, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%s (the keys are default and workspaces; each section takes models, max_sequence_length, max_lora_rank, max_concurrent_runs, max_queued_operations, sampling_concurrency, allow_jobs, allow_full_finetune, max_running_jobs, max_job_seconds, max_job_memory_mb, max_deployment_replicas, dedicated, allowed_modalities, checkpoint_keep_newest, checkpoint_keep_best, checkpoint_keep_best_eval, checkpoint_retention_grace_seconds, budget_usd_month, budget_usd_total)", strings.TrimPrefix(strings.TrimPrefix(err.Error(), "error unmarshaling JSON: while decoding JSON: "), "json: "))
	}
	return f.Compile()
}

// Compile validates a File and resolves each workspace's limits.
func (f File) Compile() (*Policy, error) {
	if err := f.Default.validate("default"); err != nil {
		return nil, err
	}
	p := &Policy{def: resolve(Limits{}, f.Default), ws: map[string]Limits{}}
	for _, name := range sortedKeys(f.Workspaces) {
		if err := auth.ValidateWorkspaceName(name); err != nil {
			return nil, fmt.Errorf("workspaces: %q is not a workspace name: use 1 to %d letters, digits, '_' or '-', not starting with '-', as in --api-key KEY=WORKSPACE", name, auth.MaxWorkspaceNameLen)
		}
		s := f.Workspaces[name]
		if err := s.validate("workspaces." + name); err != nil {
			return nil, err
		}
		p.ws[name] = resolve(p.def, s)
	}
	return p, nil
}

// resolve returns base with the fields s sets replaced.
func resolve(base Limits, s Section) Limits {
	out := base
	if s.Models != nil {
		out.Models = slices.Clone(*s.Models)
	}
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&out.MaxSequenceLength, s.MaxSequenceLength)
	set(&out.MaxLoraRank, s.MaxLoraRank)
	set(&out.MaxConcurrentRuns, s.MaxConcurrentRuns)
	set(&out.MaxQueuedOperations, s.MaxQueuedOperations)
	set(&out.SamplingConcurrency, s.SamplingConcurrency)
	if s.AllowJobs != nil {
		out.AllowJobs = *s.AllowJobs
	}
	if s.AllowFullFinetune != nil {
		out.AllowFullFinetune = *s.AllowFullFinetune
	}
	set(&out.MaxRunningJobs, s.MaxRunningJobs)
	set(&out.MaxJobSeconds, s.MaxJobSeconds)
	set(&out.MaxJobMemoryMB, s.MaxJobMemoryMB)
	set(&out.MaxDeploymentReplicas, s.MaxDeploymentReplicas)
	if s.Dedicated != nil {
		out.Dedicated = *s.Dedicated
	}
	if s.AllowedModalities != nil {
		out.AllowedModalities = slices.Clone(*s.AllowedModalities)
	}
	set(&out.CheckpointKeepNewest, s.CheckpointKeepNewest)
	set(&out.CheckpointKeepBest, s.CheckpointKeepBest)
	set(&out.CheckpointRetentionGraceSeconds, s.CheckpointRetentionGraceSeconds)
	if s.CheckpointKeepBestEval != nil {
		out.CheckpointKeepBestEval = *s.CheckpointKeepBestEval
	}
	if s.BudgetUSDMonth != nil {
		out.BudgetMonth, _ = budget(*s.BudgetUSDMonth) // validated
	}
	if s.BudgetUSDTotal != nil {
		out.BudgetTotal, _ = budget(*s.BudgetUSDTotal)
	}
	return out
}

// budget parses a budget in US dollars: at least 0, at most 6 decimal places.
func budget(n json.Number) (money.USD, error) { return ParseBudget(n.String()) }

// ParseBudget parses a budget in US dollars ("250.00"): at least 0, at most 6 decimal
// places; a workspace policy's and an API key's budgets are both read with it.
func ParseBudget(s string) (money.USD, error) {
	v, err := money.ParseUSD(s, 6)
	if err == nil && v < 0 {
		err = errors.New("a budget may not be negative")
	}
	return v, err
}

func (s Section) validate(where string) error {
	if s.Models != nil {
		if len(*s.Models) == 0 {
			return fmt.Errorf("%s.models is empty, which allows no model: list the allowed base models, or leave models out (or use [\"*\"]) for every served model", where)
		}
		for _, m := range *s.Models {
			if strings.TrimSpace(m) == "" {
				return fmt.Errorf("%s.models has an empty entry", where)
			}
			if _, err := path.Match(m, ""); err != nil {
				return fmt.Errorf("%s.models entry %q is not a valid pattern: %v", where, m, err)
			}
		}
	}
	for name, v := range map[string]*json.Number{"budget_usd_month": s.BudgetUSDMonth, "budget_usd_total": s.BudgetUSDTotal} {
		if v != nil {
			if _, err := budget(*v); err != nil {
				return fmt.Errorf("%s.%s: %v (US dollars such as \"250.00\")", where, name, err)
			}
		}
	}
	if s.AllowedModalities != nil {
		for _, m := range *s.AllowedModalities {
			if !slices.Contains(Modalities, m) {
				return fmt.Errorf("%s.allowed_modalities has %q: use %s", where, m, strings.Join(Modalities, " or "))
			}
		}
		if !slices.Contains(*s.AllowedModalities, ModalityText) {
			return fmt.Errorf("%s.allowed_modalities must list text (every request holds text tokens): use [text] to deny images, or [text, image]", where)
		}
	}
	if s.Dedicated != nil {
		switch *s.Dedicated {
		case DedicatedOff, DedicatedAllowed, DedicatedAlways:
		default:
			return fmt.Errorf("%s.dedicated is %q: use off, allowed or always", where, *s.Dedicated)
		}
	}
	for _, f := range []struct {
		name string
		v    *int
	}{
		{"max_sequence_length", s.MaxSequenceLength},
		{"max_lora_rank", s.MaxLoraRank},
		{"max_concurrent_runs", s.MaxConcurrentRuns},
		{"max_queued_operations", s.MaxQueuedOperations},
		{"sampling_concurrency", s.SamplingConcurrency},
		{"max_running_jobs", s.MaxRunningJobs},
		{"max_job_seconds", s.MaxJobSeconds},
		{"max_job_memory_mb", s.MaxJobMemoryMB},
		{"max_deployment_replicas", s.MaxDeploymentReplicas},
		{"checkpoint_keep_newest", s.CheckpointKeepNewest},
		{"checkpoint_keep_best", s.CheckpointKeepBest},
		{"checkpoint_retention_grace_seconds", s.CheckpointRetentionGraceSeconds},
	} {
		if f.v != nil && *f.v < 0 {
			return fmt.Errorf("%s.%s is %d: use a positive limit, or 0 for no limit of the workspace's own", where, f.name, *f.v)
		}
		if f.v != nil && *f.v > 1<<30 {
			return fmt.Errorf("%s.%s is %d, over the largest accepted value %d: use 0 for no limit", where, f.name, *f.v, 1<<30)
		}
	}
	if b := s.CheckpointKeepBest; b != nil && *b > 0 && (s.CheckpointKeepBestEval == nil || *s.CheckpointKeepBestEval == "") {
		return fmt.Errorf("%s.checkpoint_keep_best is %d but checkpoint_keep_best_eval names no eval: name the eval (its name in each workspace) whose score ranks the checkpoints", where, *b)
	}
	if m := s.MaxJobMemoryMB; m != nil && *m > 0 && *m < MinJobMemoryMB {
		return fmt.Errorf("%s.max_job_memory_mb is %d: a job needs at least %d MiB (its Python and the sandbox's relay), so the gateway could not honour it; use %d or more, or 0 for the server's default", where, *m, MinJobMemoryMB, MinJobMemoryMB)
	}
	return nil
}

// For returns a workspace's limits.
func (p *Policy) For(ws string) Limits {
	if p == nil {
		return Limits{}
	}
	if l, ok := p.ws[ws]; ok {
		return l
	}
	return p.def
}

// Workspaces returns the names of the listed workspaces, sorted.
func (p *Policy) Workspaces() []string {
	if p == nil {
		return nil
	}
	return sortedKeys(p.ws)
}

// CheckModels checks that every models entry of the policy matches at least one of the
// served models, so that a typo is an error at start-up rather than a workspace locked out.
func (p *Policy) CheckModels(served []string) error {
	if p == nil {
		return nil
	}
	check := func(where string, l Limits) error {
		for _, pat := range l.Models {
			if !slices.ContainsFunc(served, func(m string) bool { return matches(pat, m) }) {
				return fmt.Errorf("workspace policy: %s.models has %q, which matches no model this server serves (%s): fix the name or serve the model with --model", where, pat, strings.Join(served, ", "))
			}
		}
		return nil
	}
	var errs []error
	errs = append(errs, check("default", p.def))
	for _, name := range p.Workspaces() {
		errs = append(errs, check("workspaces."+name, p.ws[name]))
	}
	return errors.Join(errs...)
}

// allows reports whether limits l allow base model m.
func (l Limits) allows(m string) bool {
	return l.Models == nil || slices.ContainsFunc(l.Models, func(pat string) bool { return matches(pat, m) })
}

// allowed returns the served models that l allows, sorted.
func (l Limits) allowed(served []string) []string {
	out := []string{}
	for _, m := range served {
		if l.allows(m) {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}

// matches reports whether a models entry matches a model name: "*" matches every model,
// other entries are a name or a path.Match pattern ("Qwen/*").
func matches(pattern, model string) bool {
	if pattern == "*" || pattern == model {
		return true
	}
	ok, _ := path.Match(pattern, model)
	return ok
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
