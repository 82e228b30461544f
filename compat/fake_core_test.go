package compat

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// fakeCore is a small in-memory implementation of the seven core handler interfaces. It
// records the last request of each method so tests can check the translation, and lets a
// test force an error per method.
type fakeCore struct {
	mu       sync.Mutex
	n        int
	last     map[string]proto.Message
	errs     map[string]error
	sessions map[string]*loopsv1.Session
	runs     map[string]*loopsv1.TrainingRun
	aliases  map[string]string // "<session>:train:<n>" -> run id, as the core keeps them
	samplers map[string]*loopsv1.Sampler
	ops      map[string]*loopsv1.Operation
	ckpts    map[string]*loopsv1.Checkpoint
	models   []*loopsv1.ModelInfo
	usage    []*loopsv1.UsageBucket
	// createdRunID makes CreateTrainingRun return operations without a run id until done.
	lazyRunID bool
}

func newFakeCore() *fakeCore {
	return &fakeCore{
		last: map[string]proto.Message{}, errs: map[string]error{},
		sessions: map[string]*loopsv1.Session{}, runs: map[string]*loopsv1.TrainingRun{}, aliases: map[string]string{},
		samplers: map[string]*loopsv1.Sampler{}, ops: map[string]*loopsv1.Operation{},
		ckpts: map[string]*loopsv1.Checkpoint{},
		models: []*loopsv1.ModelInfo{{Name: "Qwen/Qwen3-8B", MaxSequenceLength: 32768, TokenizerId: "/models/qwen3/tokenizer", Architecture: "qwen3",
			Trainable: true, Sampleable: true}},
	}
}

func (f *fakeCore) services() Services {
	return Services{Sessions: f, Training: f, Operations: f, Checkpoints: f, Sampling: f, Models: f, Usage: f,
		Weights: fakeWeights{f}, Clients: fakeClients{f}}
}

// enter records req under method and returns a forced error, if any. Caller holds no lock.
func (f *fakeCore) enter(method string, req proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last[method] = proto.Clone(req)
	return f.errs[method]
}

func (f *fakeCore) lastReq(method string) proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last[method]
}

func (f *fakeCore) setErr(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[method] = err
}

func (f *fakeCore) nextID(prefix string) string {
	f.n++
	return fmt.Sprintf("%s%d", prefix, f.n)
}

// newOp stores a pending operation.
func (f *fakeCore) newOp(kind loopsv1.OperationKind, run, sampler string, seq int64) *loopsv1.Operation {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := &loopsv1.Operation{Id: f.nextID("op"), Kind: kind, State: loopsv1.OperationState_OPERATION_STATE_PENDING,
		TrainingRunId: run, SamplerId: sampler, SeqId: seq, CreateTime: timestamppb.Now()}
	f.ops[op.Id] = op
	return proto.Clone(op).(*loopsv1.Operation)
}

// finish marks an operation done with a mutation applied to it.
func (f *fakeCore) finish(id string, mut func(op *loopsv1.Operation)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.ops[id]
	op.State = loopsv1.OperationState_OPERATION_STATE_SUCCEEDED
	mut(op)
}

func notFound(what, id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %s not found", what, id))
}

// SessionService.

func (f *fakeCore) CreateSession(_ context.Context, r *loopsv1.CreateSessionRequest) (*loopsv1.Session, error) {
	if err := f.enter("CreateSession", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &loopsv1.Session{Id: f.nextID("sess"), Tags: r.Tags, UserMetadata: r.UserMetadata, ProjectId: r.ProjectId, DisplayName: r.DisplayName, CreateTime: timestamppb.Now()}
	f.sessions[s.Id] = s
	return s, nil
}

func (f *fakeCore) HeartbeatSession(_ context.Context, r *loopsv1.HeartbeatSessionRequest) (*loopsv1.HeartbeatSessionResponse, error) {
	if err := f.enter("HeartbeatSession", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[r.Id]
	if !ok || s.Expired {
		return nil, notFound("session", r.Id)
	}
	return &loopsv1.HeartbeatSessionResponse{}, nil
}

func (f *fakeCore) FinishSession(_ context.Context, r *loopsv1.FinishSessionRequest) (*loopsv1.Session, error) {
	if err := f.enter("FinishSession", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[r.Id]
	if !ok {
		return nil, notFound("session", r.Id)
	}
	s.Expired = true
	s.EndReason = "finished: " + r.Reason
	return proto.Clone(s).(*loopsv1.Session), nil
}

func (f *fakeCore) GetSession(_ context.Context, r *loopsv1.GetSessionRequest) (*loopsv1.Session, error) {
	if err := f.enter("GetSession", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[r.Id]
	if !ok {
		return nil, notFound("session", r.Id)
	}
	return proto.Clone(s).(*loopsv1.Session), nil
}

func (f *fakeCore) ListSessions(_ context.Context, r *loopsv1.ListSessionsRequest) (*loopsv1.ListSessionsResponse, error) {
	if err := f.enter("ListSessions", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &loopsv1.ListSessionsResponse{TotalCount: int64(len(f.sessions))}
	for _, s := range f.sessions {
		out.Sessions = append(out.Sessions, s)
	}
	return out, nil
}

func (f *fakeCore) SearchSessions(_ context.Context, r *loopsv1.SearchSessionsRequest) (*loopsv1.SearchSessionsResponse, error) {
	if err := f.enter("SearchSessions", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &loopsv1.SearchSessionsResponse{}
	for _, s := range f.sessions {
		if r.SessionId == "" || r.SessionId == s.Id {
			out.Results = append(out.Results, &loopsv1.SessionSearchResult{Session: proto.CloneOf(s), CheckpointCount: 2})
		}
	}
	if len(out.Results) > 0 {
		out.NextPageToken = "more"
	}
	return out, nil
}

func (f *fakeCore) SetSessionProject(_ context.Context, r *loopsv1.SetSessionProjectRequest) (*loopsv1.Session, error) {
	if err := f.enter("SetSessionProject", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[r.Id]
	if !ok {
		return nil, notFound("session", r.Id)
	}
	s.ProjectId = r.ProjectId
	return proto.CloneOf(s), nil
}

// TrainingService.

func (f *fakeCore) CreateTrainingRun(_ context.Context, r *loopsv1.CreateTrainingRunRequest) (*loopsv1.Operation, error) {
	if err := f.enter("CreateTrainingRun", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	run := &loopsv1.TrainingRun{Id: f.nextID("run"), SessionId: r.SessionId, BaseModel: r.BaseModel, Lora: r.Lora,
		UserMetadata: r.UserMetadata, CreateTime: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	if run.BaseModel == "" {
		run.BaseModel = "Qwen/Qwen3-8B"
	}
	if run.Lora == nil {
		run.Lora = &loopsv1.LoraConfig{Rank: 8, TrainAttn: true}
	}
	f.runs[run.Id] = run
	if r.SessionId != "" && r.ClientSeqId != nil {
		// Like the core, the run answers to the alias the tinker SDK assumes.
		f.aliases[fmt.Sprintf("%s:train:%d", r.SessionId, *r.ClientSeqId)] = run.Id
	}
	if s, ok := f.sessions[r.SessionId]; ok {
		s.TrainingRunIds = append(s.TrainingRunIds, run.Id)
	}
	lazy := f.lazyRunID
	f.mu.Unlock()
	opRun := run.Id
	if lazy {
		opRun = ""
	}
	op := f.newOp(loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN, opRun, "", 0)
	if lazy {
		f.finish(op.Id, func(o *loopsv1.Operation) {
			o.Result = &loopsv1.Operation_TrainingRun{TrainingRun: proto.Clone(run).(*loopsv1.TrainingRun)}
		})
	}
	return op, nil
}

func (f *fakeCore) GetTrainingRun(_ context.Context, r *loopsv1.GetTrainingRunRequest) (*loopsv1.TrainingRun, error) {
	if err := f.enter("GetTrainingRun", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.runs[r.Id]
	if !ok {
		t, ok = f.runs[f.aliases[r.Id]]
	}
	if !ok {
		return nil, notFound("training run", r.Id)
	}
	return proto.Clone(t).(*loopsv1.TrainingRun), nil
}

// GetTrainingRunMetrics is not used by the compat layer.
func (f *fakeCore) GetTrainingRunMetrics(context.Context, *loopsv1.GetTrainingRunMetricsRequest) (*loopsv1.GetTrainingRunMetricsResponse, error) {
	return nil, connect.NewError(connect.CodeUnimplemented, nil)
}

func (f *fakeCore) ListTrainingRuns(_ context.Context, r *loopsv1.ListTrainingRunsRequest) (*loopsv1.ListTrainingRunsResponse, error) {
	if err := f.enter("ListTrainingRuns", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &loopsv1.ListTrainingRunsResponse{TotalCount: int64(len(f.runs))}
	for _, t := range f.runs {
		out.TrainingRuns = append(out.TrainingRuns, t)
	}
	return out, nil
}

func (f *fakeCore) runOp(method string, req proto.Message, run string, kind loopsv1.OperationKind, seq int64) (*loopsv1.Operation, error) {
	if err := f.enter(method, req); err != nil {
		return nil, err
	}
	f.mu.Lock()
	_, ok := f.runs[run]
	if !ok {
		_, ok = f.runs[f.aliases[run]]
	}
	f.mu.Unlock()
	if !ok {
		return nil, notFound("training run", run)
	}
	return f.newOp(kind, run, "", seq), nil
}

func (f *fakeCore) UnloadTrainingRun(_ context.Context, r *loopsv1.UnloadTrainingRunRequest) (*loopsv1.Operation, error) {
	return f.runOp("UnloadTrainingRun", r, r.Id, loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN, 0)
}

func (f *fakeCore) ForwardBackward(_ context.Context, r *loopsv1.ForwardBackwardRequest) (*loopsv1.Operation, error) {
	kind := loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD
	if r.ForwardOnly {
		kind = loopsv1.OperationKind_OPERATION_KIND_FORWARD
	}
	return f.runOp("ForwardBackward", r, r.TrainingRunId, kind, r.SeqId)
}

func (f *fakeCore) OptimStep(_ context.Context, r *loopsv1.OptimStepRequest) (*loopsv1.Operation, error) {
	return f.runOp("OptimStep", r, r.TrainingRunId, loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, r.SeqId)
}

func (f *fakeCore) SaveWeights(_ context.Context, r *loopsv1.SaveWeightsRequest) (*loopsv1.Operation, error) {
	kind := loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS
	if r.Kind == loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER {
		kind = loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER
	}
	return f.runOp("SaveWeights", r, r.TrainingRunId, kind, r.SeqId)
}

func (f *fakeCore) LoadWeights(_ context.Context, r *loopsv1.LoadWeightsRequest) (*loopsv1.Operation, error) {
	return f.runOp("LoadWeights", r, r.TrainingRunId, loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS, r.SeqId)
}

// OperationService.

func (f *fakeCore) GetOperation(_ context.Context, r *loopsv1.GetOperationRequest) (*loopsv1.Operation, error) {
	if err := f.enter("GetOperation", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	op, ok := f.ops[r.Id]
	if !ok {
		return nil, notFound("operation", r.Id)
	}
	return proto.Clone(op).(*loopsv1.Operation), nil
}

// CancelOperation ends a pending operation CANCELLED (the core's rules are tested in core).
func (f *fakeCore) CancelOperation(_ context.Context, r *loopsv1.CancelOperationRequest) (*loopsv1.Operation, error) {
	if err := f.enter("CancelOperation", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	op, ok := f.ops[r.Id]
	if !ok {
		return nil, notFound("operation", r.Id)
	}
	if op.State == loopsv1.OperationState_OPERATION_STATE_PENDING {
		op.State = loopsv1.OperationState_OPERATION_STATE_CANCELLED
		op.CancelTime = timestamppb.Now()
		op.Error = &loopsv1.OperationError{Code: int32(connect.CodeCanceled), Message: "cancelled by its client", Category: loopsv1.ErrorCategory_ERROR_CATEGORY_USER}
	}
	return proto.Clone(op).(*loopsv1.Operation), nil
}

// BatchGetOperations answers each id, NOT_FOUND for an unknown one.
func (f *fakeCore) BatchGetOperations(ctx context.Context, r *loopsv1.BatchGetOperationsRequest) (*loopsv1.BatchGetOperationsResponse, error) {
	if err := f.enter("BatchGetOperations", r); err != nil {
		return nil, err
	}
	out := &loopsv1.BatchGetOperationsResponse{}
	for _, id := range r.GetIds() {
		op, err := f.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: id})
		res := &loopsv1.OperationLookup{Id: id, Operation: op}
		if err != nil {
			res.Error = &loopsv1.OperationError{Code: int32(connect.CodeNotFound), Message: err.Error()}
		}
		out.Results = append(out.Results, res)
	}
	return out, nil
}

// Completions lists the finished samples of a sampler in id order; the cursor is a count.
func (f *fakeCore) Completions(_ context.Context, samplerID string, after int64, _ time.Duration, limit int) ([]*loopsv1.Operation, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.samplers[samplerID]; !ok {
		return nil, 0, notFound("sampler", samplerID)
	}
	var done []*loopsv1.Operation
	for _, op := range f.ops {
		if op.SamplerId == samplerID && op.State >= loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
			done = append(done, proto.CloneOf(op))
		}
	}
	slices.SortFunc(done, func(a, b *loopsv1.Operation) int { return strings.Compare(a.Id, b.Id) })
	if int64(len(done)) <= after {
		return nil, after, nil
	}
	done = done[after:min(int(after)+limit, len(done))]
	return done, after + int64(len(done)), nil
}

// WaitOperation does not block: tests finish operations before polling, or check try_again.
func (f *fakeCore) WaitOperation(ctx context.Context, r *loopsv1.WaitOperationRequest) (*loopsv1.Operation, error) {
	if err := f.enter("WaitOperation", r); err != nil {
		return nil, err
	}
	return f.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: r.Id})
}

// CheckpointService.

func (f *fakeCore) ListCheckpoints(_ context.Context, r *loopsv1.ListCheckpointsRequest) (*loopsv1.ListCheckpointsResponse, error) {
	if err := f.enter("ListCheckpoints", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &loopsv1.ListCheckpointsResponse{}
	for _, c := range f.ckpts {
		if r.TrainingRunId == "" || c.TrainingRunId == r.TrainingRunId {
			out.Checkpoints = append(out.Checkpoints, c)
		}
	}
	out.TotalCount = int64(len(out.Checkpoints))
	return out, nil
}

func (f *fakeCore) ckpt(path string) (*loopsv1.Checkpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ckpts[path]
	if !ok {
		return nil, notFound("checkpoint", path)
	}
	return c, nil
}

func (f *fakeCore) GetCheckpoint(_ context.Context, r *loopsv1.GetCheckpointRequest) (*loopsv1.Checkpoint, error) {
	if err := f.enter("GetCheckpoint", r); err != nil {
		return nil, err
	}
	return f.ckpt(r.Path)
}

func (f *fakeCore) DeleteCheckpoint(_ context.Context, r *loopsv1.DeleteCheckpointRequest) (*loopsv1.DeleteCheckpointResponse, error) {
	if err := f.enter("DeleteCheckpoint", r); err != nil {
		return nil, err
	}
	if _, err := f.ckpt(r.Path); err != nil {
		return nil, err
	}
	f.mu.Lock()
	delete(f.ckpts, r.Path)
	f.mu.Unlock()
	return &loopsv1.DeleteCheckpointResponse{}, nil
}

func (f *fakeCore) SetCheckpointPublic(_ context.Context, r *loopsv1.SetCheckpointPublicRequest) (*loopsv1.Checkpoint, error) {
	if err := f.enter("SetCheckpointPublic", r); err != nil {
		return nil, err
	}
	c, err := f.ckpt(r.Path)
	if err != nil {
		return nil, err
	}
	c.Public = r.Public
	return c, nil
}

func (f *fakeCore) SetCheckpointTTL(_ context.Context, r *loopsv1.SetCheckpointTTLRequest) (*loopsv1.Checkpoint, error) {
	if err := f.enter("SetCheckpointTTL", r); err != nil {
		return nil, err
	}
	c, err := f.ckpt(r.Path)
	if err != nil {
		return nil, err
	}
	if r.TtlSeconds == nil {
		c.ExpireTime = nil
	} else {
		c.ExpireTime = timestamppb.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	}
	return c, nil
}

// GetCheckpointExportURL is not used by the Tinker routes.
func (f *fakeCore) GetCheckpointExportURL(_ context.Context, r *loopsv1.GetCheckpointExportURLRequest) (*loopsv1.GetCheckpointExportURLResponse, error) {
	if err := f.enter("GetCheckpointExportURL", r); err != nil {
		return nil, err
	}
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("not used by the Tinker routes"))
}

func (f *fakeCore) GetCheckpointArchiveURL(_ context.Context, r *loopsv1.GetCheckpointArchiveURLRequest) (*loopsv1.GetCheckpointArchiveURLResponse, error) {
	if err := f.enter("GetCheckpointArchiveURL", r); err != nil {
		return nil, err
	}
	if _, err := f.ckpt(r.Path); err != nil {
		return nil, err
	}
	return &loopsv1.GetCheckpointArchiveURLResponse{Url: "/archive/abc.tar?sig=1",
		ExpireTime: timestamppb.New(time.Date(2030, 1, 1, 0, 15, 0, 0, time.UTC))}, nil
}

func (f *fakeCore) GetCheckpointFileURLs(_ context.Context, r *loopsv1.GetCheckpointFileURLsRequest) (*loopsv1.GetCheckpointFileURLsResponse, error) {
	if err := f.enter("GetCheckpointFileURLs", r); err != nil {
		return nil, err
	}
	if _, err := f.ckpt(r.Path); err != nil {
		return nil, err
	}
	return &loopsv1.GetCheckpointFileURLsResponse{
		Urls:       map[string]string{"adapter_config.json": "/files/tok/adapter_config.json"},
		ExpireTime: timestamppb.New(time.Date(2030, 1, 1, 0, 15, 0, 0, time.UTC)),
	}, nil
}

// SamplingService.

func (f *fakeCore) CreateSampler(_ context.Context, r *loopsv1.CreateSamplerRequest) (*loopsv1.Sampler, error) {
	if err := f.enter("CreateSampler", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &loopsv1.Sampler{Id: f.nextID("smp"), SessionId: r.SessionId, BaseModel: r.BaseModel, ModelPath: r.ModelPath}
	if s.BaseModel == "" {
		s.BaseModel = "Qwen/Qwen3-8B"
	}
	f.samplers[s.Id] = s
	return s, nil
}

func (f *fakeCore) GetSampler(_ context.Context, r *loopsv1.GetSamplerRequest) (*loopsv1.Sampler, error) {
	if err := f.enter("GetSampler", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.samplers[r.Id]
	if !ok {
		return nil, notFound("sampler", r.Id)
	}
	return s, nil
}

func (f *fakeCore) Sample(_ context.Context, r *loopsv1.SampleRequest) (*loopsv1.Operation, error) {
	if err := f.enter("Sample", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	_, ok := f.samplers[r.SamplerId]
	f.mu.Unlock()
	if !ok {
		return nil, notFound("sampler", r.SamplerId)
	}
	return f.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", r.SamplerId, 0), nil
}

// ModelService.

func (f *fakeCore) ListModels(_ context.Context, r *loopsv1.ListModelsRequest) (*loopsv1.ListModelsResponse, error) {
	if err := f.enter("ListModels", r); err != nil {
		return nil, err
	}
	return &loopsv1.ListModelsResponse{Models: f.models}, nil
}

// UsageService.

func (f *fakeCore) EstimateCost(context.Context, *loopsv1.EstimateCostRequest) (*loopsv1.EstimateCostResponse, error) {
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("not used by the Tinker routes"))
}

func (f *fakeCore) GetUsage(_ context.Context, r *loopsv1.GetUsageRequest) (*loopsv1.GetUsageResponse, error) {
	if err := f.enter("GetUsage", r); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &loopsv1.GetUsageResponse{Buckets: f.usage}, nil
}
