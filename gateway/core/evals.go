package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/backends/reference/tokenizer"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/evals"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/hfcache"
	"github.com/loops-dev/loops/internal/lockorder"
)

// Evals attached to runs (docs/evals.md). An eval runs on a sampler save of a run it is
// attached to, as sampling work of the run's workspace: each row is one SamplingService
// sample on the saved checkpoint (prompt log-probs, or a greedy generation), queued in the
// core's fair sampling queue under the workspace like any of its samples, so evals never
// take more than the workspace's fair share of the samplers, and training (the run's own
// ordered queue) never waits for them. A workspace runs at most
// MaxConcurrentEvalRunsPerWorkspace evals at once, each EvalRowParallel rows at a time, and
// queues at most MaxQueuedEvalRunsPerWorkspace more; past that a save's eval is recorded as
// failed, saying so. The save itself only hands the event to one dispatcher goroutine
// through a bounded channel: no store I/O is added to the run's path.

// Bounds of evals.
const (
	// MaxEvalsPerWorkspace bounds a workspace's evals.
	MaxEvalsPerWorkspace = 100
	// MaxEvalsPerRun bounds the evals attached to one run.
	MaxEvalsPerRun = 8
	// MaxConcurrentEvalRunsPerWorkspace bounds the evals a workspace runs at once.
	MaxConcurrentEvalRunsPerWorkspace = 2
	// MaxQueuedEvalRunsPerWorkspace bounds the evals a workspace has waiting to run.
	MaxQueuedEvalRunsPerWorkspace = 32
	// EvalRowParallel is how many rows of one eval run are in the sampling queue at once.
	EvalRowParallel = 4
	// maxEverySteps bounds EvalAttachment.every_n_steps.
	maxEverySteps = 1_000_000
	// maxEvalDescriptionBytes bounds an eval's description.
	maxEvalDescriptionBytes = 1024
	// evalSaveBacklog bounds the sampler saves waiting for the dispatcher.
	evalSaveBacklog = 1024
	// evalBusyRetries and evalBusyWait: a row refused because the workspace's sampling
	// queue is full is retried this many times this far apart before the eval fails.
	evalBusyRetries = 120
	evalBusyWait    = time.Second
)

// MetaEvals is the training run user_metadata key that attaches evals from a tinker
// script: a comma-separated list of eval ids or names (create_lora_training_client(...,
// user_metadata={"loops.evals": "my-eval,other"})). MetaEvalsEveryNSteps sets their
// EvalAttachment.every_n_steps (default 0: every sampler save).
const (
	MetaEvals            = "loops.evals"
	MetaEvalsEveryNSteps = "loops.evals_every_n_steps"
)

// rankEvals: evalRunner.mu (the workspaces' eval queues). Nothing is taken under it.
type rankEvals struct{}

func (rankEvals) Rank() (int, string) { return 960, "core.evalRunner.mu" }

// evalSave is a sampler save to score with the run's attached evals.
type evalSave struct {
	ws, runID string
	ck        *loopsv1.Checkpoint
	step      int64
}

// evalJob is one eval to run on one checkpoint.
type evalJob struct {
	ws     string
	eval   *loopsv1.Eval
	result *loopsv1.EvalResult // RUNNING, as stored
	path   string              // the checkpoint's tinker:// path
}

// evalRunner runs the evals of sampler saves: a dispatcher reads saves from a bounded
// channel, and each workspace runs at most MaxConcurrentEvalRunsPerWorkspace jobs.
type evalRunner struct {
	c     *Core
	saves chan evalSave
	start time.Time // results RUNNING from before it were cut off by a restart

	mu      lockorder.Mutex[rankEvals]
	running map[string]int          // per workspace
	queued  map[string][]*evalJob   // per workspace
	live    map[string]bool         // result keys being computed
	toks    map[string]*evalTokText // per base model
	rewards RewardRunner            // nil: reward evals fail
}

func newEvalRunner(c *Core) *evalRunner {
	return &evalRunner{
		c: c, saves: make(chan evalSave, evalSaveBacklog), start: c.now(),
		running: map[string]int{}, queued: map[string][]*evalJob{}, live: map[string]bool{}, toks: map[string]*evalTokText{},
	}
}

func resultKey(r *loopsv1.EvalResult) string {
	return r.GetTrainingRunId() + "\x00" + r.GetCheckpointId() + "\x00" + r.GetEvalId()
}

// noteSamplerSave hands a sampler save to the dispatcher; it never blocks (a full backlog
// drops the save's evals, logged).
func (er *evalRunner) noteSamplerSave(ws, runID string, ck *loopsv1.Checkpoint, step int64) {
	select {
	case er.saves <- evalSave{ws: ws, runID: runID, ck: ck, step: step}:
	default:
		er.c.log.Warn("eval backlog full: the evals of a sampler save are skipped", slog.String("run", runID), slog.String("checkpoint", ck.GetId()))
	}
}

// dispatch reads sampler saves until ctx ends.
func (er *evalRunner) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-er.saves:
			er.schedule(ctx, s)
		}
	}
}

// schedule finds the evals attached to the save's run and queues those due.
func (er *evalRunner) schedule(ctx context.Context, s evalSave) {
	c := er.c
	atts, err := c.store.ListEvalAttachments(ctx, s.ws, s.runID)
	if err != nil {
		c.log.Error("listing a run's eval attachments", slog.String("run", s.runID), slog.Any("err", err))
		return
	}
	for _, a := range atts {
		e, err := c.store.GetEval(ctx, s.ws, a.GetEvalId())
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				c.log.Error("reading an attached eval", slog.String("eval", a.GetEvalId()), slog.Any("err", err))
			}
			continue
		}
		if n := a.GetEveryNSteps(); n > 0 {
			last, err := c.store.ListEvalResults(ctx, s.ws, s.runID, "", e.GetId(), 1)
			if err != nil {
				c.log.Error("reading an eval's last result", slog.String("eval", e.GetId()), slog.Any("err", err))
				continue
			}
			if len(last) > 0 && s.step-last[0].GetStep() < n {
				continue
			}
		}
		res := &loopsv1.EvalResult{
			EvalId: e.GetId(), EvalName: e.GetName(), TrainingRunId: s.runID, CheckpointId: s.ck.GetId(),
			TinkerPath: s.ck.GetTinkerPath(), Step: s.step, State: loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING,
			CreateTime: timestamppb.New(c.now()), DatasetSha256: e.GetSha256(), Kind: e.GetKind(), HigherIsBetter: e.GetHigherIsBetter(),
		}
		er.admit(ctx, &evalJob{ws: s.ws, eval: e, result: res, path: s.ck.GetTinkerPath()})
	}
}

// admit records the job's result as running and starts it, queues it, or records it
// failed when the workspace's queue is full.
func (er *evalRunner) admit(ctx context.Context, j *evalJob) {
	er.mu.Lock()
	start, full := false, false
	switch {
	case er.running[j.ws] < MaxConcurrentEvalRunsPerWorkspace:
		er.running[j.ws]++
		start = true
	case len(er.queued[j.ws]) < MaxQueuedEvalRunsPerWorkspace:
		er.queued[j.ws] = append(er.queued[j.ws], j)
	default:
		full = true
	}
	if !full {
		er.live[resultKey(j.result)] = true
	}
	er.mu.Unlock()
	if full {
		er.finish(ctx, j, evals.Result{}, fmt.Errorf("skipped: the workspace already has %d eval runs waiting (at most %d run at once): save for the sampler less often, or attach with every_n_steps",
			MaxQueuedEvalRunsPerWorkspace, MaxConcurrentEvalRunsPerWorkspace))
		return
	}
	er.put(ctx, j.ws, j.result)
	if start {
		er.launch(j)
	}
}

// launch runs j on a goroutine of the core's lifecycle owner, then the workspace's next
// queued job.
func (er *evalRunner) launch(j *evalJob) {
	err := er.c.life.Go("eval", func(ctx context.Context) {
		for j != nil {
			r, err := er.run(ctx, j)
			er.finish(ctx, j, r, err)
			er.mu.Lock()
			delete(er.live, resultKey(j.result))
			if q := er.queued[j.ws]; len(q) > 0 {
				j, er.queued[j.ws] = q[0], q[1:]
				if len(er.queued[j.ws]) == 0 {
					delete(er.queued, j.ws)
				}
			} else {
				if er.running[j.ws]--; er.running[j.ws] == 0 {
					delete(er.running, j.ws)
				}
				j = nil
			}
			er.mu.Unlock()
		}
	})
	if err != nil { // shutting down: the result stays RUNNING and reads as interrupted
		er.mu.Lock()
		delete(er.live, resultKey(j.result))
		if er.running[j.ws]--; er.running[j.ws] == 0 {
			delete(er.running, j.ws)
		}
		er.mu.Unlock()
	}
}

// put stores a result, logging a failure (the eval's outcome is lost, not the run's).
func (er *evalRunner) put(ctx context.Context, ws string, r *loopsv1.EvalResult) {
	if err := er.c.store.PutEvalResult(context.WithoutCancel(ctx), ws, r); err != nil {
		er.c.log.Error("storing an eval result", slog.String("eval", r.GetEvalId()), slog.String("checkpoint", r.GetTinkerPath()), slog.Any("err", err))
	}
}

// finish stores j's outcome.
func (er *evalRunner) finish(ctx context.Context, j *evalJob, r evals.Result, err error) {
	res := proto.CloneOf(j.result)
	res.DoneTime = timestamppb.New(er.c.now())
	if err != nil {
		res.State, res.Error = loopsv1.EvalResultState_EVAL_RESULT_STATE_FAILED, clipError(err.Error())
	} else {
		res.State, res.Score, res.N, res.Metrics = loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED, r.Score, r.N, r.Metrics
	}
	er.put(ctx, j.ws, res)
}

// clipError bounds a stored error message.
func clipError(s string) string {
	if len(s) > 1024 {
		return s[:1024] + "…"
	}
	return s
}

// run scores j's checkpoint on j's eval.
func (er *evalRunner) run(ctx context.Context, j *evalJob) (evals.Result, error) {
	c := er.c
	data, err := c.store.GetEvalDataset(ctx, j.ws, j.eval.GetId())
	if err != nil {
		return evals.Result{}, fmt.Errorf("reading the eval's dataset: %w", err)
	}
	rows, err := evals.Decode(evals.Spec{Kind: j.eval.GetKind(), Match: j.eval.GetMatch()}, data)
	if err != nil {
		return evals.Result{}, err
	}
	ck, _, err := c.resolveOwned(ctx, j.ws, j.path)
	if err != nil {
		return evals.Result{}, err
	}
	model, err := c.model(ck.GetBaseModel())
	if err != nil {
		return evals.Result{}, err
	}
	tok, err := er.tokenizer(model)
	if err != nil {
		c.log.Debug("no tokenizer for an eval's base model", slog.String("model", model.GetName()), slog.Any("err", err))
		tok = nil // rows given as token ids still score
	}
	var t evals.Tokenizer
	if tok != nil {
		t = tok
	}
	m := &evalModel{s: SamplingService{c}, ops: OperationService{c}, ws: j.ws, path: j.path, stop: j.eval.GetStop()}
	opts := evals.Options{Parallel: EvalRowParallel, MaxSeqLen: int(model.GetMaxSequenceLength())}
	if j.eval.GetKind() == loopsv1.EvalKind_EVAL_KIND_REWARD {
		er.mu.Lock()
		rr := er.rewards
		er.mu.Unlock()
		if rr == nil {
			return evals.Result{}, errors.New("this gateway runs no reward functions (it has no jobs sandbox)")
		}
		opts.Reward = func(ctx context.Context, in []evals.RewardInput) ([]float64, error) {
			return rr.Reward(ctx, j.ws, j.eval.GetRewardScript(), in)
		}
	}
	return evals.Score(ctx, j.eval, rows, t, m, opts)
}

// RewardRunner runs a reward eval's Python function on its rows, as work of the workspace
// (the gateway runs it as a job in the jobs sandbox, under the workspace's job quotas).
type RewardRunner interface {
	// Reward returns one reward per input, or why none could be computed.
	Reward(ctx context.Context, workspace, script string, inputs []evals.RewardInput) ([]float64, error)
}

// SetRewardRunner sets what runs reward evals' functions (none: they fail, saying so).
func (c *Core) SetRewardRunner(r RewardRunner) {
	c.evals.mu.Lock()
	c.evals.rewards = r
	c.evals.mu.Unlock()
}

// evalTokText is a base model's tokenizer as evals.Tokenizer.
type evalTokText struct{ tok *tokenizer.Tokenizer }

// Encode tokenizes text.
func (t *evalTokText) Encode(text string) []int32 {
	ids := t.tok.Encode(text)
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// Decode detokenizes tokens.
func (t *evalTokText) Decode(tokens []int32) string {
	ids := make([]int, len(tokens))
	for i, id := range tokens {
		ids[i] = int(id)
	}
	return t.tok.Decode(ids)
}

// tokenizer returns the tokenizer of a base model (its tokenizer_id: a folder or a model in
// the local Hugging Face cache), loaded once.
func (er *evalRunner) tokenizer(m *loopsv1.ModelInfo) (*evalTokText, error) {
	er.mu.Lock()
	t, ok := er.toks[m.GetName()]
	er.mu.Unlock()
	if ok {
		return t, nil
	}
	id := m.GetTokenizerId()
	if id == "" {
		id = m.GetName()
	}
	dir, err := hfcache.TokenizerDir(id)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.LoadHF(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	t = &evalTokText{tok: tok}
	er.mu.Lock()
	er.toks[m.GetName()] = t // bounded by the models the core serves
	er.mu.Unlock()
	return t, nil
}

// evalModel is a checkpoint as evals.Score sees it: each call one sample of the
// workspace's shared sampler of the checkpoint, through the fair queue.
type evalModel struct {
	s    SamplingService
	ops  OperationService
	ws   string
	path string
	stop []string
}

// Logprobs asks for the prompt log-probs of the last n tokens.
func (m *evalModel) Logprobs(ctx context.Context, tokens []int32, n int) ([]float64, error) {
	res, err := m.sample(ctx, &loopsv1.SampleRequest{
		ModelPath: m.path, Prompt: tokens, NumSamples: 1, Params: &loopsv1.SamplingParams{MaxTokens: 1},
		PromptLogprobs: true, PromptLogprobsLastN: int32(n),
	})
	if err != nil {
		return nil, err
	}
	lps := res.GetPromptLogprobs()
	if len(lps) != len(tokens) {
		return nil, fmt.Errorf("the sampler returned %d prompt log-probs for %d tokens", len(lps), len(tokens))
	}
	out := make([]float64, n)
	for i, lp := range lps[len(lps)-n:] {
		out[i] = float64(lp)
	}
	return out, nil
}

// Generate samples greedily.
func (m *evalModel) Generate(ctx context.Context, prompt []int32, maxTokens int) ([]int32, error) {
	res, err := m.sample(ctx, &loopsv1.SampleRequest{
		ModelPath: m.path, Prompt: prompt, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: int32(maxTokens), Temperature: 0, StopStrings: m.stop},
	})
	if err != nil {
		return nil, err
	}
	if len(res.GetSequences()) != 1 {
		return nil, fmt.Errorf("the sampler returned %d sequences, not 1", len(res.GetSequences()))
	}
	return res.GetSequences()[0].GetTokens(), nil
}

// sample runs one sample and waits for it, retrying while the workspace's sampling queue
// is full.
func (m *evalModel) sample(ctx context.Context, req *loopsv1.SampleRequest) (*loopsv1.SampleResult, error) {
	wctx := auth.WithWorkspace(ctx, m.ws)
	var op *loopsv1.Operation
	for try := 0; ; try++ {
		var err error
		op, err = m.s.Sample(wctx, req)
		if err == nil {
			break
		}
		if connect.CodeOf(err) != connect.CodeResourceExhausted || try >= evalBusyRetries {
			return nil, err
		}
		t := time.NewTimer(evalBusyWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	for {
		switch op.GetState() {
		case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED:
			return op.GetSample(), nil
		case loopsv1.OperationState_OPERATION_STATE_FAILED, loopsv1.OperationState_OPERATION_STATE_CANCELLED:
			return nil, fmt.Errorf("sampling the checkpoint failed: %s", op.GetError().GetMessage())
		}
		var err error
		op, err = m.ops.WaitOperation(wctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(maxWait)})
		if err != nil {
			return nil, err
		}
	}
}

// EvalService implements loops.v1 EvalService.
type EvalService struct{ c *Core }

// validEvalName checks an eval name (the rules of a project name).
func validEvalName(name string) error {
	if err := validProjectName(name); err != nil {
		return invalidArgument("eval name %q is not valid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(name), maxProjectNameLen)
	}
	return nil
}

// checkEvalSpec checks the options of a CreateEvalRequest and returns the eval they make
// (without id, dataset facts or time).
func checkEvalSpec(req *loopsv1.CreateEvalRequest) (*loopsv1.Eval, error) {
	if err := validEvalName(req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetDescription()) > maxEvalDescriptionBytes {
		return nil, invalidArgument("description is %d bytes, more than %d", len(req.GetDescription()), maxEvalDescriptionBytes)
	}
	e := &loopsv1.Eval{Name: req.GetName(), Kind: req.GetKind(), Description: req.GetDescription(), HigherIsBetter: evals.HigherIsBetter(req.GetKind())}
	reward := req.GetKind() == loopsv1.EvalKind_EVAL_KIND_REWARD
	gen := req.GetKind() == loopsv1.EvalKind_EVAL_KIND_GENERATION || reward
	switch req.GetKind() {
	case loopsv1.EvalKind_EVAL_KIND_NLL, loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE, loopsv1.EvalKind_EVAL_KIND_GENERATION, loopsv1.EvalKind_EVAL_KIND_REWARD:
	default:
		return nil, invalidArgument("kind must be nll, multiple_choice, generation or reward (EVAL_KIND_NLL, EVAL_KIND_MULTIPLE_CHOICE, EVAL_KIND_GENERATION, EVAL_KIND_REWARD), got %v", req.GetKind())
	}
	switch {
	case reward && (len(req.GetRewardScript()) == 0 || len(req.GetRewardScript()) > evals.MaxRewardScriptBytes):
		return nil, invalidArgument("a reward eval needs reward_script: Python source of 1 to %d bytes defining reward(prompt, completion, info) -> float", evals.MaxRewardScriptBytes)
	case !reward && req.GetRewardScript() != "":
		return nil, invalidArgument("reward_script applies to reward evals only")
	case reward && !utf8.ValidString(req.GetRewardScript()):
		return nil, invalidArgument("reward_script is not valid UTF-8")
	}
	e.RewardScript = req.GetRewardScript()
	if !gen {
		if req.GetMatch() != loopsv1.EvalMatch_EVAL_MATCH_UNSPECIFIED || req.GetMaxTokens() != 0 || len(req.GetStop()) > 0 {
			return nil, invalidArgument("match, max_tokens and stop apply to generation and reward evals only")
		}
		return e, nil
	}
	switch {
	case reward && req.GetMatch() != loopsv1.EvalMatch_EVAL_MATCH_UNSPECIFIED:
		return nil, invalidArgument("match applies to generation evals only: a reward eval's function scores the text")
	case reward:
	case req.GetMatch() == loopsv1.EvalMatch_EVAL_MATCH_UNSPECIFIED:
		e.Match = loopsv1.EvalMatch_EVAL_MATCH_EXACT
	case req.GetMatch() == loopsv1.EvalMatch_EVAL_MATCH_EXACT, req.GetMatch() == loopsv1.EvalMatch_EVAL_MATCH_CONTAINS, req.GetMatch() == loopsv1.EvalMatch_EVAL_MATCH_REGEX:
		e.Match = req.GetMatch()
	default:
		return nil, invalidArgument("match must be exact, contains or regex, got %v", req.GetMatch())
	}
	if req.GetMaxTokens() < 0 || req.GetMaxTokens() > evals.MaxGenerateTokens {
		return nil, invalidArgument("max_tokens must be 1 to %d (0 means %d), got %d", evals.MaxGenerateTokens, evals.DefaultGenerateTokens, req.GetMaxTokens())
	}
	e.MaxTokens = int32(evals.GenerateTokens(&loopsv1.Eval{MaxTokens: req.GetMaxTokens()}))
	if len(req.GetStop()) > evals.MaxStops {
		return nil, invalidArgument("at most %d stop strings, got %d", evals.MaxStops, len(req.GetStop()))
	}
	for _, s := range req.GetStop() {
		if len(s) == 0 || len(s) > evals.MaxStopBytes {
			return nil, invalidArgument("a stop string must be 1 to %d bytes, got %d", evals.MaxStopBytes, len(s))
		}
	}
	e.Stop = req.GetStop()
	return e, nil
}

// CreateEval uploads a dataset and makes an eval of it.
func (s EvalService) CreateEval(ctx context.Context, req *loopsv1.CreateEvalRequest) (*loopsv1.Eval, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	e, err := checkEvalSpec(req)
	if err != nil {
		return nil, err
	}
	rows, err := evals.Decode(evals.Spec{Kind: e.GetKind(), Match: e.GetMatch()}, req.GetDataset())
	if err != nil {
		return nil, invalidArgument("%v", err)
	}
	sum := sha256.Sum256(req.GetDataset())
	e.Id, e.Rows, e.SizeBytes, e.Sha256, e.CreateTime = newID("eval"), int64(len(rows)), int64(len(req.GetDataset())), hex.EncodeToString(sum[:]), timestamppb.New(c.now())
	unlock := projectLocks.lock("evals\x00" + ws)
	defer unlock()
	list, err := c.store.ListEvals(ctx, ws)
	if err != nil {
		return nil, internal("listing evals", err)
	}
	if len(list) >= MaxEvalsPerWorkspace {
		return nil, c.limitReached(errs.ReasonLimitReached, "max_evals_per_workspace",
			"this workspace has %d evals, the limit: delete evals you no longer use (loops evals delete)", MaxEvalsPerWorkspace)
	}
	if err := c.store.CreateEval(ctx, ws, e, req.GetDataset()); errors.Is(err, store.ErrExists) {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("eval %s already exists in this workspace: pick another name, or delete it first", e.GetName()))
	} else if err != nil {
		return nil, internal("creating an eval", err)
	}
	return e, nil
}

// evalOf returns an eval of the workspace by id or name.
func (c *Core) evalOf(ctx context.Context, ws, idOrName string) (*loopsv1.Eval, error) {
	if idOrName == "" {
		return nil, invalidArgument("name an eval (its id or name)")
	}
	e, err := c.store.GetEval(ctx, ws, idOrName)
	if errors.Is(err, store.ErrNotFound) {
		e, err = c.store.GetEvalByName(ctx, ws, idOrName)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound("eval %q not found in your workspace (loops evals list shows them)", clip(idOrName))
	}
	if err != nil {
		return nil, internal("reading an eval", err)
	}
	return e, nil
}

// GetEval returns an eval by id or name.
func (s EvalService) GetEval(ctx context.Context, req *loopsv1.GetEvalRequest) (*loopsv1.Eval, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	return s.c.evalOf(ctx, ws, req.GetId())
}

// ListEvals lists the workspace's evals by name.
func (s EvalService) ListEvals(ctx context.Context, _ *loopsv1.ListEvalsRequest) (*loopsv1.ListEvalsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	list, err := s.c.store.ListEvals(ctx, ws)
	if err != nil {
		return nil, internal("listing evals", err)
	}
	for _, e := range list {
		e.RewardScript = "" // GetEval returns it
	}
	return &loopsv1.ListEvalsResponse{Evals: list}, nil
}

// DeleteEval removes an eval and its attachments.
func (s EvalService) DeleteEval(ctx context.Context, req *loopsv1.DeleteEvalRequest) (*loopsv1.DeleteEvalResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	e, err := s.c.evalOf(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	if err := s.c.store.DeleteEval(ctx, ws, e.GetId()); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, internal("deleting an eval", err)
	}
	return &loopsv1.DeleteEvalResponse{}, nil
}

// AttachEval attaches an eval to a run of the workspace.
func (s EvalService) AttachEval(ctx context.Context, req *loopsv1.AttachEvalRequest) (*loopsv1.EvalAttachment, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetEveryNSteps() < 0 || req.GetEveryNSteps() > maxEverySteps {
		return nil, invalidArgument("every_n_steps must be 0 to %d, got %d", maxEverySteps, req.GetEveryNSteps())
	}
	r, err := c.runOf(ws, req.GetTrainingRunId())
	if err != nil {
		return nil, err
	}
	e, err := c.evalOf(ctx, ws, req.GetEvalId())
	if err != nil {
		return nil, err
	}
	out, err := c.attachEvals(ctx, ws, r.ID(), []*loopsv1.Eval{e}, req.GetEveryNSteps())
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// attachEvals attaches evals to a run, refusing past MaxEvalsPerRun.
func (c *Core) attachEvals(ctx context.Context, ws, runID string, es []*loopsv1.Eval, every int64) ([]*loopsv1.EvalAttachment, error) {
	unlock := projectLocks.lock("evalrun\x00" + runID)
	defer unlock()
	have, err := c.store.ListEvalAttachments(ctx, ws, runID)
	if err != nil {
		return nil, internal("listing a run's evals", err)
	}
	attached := map[string]bool{}
	for _, a := range have {
		attached[a.GetEvalId()] = true
	}
	for _, e := range es {
		attached[e.GetId()] = true
	}
	if len(attached) > MaxEvalsPerRun {
		return nil, c.limitReached(errs.ReasonLimitReached, "max_evals_per_run",
			"a run has at most %d evals attached; this would make %d", MaxEvalsPerRun, len(attached))
	}
	out := make([]*loopsv1.EvalAttachment, 0, len(es))
	for _, e := range es {
		a := &loopsv1.EvalAttachment{TrainingRunId: runID, EvalId: e.GetId(), EveryNSteps: every, CreateTime: timestamppb.New(c.now()), EvalName: e.GetName()}
		if err := c.store.PutEvalAttachment(ctx, ws, a); err != nil {
			return nil, internal("attaching an eval", err)
		}
		out = append(out, a)
	}
	return out, nil
}

// evalsFromMetadata resolves the evals a run's user_metadata attaches (MetaEvals) and
// their every_n_steps; none is nil.
func (c *Core) evalsFromMetadata(ctx context.Context, ws string, meta map[string]string) ([]*loopsv1.Eval, int64, error) {
	v, ok := meta[MetaEvals]
	if !ok {
		return nil, 0, nil
	}
	var every int64
	if s, ok := meta[MetaEvalsEveryNSteps]; ok {
		if _, err := fmt.Sscan(s, &every); err != nil || every < 0 || every > maxEverySteps {
			return nil, 0, invalidArgument("user_metadata %s=%q must be an integer from 0 to %d", MetaEvalsEveryNSteps, clip(s), maxEverySteps)
		}
	}
	var out []*loopsv1.Eval
	seen := map[string]bool{}
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if len(out) == MaxEvalsPerRun {
			return nil, 0, invalidArgument("user_metadata %s names more than %d evals", MetaEvals, MaxEvalsPerRun)
		}
		e, err := c.evalOf(ctx, ws, name)
		if err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound {
				return nil, 0, invalidArgument("user_metadata %s: eval %q not found in your workspace (create it first: loops evals create)", MetaEvals, clip(name))
			}
			return nil, 0, err
		}
		if !seen[e.GetId()] {
			seen[e.GetId()] = true
			out = append(out, e)
		}
	}
	return out, every, nil
}

// ListEvalResults lists results of a run and/or an eval.
func (s EvalService) ListEvalResults(ctx context.Context, req *loopsv1.ListEvalResultsRequest) (*loopsv1.ListEvalResultsResponse, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetTrainingRunId() == "" && req.GetEvalId() == "" {
		return nil, invalidArgument("give a training_run_id, an eval_id, or both")
	}
	runID, evalID := "", ""
	if req.GetTrainingRunId() != "" {
		r, err := c.runOf(ws, req.GetTrainingRunId())
		if err != nil {
			return nil, err
		}
		runID = r.ID()
	}
	if req.GetEvalId() != "" {
		e, err := c.evalOf(ctx, ws, req.GetEvalId())
		if err != nil {
			return nil, err
		}
		evalID = e.GetId()
	}
	list, err := c.evalResults(ctx, ws, runID, "", evalID)
	if err != nil {
		return nil, err
	}
	return &loopsv1.ListEvalResultsResponse{Results: list}, nil
}

// evalResults lists results, those left running by an earlier process shown failed.
func (c *Core) evalResults(ctx context.Context, ws, runID, checkpointID, evalID string) ([]*loopsv1.EvalResult, error) {
	list, err := c.store.ListEvalResults(ctx, ws, runID, checkpointID, evalID, store.MaxEvalResultsListed)
	if err != nil {
		return nil, internal("listing eval results", err)
	}
	er := c.evals
	er.mu.Lock()
	defer er.mu.Unlock()
	for _, r := range list {
		if r.GetState() == loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING && !er.live[resultKey(r)] && r.GetCreateTime().AsTime().Before(er.start) {
			r.State, r.Error = loopsv1.EvalResultState_EVAL_RESULT_STATE_FAILED, "interrupted: the gateway restarted while it ran"
		}
	}
	return list, nil
}

// maxEvalRequirements bounds a deployment's eval requirements.
const maxEvalRequirements = 8

// evalLineage fills each of d's checkpoints' eval results (its lineage: the results of the
// evals that scored it, each with its dataset's sha256) and checks reqs, the deploy gate:
// every checkpoint needs a succeeded result of each required eval that passes its
// threshold, or the deployment is refused with FailedPrecondition naming the checkpoint,
// the score and the threshold. The training data's hashes join from the run's receipt
// (dataLineage).
func (c *Core) evalLineage(ctx context.Context, ws string, d *loopsv1.Deployment, pins []store.CheckpointRef, reqs []*loopsv1.EvalRequirement) error {
	if len(reqs) > maxEvalRequirements {
		return invalidArgument("at most %d eval requirements, got %d", maxEvalRequirements, len(reqs))
	}
	type gate struct {
		e  *loopsv1.Eval
		ge bool
		th float64
	}
	gates := make([]gate, 0, len(reqs))
	for _, r := range reqs {
		g := gate{ge: true, th: r.GetThreshold()}
		switch r.GetOp() {
		case "", ">=":
		case "<=":
			g.ge = false
		default:
			return invalidArgument("eval requirement op must be >= or <=, got %q", clip(r.GetOp()))
		}
		if math.IsNaN(g.th) || math.IsInf(g.th, 0) {
			return invalidArgument("eval requirement threshold must be a finite number")
		}
		e, err := c.evalOf(ctx, ws, r.GetEval())
		if err != nil {
			return err
		}
		g.e = e
		gates = append(gates, g)
	}
	for i, p := range pins {
		dc := d.Checkpoints[i]
		results, err := c.evalResults(ctx, ws, p.RunID, p.CheckpointID, "")
		if err != nil {
			return err
		}
		dc.Evals = results
		if err := c.dataLineage(ctx, ws, dc); err != nil {
			return err
		}
		for _, g := range gates {
			op := ">="
			if !g.ge {
				op = "<="
			}
			var got *loopsv1.EvalResult
			for _, r := range results {
				if r.GetEvalId() == g.e.GetId() {
					got = r
				}
			}
			switch {
			case got == nil:
				return failedPrecondition("deploy gate: checkpoint %s has no result of eval %s (required %s %g): attach the eval to run %s (loops evals attach) and save the checkpoint again, or deploy without --require-eval",
					dc.GetTinkerPath(), g.e.GetName(), op, g.th, p.RunID)
			case got.GetState() == loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING:
				return failedPrecondition("deploy gate: eval %s on checkpoint %s is still running (required %s %g): retry when it is done (loops evals show %s)",
					g.e.GetName(), dc.GetTinkerPath(), op, g.th, g.e.GetName())
			case got.GetState() != loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED:
				return failedPrecondition("deploy gate: eval %s failed on checkpoint %s (%s), so it has no score (required %s %g)",
					g.e.GetName(), dc.GetTinkerPath(), got.GetError(), op, g.th)
			case g.ge && got.GetScore() < g.th, !g.ge && got.GetScore() > g.th:
				return failedPrecondition("deploy gate: checkpoint %s scores %g on eval %s, below the threshold %s %g",
					dc.GetTinkerPath(), got.GetScore(), g.e.GetName(), op, g.th)
			}
		}
	}
	return nil
}

// dataLineage fills dc's base model revision and training data hash from its run's
// receipt: the ordered batch hashes of the run's forward_backward steps before the save
// that made the checkpoint (docs/receipts.md). Left empty when the receipt does not hold
// that save (truncated, or a run older than receipts).
func (c *Core) dataLineage(ctx context.Context, ws string, dc *loopsv1.DeploymentCheckpoint) error {
	if r, err := c.runOf(ws, dc.GetTrainingRunId()); err == nil {
		dc.BaseModelRevision = r.Record().GetBaseModelRevision()
	}
	h := sha256.New()
	var n int64
	for from := int64(0); ; {
		steps, _, err := c.store.ListReceiptSteps(ctx, ws, dc.GetTrainingRunId(), from, receiptPageMax)
		if err != nil {
			return internal("reading a receipt", err)
		}
		for _, s := range steps {
			switch {
			case s.GetCheckpointPath() == dc.GetTinkerPath() && s.GetKind() != loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
				dc.TrainingDataSha256 = "sha256:" + hex.EncodeToString(h.Sum(nil))
				dc.TrainingBatches = n
				return nil
			case s.GetBatchSha256() != "":
				h.Write([]byte(s.GetBatchSha256() + "\n"))
				n++
			}
		}
		if len(steps) < receiptPageMax {
			return nil
		}
		from = steps[len(steps)-1].GetSeqId() + 1
	}
}
