package policy

import (
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Grant is an access grant in force (gateway/access): what it adds to its workspace's
// policy. A grant is about one base model: the workspace may use the model, and its
// sequence-length and LoRA-rank limits on that model rise to the grant's (and full
// fine-tuning on it is allowed when the grant says so); its
// max_concurrent_runs rises to the grant's for the whole workspace. A limit of the policy
// that is 0 (none) stays 0, and a grant never lowers a limit.
type Grant struct {
	Workspace, Model  string
	MaxSequenceLength int
	MaxLoraRank       int
	MaxConcurrentRuns int
	// FullFinetune allows full fine-tuning runs (LoRA rank 0) on the model.
	FullFinetune bool
	// Expires is when the grant stops applying (zero: never).
	Expires time.Time
}

// grantSet is the grants in force by workspace; replaced whole, never changed.
type grantSet map[string][]Grant

// grantState is the Enforcer's grants and clock.
type grantState struct {
	set   atomic.Pointer[grantSet]
	clock atomic.Pointer[func() time.Time]
}

// SetGrants replaces the grants in force (every workspace's).
func (e *Enforcer) SetGrants(gs []Grant) {
	if e == nil {
		return
	}
	set := grantSet{}
	for _, g := range gs {
		set[g.Workspace] = append(set[g.Workspace], g)
	}
	e.grants.set.Store(&set)
}

// SetClock sets the clock that decides whether a grant has expired (tests inject one;
// the default is time.Now).
func (e *Enforcer) SetClock(now func() time.Time) {
	if e != nil {
		e.grants.clock.Store(&now)
	}
}

// active returns the workspace's grants in force now.
func (e *Enforcer) active(ws string) []Grant {
	set := e.grants.set.Load()
	if set == nil || len((*set)[ws]) == 0 {
		return nil
	}
	now := time.Now()
	if c := e.grants.clock.Load(); c != nil {
		now = (*c)()
	}
	var out []Grant
	for _, g := range (*set)[ws] {
		if g.Expires.IsZero() || now.Before(g.Expires) {
			out = append(out, g)
		}
	}
	return out
}

// forWorkspace returns the workspace's limits with its grants in force: the granted models
// allowed and max_concurrent_runs raised (the per-model limits are forModel's).
func (e *Enforcer) forWorkspace(ws string) Limits {
	l := e.p.Load().For(ws)
	for _, g := range e.active(ws) {
		l = l.withModel(g.Model)
		l.MaxConcurrentRuns = raise(l.MaxConcurrentRuns, g.MaxConcurrentRuns)
	}
	return l
}

// forModel returns the workspace's limits on a base model: forWorkspace's, with the
// sequence-length and rank limits raised by the grants on that model.
func (e *Enforcer) forModel(ws, model string, extra ...Grant) Limits {
	l := e.p.Load().For(ws)
	for _, g := range append(e.active(ws), extra...) {
		l.MaxConcurrentRuns = raise(l.MaxConcurrentRuns, g.MaxConcurrentRuns)
		if g.Model != model {
			continue
		}
		l = l.withModel(model)
		l.MaxSequenceLength = raise(l.MaxSequenceLength, g.MaxSequenceLength)
		l.MaxLoraRank = raise(l.MaxLoraRank, g.MaxLoraRank)
		l.AllowFullFinetune = l.AllowFullFinetune || g.FullFinetune
	}
	return l
}

// withModel returns l allowing model too.
func (l Limits) withModel(model string) Limits {
	if !l.allows(model) {
		l.Models = append(slices.Clone(l.Models), model)
	}
	return l
}

// raise returns a policy limit raised to a granted one: 0 (no limit) stays 0.
func raise(limit, granted int) int {
	if limit > 0 && granted > limit {
		return granted
	}
	return limit
}

// AskCommand is the exact command a member runs to ask a workspace admin for more on a
// base model; flags are "--max-seq-len 4096" and the like. Limit errors end with it.
func AskCommand(model string, flags ...string) string {
	parts := append([]string{"loops access request --model", model}, flags...)
	return strings.Join(parts, " ") + ` --reason "..."`
}

// flag is one AskCommand flag.
func flag(name string, v int) string { return "--" + name + " " + strconv.Itoa(v) }

// Allows reports whether limits l allow base model m.
func (l Limits) Allows(m string) bool { return l.allows(m) }
