package compat

import (
	"context"
	"strings"
	"sync"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Tinker SDK 0.38.0 creates a training client from a checkpoint with one session-addressed
// load_weights request and then, without reading the result, names the new model
// "<session_id>:train:<model_seq_id>" in every later call. Loops run ids contain no ':', so
// any model_id with ":train:" is such an alias. compat remembers the alias of every run it
// creates (create_model and session-addressed load_weights) and resolves it here. An alias
// it does not know (another gateway, a restart) is passed to the core unchanged.

// aliasEntry is what an alias points at: the run, or the operation creating it.
type aliasEntry struct {
	runID string
	opID  string
}

// aliasCache is a bounded FIFO map from alias to run.
type aliasCache struct {
	mu    sync.Mutex
	max   int
	m     map[string]aliasEntry
	order []string
}

func newAliasCache(maxEntries int) *aliasCache {
	return &aliasCache{max: maxEntries, m: make(map[string]aliasEntry)}
}

// modelAlias is the id the SDK assumes for the model_seq_id-th training client of a session.
func modelAlias(sessionID string, modelSeqID int64) string {
	return sessionID + ":train:" + itoa(modelSeqID)
}

func (c *aliasCache) put(alias string, e aliasEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[alias]; !ok {
		c.order = append(c.order, alias)
		for len(c.order) > c.max {
			delete(c.m, c.order[0])
			c.order = c.order[1:]
		}
	}
	c.m[alias] = e
}

func (c *aliasCache) get(alias string) (aliasEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[alias]
	return e, ok
}

// rememberCreate records the alias of a run created by op.
func (s *server) rememberCreate(sessionID string, modelSeqID *int64, op *loopsv1.Operation) {
	if modelSeqID == nil || sessionID == "" || op == nil {
		return
	}
	e := aliasEntry{runID: runIDOf(op), opID: op.GetId()}
	if e.runID == "" && e.opID == "" {
		return
	}
	s.aliases.put(modelAlias(sessionID, *modelSeqID), e)
}

// runIDOf is the training run an operation belongs to or created.
func runIDOf(op *loopsv1.Operation) string {
	if id := op.GetTrainingRunId(); id != "" {
		return id
	}
	return op.GetTrainingRun().GetId()
}

// resolveModel maps a Tinker model_id to a loops training run id.
func (s *server) resolveModel(ctx context.Context, modelID string) (string, error) {
	if modelID == "" {
		return "", badRequest("model_id is required")
	}
	if !strings.Contains(modelID, ":train:") {
		return modelID, nil
	}
	e, ok := s.aliases.get(modelID)
	if !ok {
		return modelID, nil
	}
	if e.runID != "" {
		return e.runID, nil
	}
	op, err := s.svc.Operations.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: e.opID})
	if err != nil {
		return "", err
	}
	if id := runIDOf(op); id != "" {
		s.aliases.put(modelID, aliasEntry{runID: id, opID: e.opID})
		return id, nil
	}
	if op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED {
		return "", badRequest("model %s was not created: %s", modelID, op.GetError().GetMessage())
	}
	return "", &apiError{status: 503, code: "unavailable",
		detail: "model " + modelID + " is still being created; retry when its create request has finished"}
}
