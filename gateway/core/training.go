package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/gateway/core/trainrun"
	"github.com/loops-dev/loops/gateway/core/validate"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/replicaplan"
	"github.com/loops-dev/loops/internal/semantics"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TrainingService implements loops.v1 TrainingService.
type TrainingService struct{ c *Core }

// model returns a served model by name.
func (c *Core) model(name string) (*loopsv1.ModelInfo, error) {
	m, ok := c.models[name]
	if !ok {
		return nil, invalidArgument("unknown base model %q: this server serves %v (see GET /v1/models or get_server_capabilities)", name, slices.Sorted(maps.Keys(c.models)))
	}
	return m, nil
}

// runOf returns a run of the workspace, by its id or by its alias
// "<session_id>:train:<client_seq_id>", reloading it from the store when it is not in
// memory (registry.go).
func (c *Core) runOf(ws, id string) (*run, error) {
	r, err := c.runs.get(c.ctx, ws, id)
	if err != nil {
		return nil, err
	}
	if r == nil || r.Workspace() != ws {
		return nil, notFound("training run %q not found (it does not exist, or belongs to another API key's workspace)", id)
	}
	return r, nil
}

// CreateTrainingRun creates a LoRA adapter on a base model.
func (s TrainingService) CreateTrainingRun(ctx context.Context, req *loopsv1.CreateTrainingRunRequest) (*loopsv1.Operation, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	var sess *sessionState
	if req.GetSessionId() != "" {
		if sess, err = c.session(ctx, ws, req.GetSessionId()); err != nil {
			return nil, err
		}
	}
	if sess == nil || req.ClientSeqId == nil {
		return c.createRun(ctx, ws, sess, req)
	}
	// Retries of one client_seq_id, concurrent ones included, get the first call's operation.
	var created *loopsv1.Operation
	opID, fresh, err := sess.runSeq.once(ctx, req.GetClientSeqId(), func() (string, error) {
		op, err := c.createRun(ctx, ws, sess, req)
		created = op
		return op.GetId(), err
	})
	if err != nil || fresh {
		return created, err
	}
	o, err := c.ops.lookup(ctx, ws, opID)
	if err != nil {
		return nil, err
	}
	return c.ops.current(o)
}

// createRun creates a run (in the session sess, if not nil) and queues its adapter's creation.
func (c *Core) createRun(ctx context.Context, ws string, sess *sessionState, req *loopsv1.CreateTrainingRunRequest) (*loopsv1.Operation, error) {
	baseModel, lora := req.GetBaseModel(), req.GetLora()
	var from *checkpointOf
	if req.GetFromCheckpoint() != "" {
		ck, owner, err := c.readableWith(ctx, ws, req.GetFromCheckpoint(), req.GetWeightsAccessToken())
		if err != nil {
			return nil, err
		}
		if req.GetWithOptimizer() && ck.GetKind() != loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING {
			return nil, invalidArgument("%s is a sampler checkpoint and holds no optimizer state: load it without the optimizer, or use a training checkpoint (tinker://…/weights/…)", req.GetFromCheckpoint())
		}
		if baseModel == "" {
			baseModel = ck.GetBaseModel()
		}
		if baseModel != ck.GetBaseModel() {
			return nil, invalidArgument("checkpoint %s was trained on %s, not %s", req.GetFromCheckpoint(), ck.GetBaseModel(), baseModel)
		}
		if lora == nil {
			lora = ck.GetLora()
		}
		if !sameAdapterShape(lora, ck.GetLora()) {
			return nil, invalidArgument("the LoRA config {%v} does not match checkpoint %s's {%v}: rank and train_* flags must be equal", lora, req.GetFromCheckpoint(), ck.GetLora())
		}
		from = &checkpointOf{Owner: owner, Checkpoint: ck}
	}
	model, err := c.model(baseModel)
	if err != nil {
		return nil, err
	}
	if err := validate.Lora(model, lora); err != nil {
		return nil, err
	}
	if lora.GetRank() == 0 { // full fine-tuning: a replica must hold it (internal/replicaplan)
		if err := replicaplan.CheckFullFinetune(model, c.opts.Replica); err != nil {
			return nil, failedPrecondition("%v", err)
		}
	}
	dedicated, err := c.dedicatedFor(ws, req.GetUserMetadata(), req.GetDedicated())
	if err != nil {
		return nil, err
	}
	record, err := recordDataAsked(req)
	if err != nil {
		return nil, err
	}
	attach, every, err := c.evalsFromMetadata(ctx, ws, req.GetUserMetadata())
	if err != nil {
		return nil, err
	}
	now := timestamppb.New(c.now())
	info := &loopsv1.TrainingRun{
		Id:              newID("run"),
		SessionId:       req.GetSessionId(),
		ClientSeqId:     req.ClientSeqId,
		BaseModel:       baseModel,
		Lora:            lora,
		UserMetadata:    req.GetUserMetadata(),
		CreateTime:      now,
		LastRequestTime: now,
		// The receipt's (receipts.go).
		Client:            clientInfo(req.GetClient()),
		BaseModelRevision: model.GetRevision(),
		RecordData:        record,
		FromCheckpoint:    req.GetFromCheckpoint(),
		// Its dedicated pool's time is kept under and held to this key (poollease.go).
		Owner: auth.CallerOf(ctx).KeyID,
	}
	if err := c.policy.StartRun(ws, info.Id, baseModel, lora.GetRank()); err != nil { // counted live until EndRun
		return nil, err
	}
	// The run is registered before the session records it, and the session refuses it
	// once ended: a session that ends meanwhile either unloads the run or refuses it.
	r, err := c.newRunCreating(ws, info)
	if err != nil {
		c.policy.EndRun(info.Id)
		return nil, err
	}
	c.runs.add(r)
	forget := func() {
		c.runs.drop(r)
		c.policy.EndRun(r.ID())
	}
	if sess != nil {
		if err := sess.addRun(c, info.Id); err != nil {
			forget()
			return nil, err
		}
	}
	if err := c.store.PutTrainingRun(ctx, ws, info); err != nil {
		forget()
		if sess != nil {
			sess.removeRun(info.Id)
		}
		return nil, internal("recording training run", err)
	}
	if len(attach) > 0 {
		if _, err := c.attachEvals(ctx, ws, info.Id, attach, every); err != nil {
			c.log.Error("attaching the evals a run's user_metadata names", slog.String("run", info.Id), slog.Any("err", err))
		}
	}
	if sess != nil {
		// The session's list of runs is durable before the run is acknowledged: a session
		// revived after a crash (reviveSession) knows all its runs.
		c.persistSession(ctx, sess)
	}
	op, err := c.submit(ctx, r, 0, loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN, func(seq int64) (*task, error) {
		o, err := c.ops.create(ctx, ws, loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN, info.Id, "", seq)
		if err != nil {
			return nil, err
		}
		return &task{Op: o, Creates: true, Exec: func(ctx context.Context) (func(*loopsv1.Operation), error) {
			return c.createAdapter(ctx, r, from, req.GetWithOptimizer(), dedicated)
		}}, nil
	})
	if err != nil {
		// Nothing was queued: the run stays listed but takes no work and holds no slot.
		c.failRun(r, "creating it failed: "+connectMessage(err))
		return nil, err
	}
	return op, nil
}

// failRun makes a run whose creation failed refuse work with reason (in memory and in the
// store) and stop counting as live; its queued work fails with the reason.
func (c *Core) failRun(r *run, reason string) {
	queued := r.Fail(reason)
	c.policy.EndRun(r.ID())
	c.markUnloaded(r, reason)
	err := failedPrecondition("training run %s takes no more work: %s", r.ID(), reason)
	for _, t := range queued {
		c.ops.finish(t.Op, nil, err)
	}
}

// checkpointOf is a checkpoint record and its owner's workspace.
type checkpointOf = trainrun.CheckpointRef

func (c *Core) createAdapter(ctx context.Context, r *run, from *checkpointOf, withOptimizer bool, dedicated dedicatedShape) (func(*loopsv1.Operation), error) {
	info := r.Record()
	create := func() error {
		_, err := c.backend.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: r.ID(), BaseModel: info.GetBaseModel(), Lora: info.GetLora(), Pool: r.Pool()})
		if err == nil && from != nil {
			err = c.loadAdapter(ctx, r, from.Owner, from.Checkpoint, withOptimizer)
		}
		return err
	}
	var err error
	if dedicated.replicas > 0 {
		err = c.acquirePool(ctx, r, dedicated)
	}
	if err == nil {
		err = create()
	}
	if err != nil && errs.Reason(err) != errs.ReasonBudgetExceeded && (c.recoversSteps(info.GetBaseModel()) || r.Pool() != "") {
		err = c.retryCreate(ctx, r, create, err)
	}
	if err != nil {
		c.failRun(r, "creating its adapter failed: "+connectMessage(err))
		return nil, err
	}
	r.SetAdapter(true, false)
	c.startRecovery(r, from, withOptimizer)
	info = r.Record()
	return func(op *loopsv1.Operation) { op.Result = &loopsv1.Operation_TrainingRun{TrainingRun: info} }, nil
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// canonicalRunID returns the run id for an id or alias of a run of the workspace, and any
// other string unchanged.
func (c *Core) canonicalRunID(ws, id string) string {
	if r, err := c.runOf(ws, id); err == nil {
		return r.ID()
	}
	return id
}

// runAlias is the id the tinker SDK assumes for the n-th training client of a session.
func runAlias(sessionID string, n int64) string {
	return sessionID + ":train:" + strconv.FormatInt(n, 10)
}

// GetTrainingRun returns one training run.
func (s TrainingService) GetTrainingRun(ctx context.Context, req *loopsv1.GetTrainingRunRequest) (*loopsv1.TrainingRun, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if r, err := s.c.runOf(ws, req.GetId()); err == nil {
		return r.Record(), nil
	}
	run, err := s.c.store.GetTrainingRun(ctx, ws, req.GetId())
	if err != nil {
		return nil, storeErr(err, "training run "+quote(req.GetId()))
	}
	return run, nil
}

// ListTrainingRuns lists the workspace's training runs, newest first.
func (s TrainingService) ListTrainingRuns(ctx context.Context, req *loopsv1.ListTrainingRunsRequest) (*loopsv1.ListTrainingRunsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	list := "training_runs"
	if req.GetProjectId() != "" {
		p, err := s.c.ResolveProject(ctx, ws, req.GetProjectId())
		if err != nil {
			return nil, err
		}
		list = "training_runs/project/" + p.GetName()
	}
	page, err := s.c.pageOf(ws, list, req.GetLimit(), req.GetOffset(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	var runs []*loopsv1.TrainingRun
	var total int64
	if req.GetProjectId() != "" {
		runs, total, err = s.c.store.ListProjectTrainingRuns(ctx, ws, strings.TrimPrefix(list, "training_runs/project/"), page.Page)
	} else {
		runs, total, err = s.c.store.ListTrainingRuns(ctx, ws, page.Page)
	}
	if err != nil {
		return nil, internal("listing training runs", err)
	}
	runs, next := nextPage(page, runs)
	return &loopsv1.ListTrainingRunsResponse{TrainingRuns: runs, TotalCount: total, NextPageToken: next}, nil
}

// UnloadTrainingRun frees the run's adapter after the work queued before it.
func (s TrainingService) UnloadTrainingRun(ctx context.Context, req *loopsv1.UnloadTrainingRunRequest) (*loopsv1.Operation, error) {
	c := s.c
	return c.enqueue(ctx, req.GetId(), 0, loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN, nil,
		func(r *run, seq int64) *task {
			return &task{Exec: func(ctx context.Context) (func(*loopsv1.Operation), error) {
				c.unloadRun(ctx, r, "it was unloaded", true)
				return func(op *loopsv1.Operation) {
					op.Result = &loopsv1.Operation_Unload{Unload: &loopsv1.UnloadTrainingRunResult{TrainingRunId: r.ID()}}
				}, nil
			}}
		})
}

// enqueue places work on a training run of the caller's workspace at seq. check validates
// the request against the run's record (its base model and LoRA config, which never change)
// before the operation is created, without the run's lock: bad input is a 4xx and consumes
// its seq_id. Then the operation is created and build makes the task.
func (c *Core) enqueue(ctx context.Context, runID string, seq int64, kind loopsv1.OperationKind,
	check func(ws string, info *loopsv1.TrainingRun) error, build func(r *run, seq int64) *task) (*loopsv1.Operation, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	r, err := c.runOf(ws, runID)
	if err != nil {
		return nil, err
	}
	return c.submit(ctx, r, seq, kind, func(seq int64) (*task, error) {
		if check != nil {
			if err := check(ws, r.Record()); err != nil {
				return nil, err
			}
		}
		o, err := c.ops.create(ctx, ws, kind, r.ID(), "", seq)
		if err != nil {
			return nil, err
		}
		t := build(r, seq)
		t.Op = o
		return t, nil
	})
}

// unloadRun refuses later work on a run with reason, fails its queued work and frees its
// adapter. The adapter is freed only when the run's running work is done: at once if the
// run is idle (or ownTask: the unload is the run's running task), else when that work
// finishes (release), so an unload never races the run's in-flight backend call.
func (c *Core) unloadRun(ctx context.Context, r *run, reason string, ownTask bool) {
	u := r.Unload(reason, ownTask)
	if !u.First {
		return
	}
	c.policy.EndRun(r.ID())
	c.markUnloaded(r, reason)
	err := failedPrecondition("training run %s takes no more work: %s", r.ID(), reason)
	for _, t := range u.Queued {
		c.ops.finish(t.Op, nil, err)
	}
	if u.FreeNow {
		c.freeAdapter(ctx, r)
	}
}

// freeAdapter deletes a run's adapter from the backend and gives up its slot.
func (c *Core) freeAdapter(ctx context.Context, r *run) {
	defer c.slots.Forget(r)
	c.endRecovery(r)
	if _, err := c.backend.Trainer().DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.ID()}); err != nil {
		c.log.Error("deleting adapter", slog.String("run", r.ID()), slog.Any("err", err))
	}
	c.releasePool(ctx, r)
}

// ForwardBackward queues a forward (forward_only) or forward/backward pass.
func (s TrainingService) ForwardBackward(ctx context.Context, req *loopsv1.ForwardBackwardRequest) (*loopsv1.Operation, error) {
	c := s.c
	kind := loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD
	if req.GetForwardOnly() {
		kind = loopsv1.OperationKind_OPERATION_KIND_FORWARD
	}
	tokens := 0
	ctx, err := c.fbEstimate(ctx, req)
	if err != nil {
		return nil, err
	}
	return c.enqueue(ctx, req.GetTrainingRunId(), req.GetSeqId(), kind,
		func(ws string, info *loopsv1.TrainingRun) error {
			model, err := c.model(info.GetBaseModel())
			if err != nil {
				return err
			}
			if err := c.policy.CheckData(ws, model.GetName(), req.GetData()); err != nil {
				return err
			}
			tokens, err = validate.ForwardBackward(model, req, validate.Limits{Losses: c.losses, MaxDatums: c.opts.MaxDatumsPerRequest, MaxBatchTokens: c.opts.MaxBatchTokens})
			return err
		},
		func(r *run, seq int64) *task {
			t := &task{Tokens: tokens, FB: &backendv1.ForwardBackwardItem{
				AdapterId: r.ID(), Data: req.GetData(), LossFn: req.GetLossFn(),
				LossFnConfig: req.GetLossFnConfig(), ForwardOnly: req.GetForwardOnly(),
			}}
			if tokens > c.opts.ChunkTokens {
				t.Chunks = trainrun.ChunkData(req.GetData(), c.opts.ChunkTokens, func(d *loopsv1.Datum) int { return len(d.GetTokens()) })
			}
			if !req.GetForwardOnly() {
				c.recordBatch(ctx, r, seq, req, t)
			}
			return t
		})
}

// OptimStep queues an AdamW step on the run's accumulated gradients.
func (s TrainingService) OptimStep(ctx context.Context, req *loopsv1.OptimStepRequest) (*loopsv1.Operation, error) {
	c := s.c
	return c.enqueue(ctx, req.GetTrainingRunId(), req.GetSeqId(), loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP,
		func(string, *loopsv1.TrainingRun) error { return validate.Adam(req.GetAdam()) },
		func(r *run, _ int64) *task {
			return &task{Adam: req.GetAdam(), Exec: func(ctx context.Context) (func(*loopsv1.Operation), error) {
				resp, err := c.backend.Trainer().OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: r.ID(), Adam: semantics.AdamWithDefaults(req.GetAdam())})
				if err != nil {
					return nil, c.adapterLost(r, err)
				}
				return func(op *loopsv1.Operation) {
					op.Result = &loopsv1.Operation_OptimStep{OptimStep: resp.GetResult()}
				}, nil
			}}
		})
}

// SaveWeights queues a checkpoint save.
func (s TrainingService) SaveWeights(ctx context.Context, req *loopsv1.SaveWeightsRequest) (*loopsv1.Operation, error) {
	c := s.c
	kind := loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS
	if req.GetKind() == loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER {
		kind = loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER
	}
	return c.enqueue(ctx, req.GetTrainingRunId(), req.GetSeqId(), kind,
		func(string, *loopsv1.TrainingRun) error { return validateSave(req) },
		func(r *run, seq int64) *task {
			return &task{Exec: func(ctx context.Context) (func(*loopsv1.Operation), error) {
				return c.saveCheckpoint(ctx, r, req, seq)
			}}
		})
}

func validateSave(req *loopsv1.SaveWeightsRequest) error {
	switch req.GetKind() {
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL:
		if err := validate.CheckpointName(req.GetName()); err != nil {
			return err
		}
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
		if req.GetName() != "" {
			if err := validate.CheckpointName(req.GetName()); err != nil {
				return err
			}
		}
	default:
		return invalidArgument("kind must be CHECKPOINT_KIND_TRAINING, CHECKPOINT_KIND_SAMPLER or CHECKPOINT_KIND_EXTERNAL")
	}
	if req.TtlSeconds != nil {
		if _, err := checkpointTTL(req.GetTtlSeconds()); err != nil {
			return err
		}
	}
	return nil
}

// LoadWeights queues loading a checkpoint into the run.
func (s TrainingService) LoadWeights(ctx context.Context, req *loopsv1.LoadWeightsRequest) (*loopsv1.Operation, error) {
	c := s.c
	return c.enqueue(ctx, req.GetTrainingRunId(), req.GetSeqId(), loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS,
		func(ws string, info *loopsv1.TrainingRun) error {
			_, _, err := c.loadableCheckpoint(ctx, ws, req.GetTrainingRunId(), info, req)
			return err
		},
		func(r *run, _ int64) *task {
			return &task{Exec: func(ctx context.Context) (func(*loopsv1.Operation), error) {
				ck, owner, err := c.loadableCheckpoint(ctx, r.Workspace(), r.ID(), r.Record(), req)
				if err != nil {
					return nil, err
				}
				if err := c.loadAdapter(ctx, r, owner, ck, req.GetWithOptimizer()); err != nil {
					if connect.CodeOf(err) == connect.CodeFailedPrecondition {
						return nil, err // the checkpoint's files are gone: the adapter is untouched
					}
					return nil, c.adapterLost(r, err)
				}
				c.updateRun(r, func(i *loopsv1.TrainingRun) { i.Corrupted = false })
				c.afterLoad(r, &checkpointOf{Owner: owner, Checkpoint: ck}, req.GetWithOptimizer())
				return func(op *loopsv1.Operation) {
					op.Result = &loopsv1.Operation_LoadWeights{LoadWeights: &loopsv1.LoadWeightsResult{Path: req.GetPath(), TrainingRunId: r.ID()}}
				}, nil
			}}
		})
}

// loadableCheckpoint resolves a checkpoint, returning it and its owner, and checks that it
// fits the run.
func (c *Core) loadableCheckpoint(ctx context.Context, ws, runID string, info *loopsv1.TrainingRun, req *loopsv1.LoadWeightsRequest) (*loopsv1.Checkpoint, string, error) {
	ck, owner, err := c.readableWith(ctx, ws, req.GetPath(), req.GetWeightsAccessToken())
	if err != nil {
		return nil, "", err
	}
	if req.GetWithOptimizer() && ck.GetKind() != loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING {
		return nil, "", invalidArgument("%s is a sampler checkpoint and holds no optimizer state: load it without the optimizer, or use a training checkpoint (tinker://…/weights/…)", req.GetPath())
	}
	if ck.GetBaseModel() != info.GetBaseModel() {
		return nil, "", invalidArgument("checkpoint %s was trained on %s but training run %s uses %s", req.GetPath(), ck.GetBaseModel(), runID, info.GetBaseModel())
	}
	if !sameAdapterShape(ck.GetLora(), info.GetLora()) {
		return nil, "", invalidArgument("checkpoint %s has LoRA config {%v} but training run %s has {%v}; rank and train_* flags must be equal: create a run from the checkpoint instead (create_training_client_from_state)", req.GetPath(), ck.GetLora(), runID, info.GetLora())
	}
	return ck, owner, nil
}

// recoverRuns loads into memory, after a restart, the runs of the store that may still take
// work: not those with an unload_reason, nor those of a session the store records as ended
// (records written before unload_reason existed). They count as live against their
// workspace's max_concurrent_runs, and their sessions are revived with a fresh heartbeat
// clock, so a run whose client never comes back ends with its session's heartbeat timeout.
// Their adapters are recreated on first use (see ensureAdapter); the other runs are
// reloaded on demand (registry.go).
func (c *Core) recoverRuns(ctx context.Context) error {
	runs, err := c.store.ListAllTrainingRuns(ctx)
	if err != nil {
		return fmt.Errorf("core: recovering training runs: %w", err)
	}
	type sessionOf struct {
		info  *loopsv1.Session
		ended bool
	}
	sessions := map[string]sessionOf{} // session id -> its record, and whether it ended
	for _, or := range runs {
		if _, ok := c.models[or.Run.GetBaseModel()]; !ok || or.Run.GetUnloadReason() != "" {
			continue
		}
		if sid := or.Run.GetSessionId(); sid != "" {
			s, seen := sessions[sid]
			if !seen {
				info, err := c.store.GetSession(ctx, or.Workspace, sid)
				switch {
				case errors.Is(err, store.ErrNotFound): // recovered as before sessions were recorded
					s = sessionOf{}
				case err != nil:
					return fmt.Errorf("core: recovering training runs: reading session %s: %w", sid, err)
				default:
					s = sessionOf{info: info, ended: info.GetExpired()}
				}
				sessions[sid] = s
				if s.info != nil && !s.ended {
					c.reviveSession(or.Workspace, s.info)
				}
			}
			if s.ended {
				continue
			}
		}
		// The first request after a restart sets the run's position: the client's counter
		// carries on from wherever it was.
		r, err := c.newRun(or.Workspace, or.Run, sequencer.Resync, false, "")
		if err != nil {
			return err
		}
		c.runs.add(r)
		c.policy.AdoptRun(or.Workspace, r.ID())
	}
	return nil
}

// sameAdapterShape reports whether two LoRA configs give adapters of the same tensors: equal
// rank and train_* flags. The seed only sets the initial weights, which a load replaces.
func sameAdapterShape(a, b *loopsv1.LoraConfig) bool {
	return a.GetRank() == b.GetRank() && a.GetTrainAttn() == b.GetTrainAttn() &&
		a.GetTrainMlp() == b.GetTrainMlp() && a.GetTrainUnembed() == b.GetTrainUnembed()
}

// fbEstimate puts in ctx the estimated cost of a forward_backward (its tokens at the
// training price: exact) when its workspace has a budget, after loading the workspace's
// spend (budget.go).
func (c *Core) fbEstimate(ctx context.Context, req *loopsv1.ForwardBackwardRequest) (context.Context, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if !c.anyBudget(ctx, ws) {
		return ctx, nil
	}
	r, err := c.runOf(ws, req.GetTrainingRunId())
	if err != nil {
		return nil, err
	}
	if err := c.budgetReady(ctx, ws); err != nil {
		return nil, err
	}
	var tokens int64
	for _, d := range req.GetData() {
		tokens += int64(len(d.GetTokens()))
	}
	return withEstimate(ctx, c.estimate(ws, r.Record().GetBaseModel(), map[string]int64{store.UsageTraining: tokens})), nil
}
