package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/adapterslots"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/core/fairness"
	"github.com/loops-dev/loops/gateway/core/placement"
	"github.com/loops-dev/loops/gateway/core/trainrun"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/lifecycle"
	"github.com/loops-dev/loops/internal/lockorder"
	"github.com/loops-dev/loops/internal/replicaplan"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/telemetry"
	"github.com/prometheus/client_golang/prometheus"
)

// spillFolder is where the slot table offloads adapters, under the data dir.
const spillFolder = "spill"

// Options configure the core. Zero values take the documented defaults.
type Options struct {
	// DataDir holds the local checkpoint store (DataDir/checkpoint-store, unless
	// CheckpointStore is set), the staging folder of checkpoint saves and the cache of
	// checkpoints read from a remote store.
	DataDir string
	// CheckpointStore keeps the checkpoints' files (default: the local folder
	// DataDir/checkpoint-store); see package ckfiles.
	CheckpointStore ckstore.Store
	// CheckpointCacheBytes bounds the local copies of a remote checkpoint store's
	// checkpoints that no reader holds (default DefaultCheckpointCacheBytes, 20 GiB).
	CheckpointCacheBytes int64
	// CheckpointSweepGrace is how old a checkpoint generation or upload that no record
	// references must be before the store sweep deletes it (default 1 h); it must exceed
	// the longest save, of this gateway or another one on the same store.
	CheckpointSweepGrace time.Duration
	// SessionTTL is how long a session lives without a heartbeat (default 5 min). When it
	// expires, its runs' adapters are unloaded; saved checkpoints stay.
	SessionTTL time.Duration
	// ResultRetention is how long finished operations stay retrievable (default 24 h).
	ResultRetention time.Duration
	// ResultCacheBytes bounds the memory that large results (forward/backward outputs,
	// sampled sequences) and their wire encodings take (default 512 MiB); the oldest leave
	// first, and asking for one that left answers "result expired".
	ResultCacheBytes int64
	// ResultCacheTTL is how long a large result stays retrievable after it finished
	// (default 1 h), within ResultCacheBytes.
	ResultCacheTTL time.Duration
	// GapTimeout is how long a run waits for a missing seq_id before skipping it (default 10 s).
	GapTimeout time.Duration
	// SweepInterval is how often the janitor expires sessions, samplers and checkpoints and
	// evicts idle runs from memory (default 15 s).
	SweepInterval time.Duration
	// MaxBatchTokens caps the tokens of one backend forward/backward call (default 65536).
	MaxBatchTokens int
	// ChunkTokens is the piece size of forward/backward work (default DefaultChunkTokens): a
	// request of more tokens runs as pieces of whole datums of at most this many tokens (a
	// longer datum is a piece of its own), one per batch, so a big step holds the backend
	// for one piece at a time. The pieces depend on the request alone.
	ChunkTokens int
	// FairnessTarget is the p99 latency inflation a workspace may see (an operation's time
	// from submission to its end over its own service time), the fairness SLO exported on
	// /metrics (package gateway/core/fairness); 0: none.
	FairnessTarget float64
	// LaneConcurrency is how many forward/backward batches of one base model run at once
	// (default DefaultLaneConcurrency); a workspace has at most one of them, so another workspace's work starts
	// on a free one instead of waiting behind a flood's batch.
	LaneConcurrency int
	// MaxDatumsPerRequest caps the datums of one forward_backward request (default 4096).
	MaxDatumsPerRequest int
	// MaxSamplesPerRequest caps num_samples (default 256).
	MaxSamplesPerRequest int
	// MaxQueuedSamples caps sampling operations waiting for the sampler; more are refused with
	// ResourceExhausted (HTTP 429), which the tinker SDK treats as back-pressure (default 10000).
	MaxQueuedSamples int
	// MaxQueuedSamplesPerWorkspace caps one workspace's sampling operations waiting for the
	// sampler, so one workspace cannot fill the whole queue (default MaxQueuedSamples / 4).
	MaxQueuedSamplesPerWorkspace int
	// SamplingConcurrency is how many sampling calls run at once (default 4).
	SamplingConcurrency int
	// ArchiveURLTTL is how long a checkpoint archive URL stays valid (default 15 min).
	ArchiveURLTTL time.Duration
	// BackendDeadlines bound every backend call by its size (backends.Deadlines: by default
	// 2 min + 100 ms per token processed). A call past its deadline fails its operation and
	// the run recovers as after a worker crash.
	BackendDeadlines backends.Deadlines
	// Logger receives the core's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the core's Prometheus metrics (default: none registered).
	Registerer prometheus.Registerer
	// Policy is the workspace policy (nil: no workspace has limits of its own).
	Policy *policy.Policy
	// PolicyFile, when set, is the workspace policy's file (loops serve
	// --workspace-policy): its policy is used in place of Policy, and the core polls the
	// file while it runs and puts each change in force (docs/semantics.md, "Workspace
	// policy"), so an operator raises a budget without a restart.
	PolicyFile *policy.Watcher
	// Prices is the price sheet (nil: no prices, and no costs anywhere); the core polls
	// its file for changes while it runs (docs/operations.md, "Prices").
	Prices *prices.Watcher
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Limits bound what the core holds in memory (limits.go; docs/semantics.md, "Limits").
	Limits Limits
	// PublishAfterCommit publishes an outcome only once it is committed to the store,
	// instead of once it is in the journal on this host's disk (DataDir/journal). Set it
	// when other gateways share the store (PostgreSQL with a standby): the gateway that
	// takes over from a dead one cannot replay that one's journal (docs/two-gateways.md).
	PublishAfterCommit bool
	// TookOver says that this core starts on a gateway that took the leader lease from
	// another one: operations left unfinished are failed with a message that says the
	// gateway failed over, rather than that it restarted.
	TookOver bool
	// RecoverSteps keeps step recovery (recovery.go) for the runs of every base model, not
	// only those the backend places on preemptible replicas (backends.Preemptible).
	RecoverSteps bool
	// Replica is the deployment the catalog's models are planned for (loops serve
	// --device-memory-gib and the pool's gpus_per_replica; internal/replicaplan): each
	// model's devices_per_replica and max_sequence_length (what a replica can hold) come
	// from it, and a model a replica cannot hold stops New. With no device memory
	// configured nor reported by the backend, models are not planned.
	Replica replicaplan.Config
	// RecoveryTimeout bounds how long a run whose replica was lost waits for its adapter to
	// be rebuilt on another one (default 5 min); then its task fails and the run is marked
	// corrupted.
	RecoveryTimeout time.Duration
	// PageTokenKey signs the page tokens of loops.v1 lists (at least 16 bytes). Empty: a
	// key kept in DataDir/page-token.key, drawn on first start, so tokens outlive a
	// restart. Gateways that share a database must share the key.
	PageTokenKey []byte
}

func (o *Options) defaults() {
	if o.SessionTTL <= 0 {
		o.SessionTTL = 5 * time.Minute
	}
	if o.ResultRetention <= 0 {
		o.ResultRetention = 24 * time.Hour
	}
	if o.ResultCacheBytes <= 0 {
		o.ResultCacheBytes = 512 << 20
	}
	if o.ResultCacheTTL <= 0 {
		o.ResultCacheTTL = time.Hour
	}
	if o.GapTimeout <= 0 {
		o.GapTimeout = 10 * time.Second
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = 15 * time.Second
	}
	if o.MaxBatchTokens <= 0 {
		o.MaxBatchTokens = 65536
	}
	if o.ChunkTokens <= 0 {
		o.ChunkTokens = DefaultChunkTokens
	}
	if o.LaneConcurrency <= 0 {
		o.LaneConcurrency = DefaultLaneConcurrency
	}
	if o.MaxDatumsPerRequest <= 0 {
		o.MaxDatumsPerRequest = 4096
	}
	if o.MaxSamplesPerRequest <= 0 {
		o.MaxSamplesPerRequest = semantics.MaxNumSamples
	}
	if o.MaxQueuedSamples <= 0 {
		o.MaxQueuedSamples = 10000
	}
	if o.MaxQueuedSamplesPerWorkspace <= 0 {
		o.MaxQueuedSamplesPerWorkspace = max(o.MaxQueuedSamples/4, 1)
	}
	if o.SamplingConcurrency <= 0 {
		o.SamplingConcurrency = 4
	}
	if o.CheckpointCacheBytes <= 0 {
		o.CheckpointCacheBytes = DefaultCheckpointCacheBytes
	}
	if o.CheckpointSweepGrace <= 0 {
		o.CheckpointSweepGrace = DefaultCheckpointSweepGrace
	}
	if o.RecoveryTimeout <= 0 {
		o.RecoveryTimeout = 5 * time.Minute
	}
	if o.ArchiveURLTTL <= 0 {
		o.ArchiveURLTTL = 15 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Limits.defaults()
}

// Core owns sessions, runs, operations, samplers and checkpoints, and drives the backend.
type Core struct {
	opts Options
	log  *slog.Logger
	// traced: tracing was on when the core was made (telemetry.Enabled), so its
	// operations have spans (otel.go).
	traced  bool
	store   store.Store
	backend backends.Backend
	metrics *metrics

	models map[string]*loopsv1.ModelInfo
	losses map[string]bool

	ops      *operations
	mu       lockorder.Mutex[rankCore]
	runs     *runRegistry
	lanes    map[string]*laneOf
	sessions map[string]*sessionState
	// liveSessions counts each workspace's live sessions, and those being created
	// (reserveSession), for max_sessions_per_workspace.
	liveSessions map[string]int
	samplers     *samplers
	evals        *evalRunner
	retention    retentionState
	archives     *archiveTokens
	traceLinks   *traceLinks
	ckpt         *ckfiles.Files
	// ckSwept is closed when the start-up sweep of the checkpoint store is done.
	ckSwept chan struct{}
	// ckFault, when set (tests only), runs before each step of a checkpoint save or
	// delete (ckStep).
	ckFault func(ckStep) error
	usage   *usageMeter
	// storage integrates checkpoint bytes held over time (storagemeter.go).
	storage *storageMeter
	costs   *costMetric
	budgets *budgetBook
	policy  *policy.Enforcer // workspace limits and current use

	// life owns every goroutine the core starts (lanes and their tasks, snapshots,
	// sampling, the janitor, the placer, store sweeps): none starts once it quiesces (Drain),
	// and Close stops them with its context. ctx is its context.
	life *lifecycle.Stopper
	ctx  context.Context
	// replay bounds the replay logs of all runs together (recovery.go).
	replay *trainrun.ReplayBudget
	// fair watches how fairly the server is shared (queue waits, latency inflation, SLO).
	fair *fairness.Tracker

	// drain is closed when a shutdown starts (Drain); running counts backend calls and
	// sampling goroutines in progress.
	drain     chan struct{}
	stopping  atomic.Bool
	drainOnce sync.Once
	closeOnce sync.Once
	running   *busy

	// slots keeps the backend's adapters within its max_adapters (package adapterslots),
	// offloading them into DataDir/spill.
	slots *adapterslots.Table[*run]
	// pageTokens signs and checks the page tokens of lists (paging.go).
	pageTokens *store.PageTokens
	// placer has the backend place the sampler replicas deployments ask for (package
	// placement).
	placer *placement.Placer
	// liveSnapshots holds the store keys of the step snapshots that are runs' recovery
	// points (recovery.go), which the store sweep keeps.
	liveSnapshots sync.Map
	// preemptible says which base models' replicas may be lost (nil: none).
	preemptible backends.Preemptible
	// dedicatedPools gives runs pools of their own (nil: the backend cannot; dedicated.go).
	dedicatedPools backends.DedicatedPools
}

// New starts a core on a store and a backend. It fails operations left unfinished by a
// previous process, recovers runs from the store and starts the background janitor.
func New(ctx context.Context, st store.Store, be backends.Backend, opts Options) (*Core, error) {
	opts.defaults()
	if opts.DataDir == "" {
		return nil, errors.New("core: DataDir is required")
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("core: creating data dir: %w", err)
	}
	c := &Core{
		opts:         opts,
		log:          opts.Logger,
		traced:       telemetry.Enabled(),
		store:        st,
		backend:      backends.WithDeadlines(backends.Guard(be, opts.Logger), opts.BackendDeadlines),
		metrics:      newMetrics(opts.Registerer),
		fair:         fairness.New(opts.Registerer, opts.FairnessTarget, opts.Now),
		models:       map[string]*loopsv1.ModelInfo{},
		losses:       map[string]bool{},
		lanes:        map[string]*laneOf{},
		sessions:     map[string]*sessionState{},
		liveSessions: map[string]int{},
		archives:     newArchiveTokens(),
		traceLinks:   newTraceLinks(),
		usage:        newUsageMeter(),
		storage:      newStorageMeter(),
		costs:        newCostMetric(opts.Registerer),
		budgets:      newBudgetBook(),
	}
	c.drain, c.running = make(chan struct{}), newBusy()
	c.life = lifecycle.New(ctx)
	c.ctx = c.life.Context()
	c.replay = trainrun.NewReplayBudget(int64(opts.Limits.MaxReplayBytesTotal))
	c.runs = newRunRegistry(c.now, &c.opts.Limits, c.loadRun)
	c.ops = newOperations(c)
	c.samplers = newSamplers(c)
	c.evals = newEvalRunner(c)
	if err := c.openCheckpoints(ctx); err != nil {
		return nil, err
	}
	pageTokens, err := openPageTokens(opts.DataDir, opts.PageTokenKey)
	if err != nil {
		return nil, err
	}
	c.pageTokens = pageTokens

	caps, err := be.Trainer().GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	if err != nil {
		return nil, fmt.Errorf("core: asking the backend for its capabilities: %w", err)
	}
	_, dedicated := be.(backends.DedicatedPools)
	for _, m := range caps.GetModels() {
		m = catalogEntry(m, dedicated) // a clone; planned: its max_sequence_length is what a replica holds
		if _, err := replicaplan.Apply(m, opts.Replica); err != nil {
			return nil, fmt.Errorf("core: %w", err)
		}
		c.models[m.GetName()] = m
	}
	if caps.GetCheckpointUrls() {
		c.ckpt.UseURLs() // the backend reads and writes the store itself, if the store lets it
	}
	c.slots, err = adapterslots.New(adapterslots.Config[*run]{
		Dir: filepath.Join(opts.DataDir, spillFolder), Capacity: int(caps.GetMaxAdapters()), Gradients: caps.GetSavesGradients(),
		Adapters: c.backend.Trainer(), Log: c.log, Scrub: c.ckpt.Scrub, Lost: c.adapterLost,
		Offloaded: c.metrics.slotMoves.WithLabelValues("offload"), Restored: c.metrics.slotMoves.WithLabelValues("restore"),
	})
	if err != nil {
		return nil, err
	}
	for _, l := range caps.GetLossFunctions() {
		c.losses[l] = true
	}
	if len(c.models) == 0 {
		return nil, errors.New("core: the backend serves no models")
	}
	if opts.PolicyFile != nil {
		opts.Policy = opts.PolicyFile.Current()
	}
	if c.policy, err = policy.NewEnforcer(opts.Policy, slices.Sorted(maps.Keys(c.models))); err != nil {
		return nil, err
	}

	n, err := st.FailUnfinishedOperations(ctx, unfinishedError(opts.TookOver), c.now())
	if err != nil {
		return nil, fmt.Errorf("core: failing unfinished operations: %w", err)
	}
	if n > 0 {
		c.log.Warn("operations in flight at the last shutdown were marked failed", slog.Int("count", n))
	}
	if err := c.recoverRuns(ctx); err != nil {
		return nil, err
	}
	scaler, _ := be.(backends.SamplerScaler)
	c.placer = placement.New(scaler, c.log)
	c.preemptible, _ = be.(backends.Preemptible) // the unwrapped backend
	c.dedicatedPools, _ = be.(backends.DedicatedPools)
	if err := c.placer.Load(ctx, st.ListAllDeployments); err != nil {
		return nil, err
	}
	if err := c.life.Go("index-old-sessions", c.indexOldSessions); err != nil {
		return nil, err
	}
	if err := c.life.Go("janitor", c.janitor); err != nil {
		return nil, err
	}
	if opts.Prices != nil {
		if err := c.life.Go("prices", opts.Prices.Run); err != nil {
			return nil, err
		}
	}
	if opts.PolicyFile != nil {
		if err := c.life.Go("workspace policy", c.followPolicy); err != nil {
			return nil, err
		}
	}
	if err := c.life.Go("budget-alerts", c.writeAlerts); err != nil {
		return nil, err
	}
	if err := c.life.Go("placer", c.placer.Run); err != nil {
		return nil, err
	}
	if err := c.life.Go("evals", c.evals.dispatch); err != nil {
		return nil, err
	}
	return c, nil
}

// Close stops the core: it drains (see Drain), cancels what still runs, stops background
// work and writes the usage recorded so far. It is idempotent; call WaitIdle first to let
// running backend calls finish.
func (c *Core) Close() error {
	c.closeOnce.Do(c.close)
	return nil
}

// closeReportAfter is how long Close waits for the core's goroutines before it logs which
// are still running (and goes on waiting: their outcomes must be written).
const closeReportAfter = 30 * time.Second

func (c *Core) close() {
	ctx, cancel := context.WithTimeout(context.Background(), closeReportAfter)
	c.Drain(ctx)
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), closeReportAfter)
	err := c.life.Stop(ctx) // cancels lanes, tasks, sampling, the janitor and the placer
	cancel()
	if err != nil {
		c.log.Error("the core's goroutines did not stop in time; waiting for them", slog.Any("err", err))
		_ = c.life.Wait(context.Background())
	}
	c.ops.close()                           // commit and publish the outcomes still queued
	c.persistSessions(context.Background()) // their last heartbeats
	c.meterStorage(context.Background(), true)
	c.flushUsage(context.Background())
}

func (c *Core) now() time.Time { return c.opts.Now() }

// followPolicy polls the workspace policy's file until ctx ends and puts each change in
// force (putPolicy): new admissions, limits and budgets follow it at once.
func (c *Core) followPolicy(ctx context.Context) { c.opts.PolicyFile.Follow(ctx, c.putPolicy) }

// reloadPolicy puts the policy file's change, if any, in force (followPolicy's round).
func (c *Core) reloadPolicy() { c.opts.PolicyFile.Reload(c.putPolicy) }

// putPolicy puts a changed policy in force; one naming a model this gateway does not serve
// is logged and the one in force kept.
func (c *Core) putPolicy(p *policy.Policy) {
	if err := c.policy.SetPolicy(p); err != nil {
		c.log.Error("workspace policy: the changed file is refused; the policy in force is kept", slog.Any("err", err))
	}
}

// janitor expires sessions and checkpoints, forgets old operations and writes usage.
func (c *Core) janitor(ctx context.Context) {
	t := time.NewTicker(c.opts.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.sweep(ctx)
		}
	}
}

// sweep does one round of the janitor's work.
func (c *Core) sweep(ctx context.Context) {
	now := c.now()
	c.expireSessions(ctx, now)
	c.evictIdleRuns(now)
	c.samplers.expire(now)
	c.expireCheckpoints(ctx, now)
	c.expireWeightsAccessTokens(ctx, now)
	c.maybeSweepStore(ctx, now)
	c.maybeSweepRetention(ctx, now)
	c.ops.evictFinishedBefore(now.Add(-finishedInMemory))
	if _, err := c.store.DeleteOperationsDoneBefore(ctx, now.Add(-c.opts.ResultRetention)); err != nil {
		c.log.Error("deleting old operations", slog.Any("err", err))
	}
	c.archives.sweep(now)
	c.traceLinks.sweep(now)
	c.sweepPools(ctx)
	c.meterStorage(ctx, false)
	c.flushUsage(ctx)
}

// sweepPools is the janitor's round of dedicated pools: meter their time, top up (or stop
// at a budget) their leases, and scale to zero the idle pools of workspaces at a cap.
func (c *Core) sweepPools(ctx context.Context) {
	c.meterPools()
	c.renewLeases(ctx)
	c.zeroPoolsAtCap(ctx)
}

// Services returns the loops.v1 service implementations.
func (c *Core) Services() Services {
	return Services{
		Sessions:    SessionService{c},
		Training:    TrainingService{c},
		Operations:  OperationService{c},
		Checkpoints: CheckpointService{c},
		Sampling:    SamplingService{c},
		Models:      ModelService{c},
		Usage:       UsageService{c},
		Workspace:   WorkspaceService{c},
		Deployments: DeploymentService{c},
		Projects:    ProjectService{c},
		Weights:     WeightsAccessService{c},
		Clients:     SamplerClientService{c},
		Traces:      TraceService{c},
		Receipts:    ReceiptService{c},
		Evals:       EvalService{c},
	}
}

// Services are the core's loops.v1 service implementations.
type Services struct {
	Sessions    SessionService
	Training    TrainingService
	Operations  OperationService
	Checkpoints CheckpointService
	Sampling    SamplingService
	Models      ModelService
	Usage       UsageService
	Workspace   WorkspaceService
	Deployments DeploymentService
	Projects    ProjectService
	Weights     WeightsAccessService
	Clients     SamplerClientService
	Traces      TraceService
	Receipts    ReceiptService
	Evals       EvalService
}
