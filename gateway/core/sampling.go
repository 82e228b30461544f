package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/loops-dev/loops/internal/lockorder"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/core/validate"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// samplerState is a sampler in memory: its record, the checkpoint it samples with (ref: a
// held folder, or presignable files for a backend that takes URLs; nil for the base model;
// released when the sampler leaves memory), and its seq_id de-duplication table.
type samplerState struct {
	ws   string
	info *loopsv1.Sampler
	used time.Time // last request that named it (samplers.mu); see samplers.expire
	// seen de-duplicates the samples' seq_ids (seq_id -> operation id).
	seen *onceTable
	mu   lockorder.Mutex[rankSampler]
	ref  *ckfiles.Ref
	// dropped: the sampler left memory and released ref; a request that still holds the
	// pointer reloads it.
	dropped bool
	// shared is the key of a workspace's shared sampler (sharedKey): held in memory only,
	// with no record, for requests that name no sampler; "" for a created sampler.
	shared string
	// path is the tinker:// path of the checkpoint ref holds (mu): info's model_path, or for
	// an inflight sampler the run's inflight save it last followed (samplers.follow).
	path string
}

// holdRef adds a holder to the sampler's checkpoint folder for one request (nil for the
// base model), with the folder's tinker:// path; ok is false when the sampler left memory
// meanwhile.
func (s *samplerState) holdRef() (ref *ckfiles.Ref, path string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped {
		return nil, "", false
	}
	if s.ref == nil {
		return nil, s.path, true
	}
	return s.ref.Hold(), s.path, true
}

// follow points an inflight sampler at its run's newest inflight save when it samples
// another one (a save made since it last sampled). A run without one (or that is gone)
// leaves the sampler as it is. The folder is opened outside the sampler's lock.
func (ss *samplers) follow(ctx context.Context, st *samplerState) error {
	ck, err := ss.inflightCheckpoint(ctx, st.ws, st.info.GetInflightRunId())
	if err != nil || ck == nil {
		return err
	}
	st.mu.Lock()
	same := st.path == ck.GetTinkerPath()
	st.mu.Unlock()
	if same {
		return nil
	}
	ref, err := ss.c.adapterOf(ctx, st.ws, ck)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dropped { // left memory meanwhile: the request reloads it
		ref.Release()
		return nil
	}
	old := st.ref
	st.ref, st.path = ref, ck.GetTinkerPath()
	old.Release()
	return nil
}

// inflightCheckpoint is the newest inflight sampler save of a run of the workspace (nil
// when it has none or is gone).
func (ss *samplers) inflightCheckpoint(ctx context.Context, ws, runID string) (*loopsv1.Checkpoint, error) {
	r, err := ss.c.runs.get(ctx, ws, runID)
	if err != nil || r == nil || r.Workspace() != ws {
		return nil, err
	}
	return r.Record().GetInflightSamplerCheckpoint(), nil
}

// samplers holds the live samplers and the fair queue of sampling requests.
type samplers struct {
	c     *Core
	mu    lockorder.Mutex[rankSamplers]
	byID  map[string]*samplerState
	perWS map[string]int // samplers in byID per workspace
	// shared maps sharedKey(workspace, base model, model path) to the shared sampler in
	// byID (it leaves with it: the same bounds and expiry apply).
	shared map[string]*samplerState
	queue  *sampleQueue
}

// sharedKey names a workspace's shared sampler of a base model or checkpoint.
func sharedKey(ws, baseModel, modelPath string) string {
	return ws + "\x00" + baseModel + "\x00" + modelPath
}

func newSamplers(c *Core) *samplers {
	return &samplers{c: c, byID: map[string]*samplerState{}, shared: map[string]*samplerState{}, queue: newSampleQueue(c)}
}

// create registers a sampler; model is the checkpoint path ("" for the base model) and ref
// its opened folder (nil for the base model), which the sampler holds from then on.
// inflightRun, when set, makes it an inflight sampler of that run (Sampler.inflight_run_id).
func (ss *samplers) create(ctx context.Context, ws, sessionID, baseModel, modelPath, deployment, inflightRun string, ref *ckfiles.Ref) (*loopsv1.Sampler, error) {
	var sess *sessionState
	if sessionID != "" {
		var err error
		if sess, err = ss.c.session(ctx, ws, sessionID); err != nil {
			ref.Release()
			return nil, err
		}
		if err := sess.reserveSampler(ss.c); err != nil {
			ref.Release()
			return nil, err
		}
	}
	info := &loopsv1.Sampler{
		Id: newID("smp"), SessionId: sessionID, BaseModel: baseModel, ModelPath: modelPath,
		CreateTime: timestamppb.New(ss.c.now()), Deployment: deployment, InflightRunId: inflightRun,
	}
	if err := ss.c.store.PutSampler(ctx, ws, info); err != nil {
		ref.Release()
		if sess != nil {
			sess.unreserveSampler()
		}
		return nil, internal("recording sampler", err)
	}
	ss.add(newSamplerState(ws, info, ref))
	if sess != nil {
		sess.addSampler(info.Id)
	}
	return info, nil
}

// add holds a sampler in memory. Past Limits.MaxSamplersInMemory samplers of its workspace,
// the least recently used one of them is dropped from memory (its record stays, and get
// reloads it when a request names it). It returns the sampler held: s, or the one another
// request reloaded meanwhile.
func (ss *samplers) add(s *samplerState) *samplerState {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.c.now()
	if cur, ok := ss.byID[s.info.GetId()]; ok {
		cur.used = now
		s.ref.Release()
		return cur
	}
	if s.shared != "" {
		if cur, ok := ss.shared[s.shared]; ok { // made meanwhile by another request
			cur.used = now
			s.ref.Release()
			return cur
		}
		ss.shared[s.shared] = s
	}
	s.used = now
	ss.byID[s.info.GetId()] = s
	if ss.perWS == nil {
		ss.perWS = map[string]int{}
	}
	ss.perWS[s.ws]++
	if ss.perWS[s.ws] <= ss.c.opts.Limits.MaxSamplersInMemory {
		return s
	}
	var lru *samplerState
	for _, o := range ss.byID {
		if o.ws == s.ws && o != s && (lru == nil || o.used.Before(lru.used)) {
			lru = o
		}
	}
	if lru != nil {
		ss.dropLocked(lru)
	}
	return s
}

// dropLocked forgets a sampler held in memory; ss.mu must be held.
func (ss *samplers) dropLocked(s *samplerState) {
	if ss.byID[s.info.GetId()] != s {
		return
	}
	delete(ss.byID, s.info.GetId())
	if s.shared != "" && ss.shared[s.shared] == s {
		delete(ss.shared, s.shared)
	}
	if ss.perWS[s.ws]--; ss.perWS[s.ws] <= 0 {
		delete(ss.perWS, s.ws)
	}
	s.mu.Lock()
	s.dropped = true
	s.ref.Release() // a request that already got s reloads it (holdRef)
	s.mu.Unlock()
}

// newSamplerState is a sampler in memory that holds ref (nil for the base model).
func newSamplerState(ws string, info *loopsv1.Sampler, ref *ckfiles.Ref) *samplerState {
	return &samplerState{ws: ws, info: info, ref: ref, seen: newOnceTable(), path: info.GetModelPath()}
}

// expire drops from memory the samplers no request named for Limits.SamplerIdleTTL. They
// still work: get reloads them from the store.
func (ss *samplers) expire(now time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.byID {
		if now.Sub(s.used) >= ss.c.opts.Limits.SamplerIdleTTL {
			ss.dropLocked(s)
		}
	}
}

// inMemory is the number of samplers held in memory (tests, the soak benchmark).
func (ss *samplers) inMemory() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.byID)
}

// get returns a sampler of the workspace, reviving it from the store after a restart.
func (ss *samplers) get(ctx context.Context, ws, id string) (*samplerState, error) {
	ss.mu.Lock()
	s, ok := ss.byID[id]
	if ok {
		s.used = ss.c.now()
	}
	ss.mu.Unlock()
	if ok {
		if s.ws != ws {
			return nil, notFound("sampler %q not found (it does not exist, or belongs to another API key's workspace)", id)
		}
		if d := s.info.GetDeployment(); d != "" {
			// Deleting or replacing the deployment, or revoking its grant, stops its samplers.
			if err := ss.c.checkDeploymentAccess(ctx, ws, d, s.info.GetModelPath()); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	info, err := ss.c.store.GetSampler(ctx, ws, id)
	if err != nil {
		return nil, storeErr(err, "sampler "+quote(id))
	}
	var ref *ckfiles.Ref
	if d := info.GetDeployment(); d != "" {
		ck, owner, _, err := ss.c.deploymentCheckpoint(ctx, ws, d)
		if err != nil {
			return nil, err
		}
		if ck.GetTinkerPath() != info.GetModelPath() {
			return nil, deploymentReplaced(d, info.GetModelPath()) // while the gateway was down
		}
		if ref, err = ss.c.checkpointFolder(ctx, owner, ck); err != nil {
			return nil, err
		}
	} else if info.GetModelPath() != "" {
		ck, owner, err := ss.inflightOrOwn(ctx, ws, info)
		if err != nil {
			return nil, err
		}
		if ref, err = ss.c.adapterOf(ctx, owner, ck); err != nil {
			return nil, err
		}
		st := newSamplerState(ws, info, ref)
		st.path = ck.GetTinkerPath()
		return ss.add(st), nil
	}
	return ss.add(newSamplerState(ws, info, ref)), nil
}

// inflightOrOwn is the checkpoint a sampler record samples: its run's newest inflight save
// for an inflight sampler that has one, else its model_path.
func (ss *samplers) inflightOrOwn(ctx context.Context, ws string, info *loopsv1.Sampler) (*loopsv1.Checkpoint, string, error) {
	if run := info.GetInflightRunId(); run != "" {
		ck, err := ss.inflightCheckpoint(ctx, ws, run)
		if err != nil {
			return nil, "", err
		}
		if ck != nil {
			return ck, ws, nil
		}
	}
	return ss.c.resolveOwned(ctx, ws, info.GetModelPath())
}

// sharedSampler returns the workspace's shared sampler of baseModel, or of the sampler
// checkpoint modelPath, making it if it is not in memory: a request that names no sampler
// (Tinker's sessionless asample) samples with it. It has no record and is dropped from
// memory as other samplers are; the next such request makes it again.
func (ss *samplers) sharedSampler(ctx context.Context, ws, baseModel, modelPath string) (*samplerState, error) {
	key := sharedKey(ws, baseModel, modelPath)
	if modelPath != "" {
		key = sharedKey(ws, "", modelPath) // a checkpoint has one base model
	}
	ss.mu.Lock()
	s, ok := ss.shared[key]
	if ok {
		s.used = ss.c.now()
	}
	ss.mu.Unlock()
	if ok {
		return s, nil
	}
	c := ss.c
	var ck *loopsv1.Checkpoint
	var owner string
	if modelPath != "" {
		var err error
		if baseModel, ck, owner, err = c.samplerCheckpoint(ctx, ws, baseModel, modelPath); err != nil {
			return nil, err
		}
	}
	if baseModel == "" {
		return nil, invalidArgument("give a sampler_id, or a base_model or a model_path (tinker://…/sampler_weights/…) to sample with the workspace's shared sampler")
	}
	ref, err := c.samplerAdapter(ctx, ws, baseModel, ck, owner)
	if err != nil {
		return nil, err
	}
	info := &loopsv1.Sampler{Id: newID("smp"), BaseModel: baseModel, ModelPath: modelPath, CreateTime: timestamppb.New(c.now())}
	st := newSamplerState(ws, info, ref)
	st.shared = key
	return ss.add(st), nil
}

// dropSession forgets the samplers of an expired session (their records stay).
func (ss *samplers) dropSession(sessionID string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.byID {
		if s.info.GetSessionId() == sessionID {
			ss.dropLocked(s)
		}
	}
}

// SamplingService implements loops.v1 SamplingService.
type SamplingService struct{ c *Core }

// CreateSampler creates a sampler on a base model or a checkpoint.
func (s SamplingService) CreateSampler(ctx context.Context, req *loopsv1.CreateSamplerRequest) (*loopsv1.Sampler, error) {
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
		return c.createSampler(ctx, ws, req)
	}
	// Retries of one client_seq_id, concurrent ones included, get the first call's sampler.
	var created *loopsv1.Sampler
	id, fresh, err := sess.samplerSeq.once(ctx, req.GetClientSeqId(), func() (string, error) {
		info, err := c.createSampler(ctx, ws, req)
		created = info
		return info.GetId(), err
	})
	if err != nil || fresh {
		return created, err
	}
	st, err := c.samplers.get(ctx, ws, id)
	if err != nil {
		return nil, err
	}
	return st.info, nil
}

// createSampler creates a sampler on a base model or a checkpoint.
func (c *Core) createSampler(ctx context.Context, ws string, req *loopsv1.CreateSamplerRequest) (*loopsv1.Sampler, error) {
	baseModel, modelPath := req.GetBaseModel(), req.GetModelPath()
	var ck *loopsv1.Checkpoint
	var owner, deployment string
	switch {
	case req.GetDeployment() != "":
		if baseModel != "" || modelPath != "" {
			return nil, invalidArgument("give a deployment, or a base_model and model_path, not both")
		}
		var err error
		if ck, owner, deployment, err = c.deploymentCheckpoint(ctx, ws, req.GetDeployment()); err != nil {
			return nil, err
		}
		baseModel, modelPath = ck.GetBaseModel(), ck.GetTinkerPath()
	case req.GetModelPath() != "":
		var err error
		if baseModel, ck, owner, err = c.samplerCheckpoint(ctx, ws, baseModel, modelPath); err != nil {
			return nil, err
		}
	case baseModel == "":
		return nil, invalidArgument("give a base_model or a model_path (tinker://…/sampler_weights/…)")
	}
	ref, err := c.samplerAdapter(ctx, ws, baseModel, ck, owner)
	if err != nil {
		return nil, err
	}
	return c.samplers.create(ctx, ws, req.GetSessionId(), baseModel, modelPath, deployment, "", ref)
}

// samplerCheckpoint resolves the checkpoint modelPath a sampler is asked for (the
// workspace's own or one shared with it) and returns its base model, which must be
// baseModel when that is given too, the checkpoint and its owner.
func (c *Core) samplerCheckpoint(ctx context.Context, ws, baseModel, modelPath string) (string, *loopsv1.Checkpoint, string, error) {
	ck, owner, err := c.resolveOwned(ctx, ws, modelPath)
	if err != nil {
		return "", nil, "", err
	}
	if baseModel != "" && baseModel != ck.GetBaseModel() {
		return "", nil, "", invalidArgument("checkpoint %s was trained on %s, not %s", modelPath, ck.GetBaseModel(), baseModel)
	}
	return ck.GetBaseModel(), ck, owner, nil
}

// samplerAdapter checks that the workspace may sample baseModel and, for a checkpoint
// (ck, of owner), returns its adapter's files (nil for the base model alone).
func (c *Core) samplerAdapter(ctx context.Context, ws, baseModel string, ck *loopsv1.Checkpoint, owner string) (*ckfiles.Ref, error) {
	if _, err := c.model(baseModel); err != nil {
		return nil, err
	}
	if err := c.policy.AllowModel(ws, baseModel); err != nil {
		return nil, err
	}
	if ck == nil {
		return nil, nil
	}
	return c.adapterOf(ctx, owner, ck)
}

// GetSampler returns one sampler.
func (s SamplingService) GetSampler(ctx context.Context, req *loopsv1.GetSamplerRequest) (*loopsv1.Sampler, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.c.samplers.get(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	return st.info, nil
}

// Sample queues a sampling operation. Samples are not ordered; they run as sampler
// capacity frees up, shared fairly between workspaces (samplequeue.go), and past
// Options.MaxQueuedSamples (or Options.MaxQueuedSamplesPerWorkspace of one workspace) new
// ones are refused with ResourceExhausted.
func (s SamplingService) Sample(ctx context.Context, req *loopsv1.SampleRequest) (*loopsv1.Operation, error) {
	return s.sample(ctx, req, nil)
}

// SampleStream is Sample with the sampled tokens also written to sink while the backend
// decodes them (tokenstream.Streamer), for the answers of the inference APIs. The sample is
// queued, scheduled, metered and answered as Sample's; a backend without the ability
// (backends.TokenStreamer) writes nothing to sink, nor does one given a sink that keeps no
// tokens (tokenstream.Watch, for an answer that is not streamed). Once sink is gone the
// backend drops the sample (its operation fails with Canceled), and a sample still queued
// then is failed when its slot comes rather than run.
func (s SamplingService) SampleStream(ctx context.Context, req *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	return s.sample(ctx, req, sink)
}

func (s SamplingService) sample(ctx context.Context, req *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.SeqId != nil {
		if err := checkSeqID(req.GetSeqId()); err != nil {
			return nil, err
		}
	}
	if c.draining() {
		return nil, errShuttingDown()
	}
	var st *samplerState
	if req.GetSamplerId() == "" {
		st, err = c.samplers.sharedSampler(ctx, ws, req.GetBaseModel(), req.GetModelPath())
	} else {
		if req.GetBaseModel() != "" || req.GetModelPath() != "" {
			return nil, invalidArgument("give a sampler_id, or a base_model or model_path (the workspace's shared sampler), not both")
		}
		st, err = c.samplers.get(ctx, ws, req.GetSamplerId())
	}
	if err != nil {
		return nil, err
	}
	model, err := c.model(st.info.GetBaseModel())
	if err != nil {
		return nil, err
	}
	if len(req.GetPromptImages()) > 0 { // before the images are checked against the model
		if err := c.policy.AllowModality(ws, policy.ModalityImage, "the prompt has image chunks"); err != nil {
			return nil, err
		}
	}
	params, err := validate.Sample(model, req, c.opts.MaxSamplesPerRequest)
	if err != nil {
		return nil, err
	}
	if err := c.policy.CheckSample(ws, model.GetName(), req, params); err != nil {
		return nil, err
	}
	if c.anyBudget(ctx, ws) {
		// At most every prompt token and num_samples × max_tokens generated ones (budget.go).
		if err := c.budgetReady(ctx, ws); err != nil {
			return nil, err
		}
		ctx = withEstimate(ctx, c.estimate(ws, model.GetName(), map[string]int64{
			store.UsageSamplingPrefill: int64(len(req.GetPrompt())),
			store.UsageSamplingSample:  int64(max(req.GetNumSamples(), 1)) * int64(params.GetMaxTokens()),
		}))
	}
	if r := c.poolRunOf(st.info.GetModelPath()); r != nil {
		// Its run's dedicated pool samples it: the pool's time ahead is held against that
		// run's workspace's budgets (poollease.go).
		if err := c.holdPool(ctx, r, ""); err != nil {
			return nil, err
		}
	}
	if req.SeqId == nil || st.shared != "" { // a shared sampler has no client to de-duplicate for
		return c.startSample(ctx, ws, st, req, params, sink)
	}
	var started *loopsv1.Operation
	id, fresh, err := st.seen.once(ctx, req.GetSeqId(), func() (string, error) {
		op, err := c.startSample(ctx, ws, st, req, params, sink)
		started = op
		return op.GetId(), err
	})
	if err != nil || fresh {
		return started, err
	}
	o, err := c.ops.lookup(ctx, ws, id) // a retry of a sample already started
	if err != nil {
		return nil, err
	}
	return c.ops.current(o)
}

// startSample creates a sampling operation on sampler st and queues it.
func (c *Core) startSample(ctx context.Context, ws string, st *samplerState, req *loopsv1.SampleRequest, params *loopsv1.SamplingParams, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	if st.info.GetInflightRunId() != "" {
		if err := c.samplers.follow(ctx, st); err != nil {
			return nil, err
		}
	}
	adapter, path, ok := st.holdRef()
	if !ok { // it left memory meanwhile: reload it
		var err error
		if st.shared != "" {
			st, err = c.samplers.sharedSampler(ctx, ws, st.info.GetBaseModel(), st.info.GetModelPath())
		} else {
			st, err = c.samplers.get(ctx, ws, st.info.GetId())
		}
		if err != nil {
			return nil, err
		}
		if adapter, path, ok = st.holdRef(); !ok {
			return nil, unavailable("sampler %s was reloaded and dropped again at once (the server holds too many samplers); retry", st.info.GetId())
		}
	}
	adapterDir, adapterFiles, err := c.ckpt.Source(ctx, adapter)
	if err != nil {
		adapter.Release()
		return nil, err
	}
	if err := c.samplers.queue.reserve(ws); err != nil {
		adapter.Release()
		return nil, err
	}
	o, err := c.ops.create(ctx, ws, loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", st.info.GetId(), req.GetSeqId())
	if err != nil {
		adapter.Release()
		c.samplers.queue.unreserve(ws)
		return nil, err
	}
	poolRun := c.poolRunOf(st.info.GetModelPath())
	breq := &backendv1.SampleRequest{
		BaseModel: st.info.GetBaseModel(), AdapterDir: adapterDir, AdapterFiles: adapterFiles, Prompt: req.GetPrompt(),
		NumSamples: max(req.GetNumSamples(), 1), Params: params,
		PromptLogprobs: req.GetPromptLogprobs(), TopkPromptLogprobs: req.GetTopkPromptLogprobs(),
		TargetPromptTokens: req.GetTargetPromptTokens(), PromptAltTokensK: req.GetPromptAltTokensK(),
		Workspace: ws, Embed: req.GetEmbed(),
		PromptImages: req.GetPromptImages(),
	}
	job := &sampleJob{o: o, session: st.info.GetSessionId(), deployment: deploymentUsage(st.info.GetDeployment()), req: breq, sink: sink, adapter: adapter,
		lastN: int(req.GetPromptLogprobsLastN()), modelPath: path, queued: c.now()}
	if poolRun != nil {
		breq.Pool, job.poolRun = poolRun.Pool(), poolRun.ID()
	}
	if breq.Embed { // an embedding samples nothing
		breq.Params, breq.NumSamples = nil, 0
	}
	job.cost = sampleCost(breq)
	if !c.samplers.queue.push(job) {
		adapter.Release()
		c.ops.finish(o, nil, errShuttingDown()) // a shutdown began meanwhile
	}
	return c.ops.current(o) // the sample may have finished already
}

// runSample runs a sampling operation on a sampler slot the queue gave it.
func (c *Core) runSample(j *sampleJob) {
	defer j.adapter.Release()
	o, session, req := j.o, j.session, j.req
	if err := c.poolRefusal(j.poolRun); err != nil {
		c.ops.finish(o, nil, err) // the dedicated pool that samples it was stopped at a budget
		return
	}
	// One of the workspace's sampling slots: the queue starts no more of a workspace's
	// samples than its sampling_concurrency, so this never waits; it keeps the count.
	defer c.policy.AcquireSample(c.ctx, o.workspace)()
	var (
		resp *backendv1.SampleResponse
		err  error
	)
	c.metrics.sampleBatch.Observe(float64(c.metrics.samplesRunning.Add(1)))
	start, began := time.Now(), c.now()
	ctx, span := startBackendSpan(c.ctx, o)
	var firstToken *firstTokenSink
	if j.sink != nil {
		firstToken = &firstTokenSink{Sink: j.sink, first: func() {
			source := sourceSampler
			if j.deployment != "" {
				source = sourceDeployment
			}
			c.metrics.firstToken.WithLabelValues(source).Observe(c.now().Sub(j.queued).Seconds())
		}}
		resp, err = c.sampleStream(ctx, j, firstToken)
	} else {
		c.ops.setRunning(o)
		resp, err = c.backend.Sampler().Sample(ctx, req)
	}
	c.metrics.samplesRunning.Add(-1)
	c.samplers.queue.observe(time.Since(start))
	c.ops.noteBackend(o, began, c.now(), 0)
	if span != nil {
		o.span.SetAttributes(genAIRequest(req)...)
		if err == nil {
			o.span.SetAttributes(genAIResponse(resp, firstToken.after(o.snapshot().GetCreateTime().AsTime()))...)
		}
	}
	endSpan(span, err)
	if err == nil {
		err = checkTopLogprobs(req, resp)
	}
	if err == nil {
		err = checkPromptExtras(req, resp)
	}
	if err == nil {
		err = c.checkEmbedding(req, resp)
	}
	if err == nil {
		keepLastN(resp.GetResult(), j.lastN)
		resp.GetResult().ModelPath = j.modelPath
	}
	// What to meter: a sample that succeeded, its prompt and every generated token; a
	// stream that ended early (the client went away, the backend failed) once the backend
	// had it, its prompt and every token it sent, since every token that left the server
	// is metered.
	metered, generated := err == nil, int64(0)
	if err == nil {
		for _, seq := range resp.GetResult().GetSequences() {
			generated += int64(len(seq.GetTokens()))
		}
	} else if firstToken != nil && firstToken.started.Load() {
		metered, generated = true, firstToken.sent.Load()
	}
	if metered {
		prompt := int64(len(req.GetPrompt()))
		// cached: the prompt tokens the backend served from its prefix cache (never more
		// than the prompt, whatever a backend says)
		cached := min(max(int64(resp.GetResult().GetPromptCachedTokens()), 0), prompt)
		c.metrics.tokens.WithLabelValues("sample_prompt").Add(float64(prompt))
		c.metrics.tokens.WithLabelValues("sample_prompt_cached").Add(float64(cached))
		c.metrics.tokens.WithLabelValues("sample_output").Add(float64(generated))
		if j.deployment != "" {
			c.metrics.deploymentTokens.WithLabelValues("prompt").Add(float64(prompt))
			c.metrics.deploymentTokens.WithLabelValues("output").Add(float64(generated))
		}
		c.recordOpUsage(o, o.workspace, req.GetBaseModel(), session, j.deployment, store.UsageSamplingPrefill, prompt-cached)
		if cached > 0 {
			c.recordOpUsage(o, o.workspace, req.GetBaseModel(), session, j.deployment, store.UsageSamplingCachedPrefill, cached)
		}
		c.recordOpUsage(o, o.workspace, req.GetBaseModel(), session, j.deployment, store.UsageSamplingSample, generated)
	}
	c.ops.finish(o, func(op *loopsv1.Operation) {
		op.Result = &loopsv1.Operation_Sample{Sample: resp.GetResult()}
	}, err)
}

// checkTopLogprobs fails a sample that asked for top_logprobs and came back without them
// (a backend that does not compute them, such as a worker sampling with vLLM) rather than
// answering it silently without.
func checkTopLogprobs(req *backendv1.SampleRequest, resp *backendv1.SampleResponse) error {
	if req.GetParams().GetTopLogprobs() == 0 {
		return nil
	}
	for _, seq := range resp.GetResult().GetSequences() {
		if len(seq.GetTokens()) > 0 && seq.GetTopLogprobs() == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New(
				"the backend serving this model does not return top_logprobs (Tinker: topk_sample_logprobs; the reference engine and the torch worker's transformers sampler do): ask without them"))
		}
	}
	return nil
}

// checkPromptExtras fails a sample that asked for target_prompt_logprobs or
// prompt_alt_tokens and came back without them in full (a backend that does not compute
// them, such as a worker sampling with vLLM) rather than answering it silently without.
func checkPromptExtras(req *backendv1.SampleRequest, resp *backendv1.SampleResponse) error {
	r := resp.GetResult()
	if t := req.GetTargetPromptTokens(); t != nil {
		got := r.GetTargetPromptLogprobs()
		if got.GetK() != t.GetK() || len(got.GetLogprobs()) != len(t.GetTokenIds()) {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New(
				"the backend serving this model does not return target_prompt_logprobs (the reference engine and the torch worker's transformers sampler do): ask without them"))
		}
		got.Sparse = t.GetSparse()
	}
	if k := req.GetPromptAltTokensK(); k > 0 {
		alt := r.GetPromptAltTokens()
		want := (len(req.GetPrompt()) - 1) * int(k)
		if alt.GetK() != k || len(alt.GetTokenIds()) != want || len(alt.GetLogprobs()) != want {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New(
				"the backend serving this model does not return prompt_alt_tokens (the reference engine and the torch worker's transformers sampler do): ask without them"))
		}
	}
	return nil
}

// keepLastN applies prompt_logprobs_last_n n > 0 to a result: the prompt log-probs before
// the last n prompt tokens become NaN and their top-k rows empty (token 0, log-prob
// -99999), as if never scored. The engine scored them (the cost of a prefix is not saved);
// what is returned is what Tinker returns.
func keepLastN(r *loopsv1.SampleResult, n int) {
	if n <= 0 || r == nil {
		return
	}
	if lp := r.GetPromptLogprobs(); len(lp) > n {
		for i := range lp[:len(lp)-n] {
			lp[i] = float32(math.NaN())
		}
	}
	if tk := r.GetTopkPromptLogprobs(); tk != nil && int(tk.GetLength()) > n {
		k := int(tk.GetK())
		cut := (int(tk.GetLength()) - n) * k
		ids, lps := tk.GetTokenIds(), tk.GetLogprobs()
		for i := 0; i < cut && i < len(ids) && i < len(lps); i++ {
			ids[i], lps[i] = 0, -99999
		}
	}
}

// sampleStream runs a sample that has a sink: nothing when its client left while it
// waited, on the backend's TokenStreamer when it has one and the sink keeps tokens, and as
// a plain sample otherwise; in every case the backend's context ends when the sink is gone
// (its client left), so the sample stops rather than decoding for nobody.
//
// ft, when set, wraps the sink to note when the first token came (the time to first token
// of the metrics and of its span).
func (c *Core) sampleStream(ctx context.Context, j *sampleJob, ft *firstTokenSink) (*backendv1.SampleResponse, error) {
	select {
	case <-j.sink.Gone():
		return nil, connect.NewError(connect.CodeCanceled, errors.New("the client went away before the sample started"))
	default:
	}
	c.ops.setRunning(j.o)
	if ft != nil {
		ft.started.Store(true)
	}
	ctx, cancel := tokenstream.CancelOnGone(ctx, j.sink)
	defer cancel()
	if ts, ok := c.backend.Sampler().(backends.TokenStreamer); ok && !tokenstream.Discards(j.sink) {
		var sink tokenstream.Sink = j.sink
		if ft != nil {
			sink = ft
		}
		return ts.SampleStream(ctx, j.req, sink)
	}
	return c.backend.Sampler().Sample(ctx, j.req)
}

// ModelService implements loops.v1 ModelService.
type ModelService struct{ c *Core }

// ListModels lists the served base models.
func (s ModelService) ListModels(ctx context.Context, _ *loopsv1.ListModelsRequest) (*loopsv1.ListModelsResponse, error) {
	if _, err := auth.RequireWorkspace(ctx); err != nil {
		return nil, err
	}
	out := &loopsv1.ListModelsResponse{}
	for _, name := range slices.Sorted(maps.Keys(s.c.models)) {
		out.Models = append(out.Models, s.c.models[name])
	}
	out.Models = s.c.policy.Models(auth.Workspace(ctx), out.Models) // the workspace's models and limits
	return out, nil
}

// checkEmbedding fails an embedding (SampleRequest.embed) that came back without one (a
// backend that does not compute hidden states) rather than answering it empty.
func (c *Core) checkEmbedding(req *backendv1.SampleRequest, resp *backendv1.SampleResponse) error {
	if !req.GetEmbed() {
		return nil
	}
	if len(resp.GetResult().GetEmbedding()) == 0 || len(resp.GetResult().GetSequences()) != 0 {
		backend := "this backend"
		if m, err := c.model(req.GetBaseModel()); err == nil && m.GetBackend() != "" {
			backend = "the " + m.GetBackend() + " backend"
		}
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"%s serving %s does not compute embeddings (the reference engine and the torch worker's transformers sampler do; a worker sampling with vLLM does not): serve the model on one of those to embed with it", backend, req.GetBaseModel()))
	}
	return nil
}
