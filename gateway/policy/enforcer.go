package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/lockorder"
	"google.golang.org/protobuf/proto"
)

// Reasons of the errors the Enforcer returns (google.rpc.ErrorInfo on loops.v1, the "reason"
// of a Tinker error body).
const (
	// ReasonModelNotAllowed: the workspace's policy does not allow the base model (403).
	ReasonModelNotAllowed = "MODEL_NOT_ALLOWED"
	// ReasonWorkspaceLimit: a request is over one of the workspace's limits: a sequence
	// length or LoRA rank (400), live runs (429).
	ReasonWorkspaceLimit = "WORKSPACE_LIMIT"
	// ReasonModalityNotAllowed: the workspace's policy does not allow input of the
	// modality (allowed_modalities; 403).
	ReasonModalityNotAllowed = "MODALITY_NOT_ALLOWED"
	// ReasonFullFinetuneNotAllowed: a full fine-tuning run (LoRA rank 0) where the
	// workspace's policy does not set allow_full_finetune and no grant allows it (403).
	ReasonFullFinetuneNotAllowed = "FULL_FINETUNE_NOT_ALLOWED"
)

// Use is a workspace's current use.
type Use struct {
	LiveRuns         int
	QueuedOperations int
	RunningSamples   int
	WaitingSamples   int
}

// wsUse is a workspace's counters; an entry exists only while one of them is non-zero.
type wsUse struct {
	runs, ops, sampling int
	// waiters are samples waiting for one of the workspace's sampling slots, first first.
	waiters []chan struct{}
}

func (u *wsUse) idle() bool {
	return u.runs == 0 && u.ops == 0 && u.sampling == 0 && len(u.waiters) == 0
}

// Enforcer answers a policy's checks and keeps every workspace's current use. Its methods
// are safe for concurrent use; a nil *Enforcer enforces nothing and counts nothing.
type Enforcer struct {
	// p is the policy in force: SetPolicy replaces it whole, never changes it.
	p      atomic.Pointer[Policy]
	served []string

	grants grantState

	mu   lockorder.Mutex[rankEnforcer]
	use  map[string]*wsUse
	runs map[string]string // live run id -> workspace
	ops  map[string]string // unfinished operation id -> workspace
}

// rankEnforcer places Enforcer.mu in the gateway's lock order (gateway/core/lockorder.go):
// after the core's operation locks, before its persister's; nothing is taken under it.
type rankEnforcer struct{}

func (rankEnforcer) Rank() (int, string) { return 700, "policy.Enforcer.mu" }

// NewEnforcer checks p (nil: Default) against the served base models and returns its
// Enforcer.
func NewEnforcer(p *Policy, served []string) (*Enforcer, error) {
	if p == nil {
		p = Default()
	}
	if err := p.CheckModels(served); err != nil {
		return nil, err
	}
	e := &Enforcer{served: slices.Sorted(slices.Values(served)),
		use: map[string]*wsUse{}, runs: map[string]string{}, ops: map[string]string{}}
	e.p.Store(p)
	return e, nil
}

// SetPolicy puts p (nil: Default) in force in place of the policy loaded at the start (an
// operator reloaded the workspace policy, loops serve --workspace-policy): new checks,
// admissions and budgets follow it at once; the runs, operations and samples counted so
// far stay counted. A policy that names a base model the gateway does not serve is refused
// and the one in force kept.
func (e *Enforcer) SetPolicy(p *Policy) error {
	if e == nil {
		return nil
	}
	if p == nil {
		p = Default()
	}
	if err := p.CheckModels(e.served); err != nil {
		return err
	}
	e.p.Store(p)
	return nil
}

// Limits returns the workspace's limits, with the grants in force: the granted models
// allowed and max_concurrent_runs raised (sequence length and rank, which grants raise per
// model, are the policy's; ModelLimits has a model's).
func (e *Enforcer) Limits(ws string) Limits {
	if e == nil {
		return Limits{}
	}
	return e.forWorkspace(ws)
}

// ModelLimits returns the workspace's limits on one base model, with the grants in force
// and extra (a grant being decided: what the policy would be after it).
func (e *Enforcer) ModelLimits(ws, model string, extra ...Grant) Limits {
	if e == nil {
		return Limits{}
	}
	return e.forModel(ws, model, extra...)
}

// AllowModel returns PermissionDenied if the workspace may not use the base model.
func (e *Enforcer) AllowModel(ws, model string) error {
	if e == nil {
		return nil
	}
	l := e.forWorkspace(ws)
	if l.allows(model) {
		return nil
	}
	allowed := l.allowed(e.served)
	list := "none of this server's models"
	if len(allowed) > 0 {
		list = strings.Join(allowed, ", ")
	}
	return errs.Final(errs.New(connect.CodePermissionDenied, ReasonModelNotAllowed, fmt.Errorf(
		"workspace %q may not use base model %q: its policy allows %s (models in its policy); ask a workspace admin for it: %s", ws, model, list, AskCommand(model))))
}

// AllowModality returns PermissionDenied if the workspace may not send input of modality
// m (allowed_modalities): what, such as "an image chunk", names the input in the message.
func (e *Enforcer) AllowModality(ws, m, what string) error {
	if e == nil {
		return nil
	}
	l := e.forWorkspace(ws)
	if l.AllowsModality(m) {
		return nil
	}
	return errs.Final(errs.New(connect.CodePermissionDenied, ReasonModalityNotAllowed, fmt.Errorf(
		"workspace %q may not send %s input (%s): its policy allows %s input only (allowed_modalities in its workspace policy): send %s input only, or ask an operator to add %s to allowed_modalities in the workspace's section of the policy file (loops serve --workspace-policy FILE)",
		ws, m, what, strings.Join(l.AllowedModalities, ", "), strings.Join(l.AllowedModalities, ", "), m)))
}

// Models returns the models the workspace may use, each a copy with max_sequence_length and
// max_lora_rank lowered to the workspace's limits, modalities to those it may send and
// availability to what its dedicated key allows.
func (e *Enforcer) Models(ws string, models []*loopsv1.ModelInfo) []*loopsv1.ModelInfo {
	if e == nil {
		return models
	}
	out := make([]*loopsv1.ModelInfo, 0, len(models))
	for _, m := range models {
		l := e.forModel(ws, m.GetName())
		if !l.allows(m.GetName()) {
			continue
		}
		seq, rank := lower(m.GetMaxSequenceLength(), l.MaxSequenceLength), lower(m.GetMaxLoraRank(), l.MaxLoraRank)
		mods := slices.DeleteFunc(slices.Clone(m.GetModalities()), func(x string) bool { return !l.AllowsModality(x) })
		avail := slices.DeleteFunc(slices.Clone(m.GetAvailability()), func(x string) bool {
			return l.Dedicated == DedicatedOff && x == AvailabilityDedicated || l.Dedicated == DedicatedAlways && x == AvailabilityServerless
		})
		if seq != m.GetMaxSequenceLength() || rank != m.GetMaxLoraRank() ||
			len(mods) != len(m.GetModalities()) || len(avail) != len(m.GetAvailability()) {
			m = proto.CloneOf(m)
			m.MaxSequenceLength, m.MaxLoraRank = seq, rank
			m.Modalities, m.Availability = mods, avail
			// dedicated: always on a backend without dedicated pools: its runs are refused.
			m.Trainable = m.Trainable && len(avail) > 0
		}
		out = append(out, m)
	}
	return out
}

// lower returns the lesser of a model's limit and a workspace's (0: none).
func lower(model int32, ws int) int32 {
	if ws > 0 && (model <= 0 || int32(ws) < model) {
		return int32(ws)
	}
	return model
}

// StartRun admits a new training run of the workspace on a base model with a LoRA rank and
// counts it live until EndRun: PermissionDenied for a model the workspace may not use,
// InvalidArgument for a rank over its limit, PermissionDenied for rank 0 (full fine-tuning)
// where its policy and grants do not allow it, ResourceExhausted when it has
// max_concurrent_runs live or max_queued_operations queued. Starting a live run again is a
// no-op.
func (e *Enforcer) StartRun(ws, runID, model string, rank int32) error {
	if e == nil {
		return nil
	}
	if err := e.AllowModel(ws, model); err != nil {
		return err
	}
	l := e.forModel(ws, model)
	if rank == 0 && !l.AllowFullFinetune {
		return errs.Final(errs.New(connect.CodePermissionDenied, ReasonFullFinetuneNotAllowed, fmt.Errorf(
			"workspace %q may not start full fine-tuning runs (LoRA rank 0) on %s: allow_full_finetune is off in its policy (the default); "+
				"give a LoRA rank of at least 1, or ask a workspace admin for it: %s (an operator may instead set allow_full_finetune: true "+
				"in the workspace's section of the policy file, loops serve --workspace-policy FILE)",
			ws, model, AskCommand(model, "--full-finetune"))))
	}
	if l.MaxLoraRank > 0 && int(rank) > l.MaxLoraRank {
		return errs.Final(errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
			"LoRA rank %d is over workspace %q's limit of %d (max_lora_rank in its policy, on %s): use a rank of at most %d, or ask a workspace admin for more: %s",
			rank, ws, l.MaxLoraRank, model, l.MaxLoraRank, AskCommand(model, flag("max-rank", int(rank))))))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.runs[runID]; ok {
		return nil
	}
	u := e.useLocked(ws)
	if l.MaxConcurrentRuns > 0 && u.runs >= l.MaxConcurrentRuns {
		e.cleanLocked(ws, u)
		return errs.Final(errs.New(connect.CodeResourceExhausted, ReasonWorkspaceLimit, fmt.Errorf(
			"workspace %q has %d training runs live, its limit (max_concurrent_runs in its policy, now %d): unload a run or end its session, then retry; or ask a workspace admin for more: %s",
			ws, u.runs, l.MaxConcurrentRuns, AskCommand(model, flag("runs", l.MaxConcurrentRuns+1)))))
	}
	if err := queueFull(ws, l, u); err != nil {
		e.cleanLocked(ws, u)
		return err
	}
	u.runs++
	e.runs[runID] = ws
	return nil
}

// CheckDeploymentReplicas returns InvalidArgument if a deployment of the workspace asks for
// more sampler replicas than its policy's max_deployment_replicas.
func (e *Enforcer) CheckDeploymentReplicas(ws string, replicas int32) error {
	if e == nil {
		return nil
	}
	if l := e.p.Load().For(ws).MaxDeploymentReplicas; l > 0 && int(replicas) > l {
		return errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
			"replicas %d is over workspace %q's limit of %d (max_deployment_replicas in its policy): ask for at most %d", replicas, ws, l, l))
	}
	return nil
}

// Dedicated decides whether a new run of ws gets a dedicated pool (ask: it asked for one):
// refused with InvalidArgument (WORKSPACE_LIMIT) when the policy says off, always when it
// says always.
func (e *Enforcer) Dedicated(ws string, ask bool) (bool, error) {
	if e == nil {
		return ask, nil
	}
	switch e.p.Load().For(ws).Dedicated {
	case DedicatedOff:
		if ask {
			return false, errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
				"workspace %q may not run dedicated runs (dedicated: off in its policy): leave out user_metadata loops.dedicated, or ask the operator", ws))
		}
		return false, nil
	case DedicatedAlways:
		return true, nil
	}
	return ask, nil
}

// AdoptRun counts a run that is already live (recovered after a restart, or reloaded into
// memory) against its workspace's max_concurrent_runs, without checking the limit: the run
// exists, so the workspace's next StartRun sees it. Adopting a run counted already is a
// no-op.
func (e *Enforcer) AdoptRun(ws, runID string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.runs[runID]; ok {
		return
	}
	e.useLocked(ws).runs++
	e.runs[runID] = ws
}

// EndRun stops counting a run as live. Ending a run that is not live is a no-op.
func (e *Enforcer) EndRun(runID string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ws, ok := e.runs[runID]
	if !ok {
		return
	}
	delete(e.runs, runID)
	u := e.useLocked(ws)
	u.runs--
	e.cleanLocked(ws, u)
}

// StartOp admits a new operation of the workspace and counts it queued until EndOp:
// ResourceExhausted when the workspace has max_queued_operations queued or running. The
// operations that create and unload a training run are always admitted: StartRun has checked
// the queue for the create (refusing it then would strand the run), and an unload frees
// capacity. Starting an operation again is a no-op.
func (e *Enforcer) StartOp(ws, opID string, kind loopsv1.OperationKind) error {
	if e == nil {
		return nil
	}
	l := e.p.Load().For(ws)
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.ops[opID]; ok {
		return nil
	}
	u := e.useLocked(ws)
	if kind != loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN && kind != loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN {
		if err := queueFull(ws, l, u); err != nil {
			e.cleanLocked(ws, u)
			return err
		}
	}
	u.ops++
	e.ops[opID] = ws
	return nil
}

func queueFull(ws string, l Limits, u *wsUse) error {
	if l.MaxQueuedOperations > 0 && u.ops >= l.MaxQueuedOperations {
		return errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, fmt.Errorf(
			"workspace %q has %d operations queued or running, its limit (max_queued_operations in its policy): wait for some to finish, then retry", ws, u.ops))
	}
	return nil
}

// EndOp stops counting a finished operation. Ending an unknown operation is a no-op.
func (e *Enforcer) EndOp(opID string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ws, ok := e.ops[opID]
	if !ok {
		return
	}
	delete(e.ops, opID)
	u := e.useLocked(ws)
	u.ops--
	e.cleanLocked(ws, u)
}

// CheckData checks forward/backward data of the workspace on a base model: PermissionDenied
// if the workspace may not use the model (its policy changed since the run was created),
// or for image chunks when its allowed_modalities leaves out image, InvalidArgument for a
// datum longer than its max_sequence_length.
func (e *Enforcer) CheckData(ws, model string, data []*loopsv1.Datum) error {
	if e == nil {
		return nil
	}
	if err := e.AllowModel(ws, model); err != nil {
		return err
	}
	for i, d := range data {
		if len(d.GetImages()) > 0 {
			if err := e.AllowModality(ws, ModalityImage, fmt.Sprintf("datum %d has image chunks", i)); err != nil {
				return err
			}
		}
	}
	limit := e.forModel(ws, model).MaxSequenceLength
	if limit <= 0 {
		return nil
	}
	for i, d := range data {
		if n := len(d.GetTokens()); n > limit {
			return errs.Final(errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
				"datum %d: sequence of %d tokens is over workspace %q's limit of %d (max_sequence_length in its policy, on %s): truncate it, or ask a workspace admin for more: %s",
				i, n, ws, limit, model, AskCommand(model, flag("max-seq-len", n)))))
		}
	}
	return nil
}

// CheckSample checks a sampling request of the workspace on a base model after the core has
// validated it and filled in params: PermissionDenied if the workspace may not use the
// model, InvalidArgument when the prompt, or the prompt plus max_tokens, is over its
// max_sequence_length (an embedding's input, SampleRequest.embed, may fill it). A
// max_tokens the request left out (defaulted in params) is lowered to fit instead.
func (e *Enforcer) CheckSample(ws, model string, req *loopsv1.SampleRequest, params *loopsv1.SamplingParams) error {
	if e == nil {
		return nil
	}
	if err := e.AllowModel(ws, model); err != nil {
		return err
	}
	limit := e.forModel(ws, model).MaxSequenceLength
	if limit <= 0 {
		return nil
	}
	n := len(req.GetPrompt())
	if req.GetEmbed() { // an embedding generates nothing: the prompt may fill the limit
		if n <= limit {
			return nil
		}
		return errs.Final(errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
			"input of %d tokens is over workspace %q's limit of %d tokens (max_sequence_length in its policy, on %s): shorten it, or ask a workspace admin for more: %s",
			n, ws, limit, model, AskCommand(model, flag("max-seq-len", n)))))
	}
	if n >= limit {
		return errs.Final(errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
			"prompt of %d tokens leaves no room under workspace %q's limit of %d tokens (max_sequence_length in its policy, on %s): shorten it, or ask a workspace admin for more: %s",
			n, ws, limit, model, AskCommand(model, flag("max-seq-len", n+1)))))
	}
	if req.GetParams().GetMaxTokens() == 0 {
		params.MaxTokens = min(params.GetMaxTokens(), int32(limit-n))
		return nil
	}
	if n+int(params.GetMaxTokens()) > limit {
		return errs.Final(errs.New(connect.CodeInvalidArgument, ReasonWorkspaceLimit, fmt.Errorf(
			"prompt (%d tokens) + max_tokens (%d) is over workspace %q's limit of %d tokens (max_sequence_length in its policy, on %s): lower max_tokens, or ask a workspace admin for more: %s",
			n, params.GetMaxTokens(), ws, limit, model, AskCommand(model, flag("max-seq-len", n+int(params.GetMaxTokens()))))))
	}
	return nil
}

// AcquireSample waits for one of the workspace's sampling slots (sampling_concurrency; no
// wait without one) and returns the function that gives it back. Waiters are served first
// come, first served. If ctx ends first it returns at once with a release that does nothing
// (the caller sees ctx ended), so `defer e.AcquireSample(ctx, ws)()` is the whole hook.
func (e *Enforcer) AcquireSample(ctx context.Context, ws string) (release func()) {
	if e == nil {
		return func() {}
	}
	limit := e.p.Load().For(ws).SamplingConcurrency
	e.mu.Lock()
	u := e.useLocked(ws)
	if limit <= 0 || u.sampling < limit {
		u.sampling++
		e.mu.Unlock()
		return e.releaser(ws)
	}
	ch := make(chan struct{})
	u.waiters = append(u.waiters, ch)
	e.mu.Unlock()
	select {
	case <-ch: // a release handed its slot over
		return e.releaser(ws)
	case <-ctx.Done():
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	u = e.useLocked(ws)
	if i := slices.Index(u.waiters, ch); i >= 0 {
		u.waiters = slices.Delete(u.waiters, i, i+1)
		e.cleanLocked(ws, u)
	} else {
		// Handed a slot just as ctx ended: pass it on.
		e.releaseLocked(ws, u)
	}
	return func() {}
}

func (e *Enforcer) releaser(ws string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.releaseLocked(ws, e.useLocked(ws))
		})
	}
}

// releaseLocked gives a sampling slot back: to the first waiter, or to the pool.
func (e *Enforcer) releaseLocked(ws string, u *wsUse) {
	if len(u.waiters) > 0 {
		ch := u.waiters[0]
		u.waiters = slices.Delete(u.waiters, 0, 1)
		close(ch)
		return
	}
	u.sampling--
	e.cleanLocked(ws, u)
}

// Use returns the workspace's current use.
func (e *Enforcer) Use(ws string) Use {
	if e == nil {
		return Use{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	u, ok := e.use[ws]
	if !ok {
		return Use{}
	}
	return Use{LiveRuns: u.runs, QueuedOperations: u.ops, RunningSamples: u.sampling, WaitingSamples: len(u.waiters)}
}

// tracked returns how many workspaces have counters (tests: entries are dropped when idle).
func (e *Enforcer) tracked() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.use)
}

func (e *Enforcer) useLocked(ws string) *wsUse {
	u, ok := e.use[ws]
	if !ok {
		u = &wsUse{}
		e.use[ws] = u
	}
	return u
}

// cleanLocked drops a workspace's entry once every counter is zero, so the map holds only
// workspaces with something live.
func (e *Enforcer) cleanLocked(ws string, u *wsUse) {
	if u.idle() {
		delete(e.use, ws)
	}
}
