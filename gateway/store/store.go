package store

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// ErrNotFound is returned by every Get, Delete and Update method when no record with that id
// exists in the given workspace.
var ErrNotFound = errors.New("store: not found")

// Limits of a Page.
const (
	// DefaultPageLimit is the size of a page whose Limit is not positive.
	DefaultPageLimit = 100
	// MaxPageLimit is the largest page a list returns.
	MaxPageLimit = 1000
)

// Page selects a window of a list: Limit <= 0 means 100, a Limit above 1000 means 1000, and
// a negative Offset means 0. With After set the window starts after that position (keyset
// paging: the cost of a page does not grow with its depth) and Offset counts from there. The
// total count a list returns is always that of the whole list.
type Page struct {
	Limit  int
	Offset int
	// After is the position of the last record of the previous page (see CursorOf); nil
	// starts at the newest record.
	After *Cursor
}

// Cursor is a position in a list. Lists are ordered by create_time, then (checkpoints of
// every run) training_run_id, then id, all descending; a list with Page.After returns the
// records strictly after the cursor in that order. TrainingRunID is used only by
// ListCheckpoints across runs.
type Cursor struct {
	CreateTime    time.Time
	TrainingRunID string
	ID            string
}

// CursorOf returns the position of a listed record (a session, training run or checkpoint),
// for the next page's Page.After.
func CursorOf(m interface {
	GetCreateTime() *timestamppb.Timestamp
	GetId() string
}) *Cursor {
	c := &Cursor{CreateTime: m.GetCreateTime().AsTime(), ID: m.GetId()}
	if ck, ok := m.(interface{ GetTrainingRunId() string }); ok {
		c.TrainingRunID = ck.GetTrainingRunId()
	}
	return c
}

// Store keeps what must survive a restart: sessions, training runs, checkpoints, samplers and
// operations. Every record belongs to one workspace (the API key's); a lookup with another
// workspace returns ErrNotFound; GetCheckpointAnyWorkspace is the one lookup across
// workspaces. Ids are unique across workspaces (checkpoint ids within their training run): a
// Put with an id that another workspace owns fails, with an error other than ErrNotFound, and
// changes nothing. A Put needs a non-empty id (and training_run_id for checkpoints).
// Lists are newest first: by create_time descending, then by id descending. Stores keep their
// own copies: messages passed in and returned may be modified by the caller afterwards.
// Implementations are safe for concurrent use.
//
// Every write (each method that changes records) of a store given a Fence checks it
// inside its own transaction and fails with ErrFenced, changing nothing, once the fence's
// lease is no longer held (see Fencer).
//
// Store is the union of the small interfaces below; a consumer should depend on the ones it
// uses (the write-behind persister on a BatchWriter, the run registry on a RunReader, …), so
// that what it may do to the records is written in its type.
type Store interface {
	SessionStore
	RunReader
	RunWriter
	CheckpointStore
	SamplerStore
	OperationStore
	BatchWriter
	StepMetricsReader
	ReceiptReader
	UsageStore
	DeploymentStore
	JobStore
	ProjectStore
	KeyStore
	AuditStore
	BudgetAlertStore
	CheckpointStorageReader
	WeightsAccessStore
	AccessStore
	EvalStore
	TraceReader
	Fencer

	// Close releases the store's resources.
	Close() error
}

// SessionStore keeps sessions.
type SessionStore interface {
	// PutSession inserts or replaces a session.
	PutSession(ctx context.Context, workspace string, s *loopsv1.Session) error
	// GetSession returns a session of the workspace.
	GetSession(ctx context.Context, workspace, id string) (*loopsv1.Session, error)
	// ListSessions lists the workspace's sessions and the total count.
	ListSessions(ctx context.Context, workspace string, page Page) ([]*loopsv1.Session, int64, error)
}

// RunReader reads training runs: what the run registry needs to find a run that is not in
// memory, and recovery at start-up to find them all.
type RunReader interface {
	// GetTrainingRun returns a training run of the workspace.
	GetTrainingRun(ctx context.Context, workspace, id string) (*loopsv1.TrainingRun, error)
	// ListTrainingRuns lists the workspace's training runs and the total count.
	ListTrainingRuns(ctx context.Context, workspace string, page Page) ([]*loopsv1.TrainingRun, int64, error)
	// ListAllTrainingRuns lists every run of every workspace (for recovery at start-up).
	ListAllTrainingRuns(ctx context.Context) ([]OwnedTrainingRun, error)
	// ListSessionTrainingRuns lists the training runs of one session of the workspace,
	// oldest first (one query; a session holds at most the core's MaxRunsPerSession).
	ListSessionTrainingRuns(ctx context.Context, workspace, sessionID string) ([]*loopsv1.TrainingRun, error)
}

// RunWriter writes one training run outside a batch (a run's creation; its later bookkeeping
// goes through a BatchWriter).
type RunWriter interface {
	// PutTrainingRun inserts or replaces a training run.
	PutTrainingRun(ctx context.Context, workspace string, r *loopsv1.TrainingRun) error
}

// CheckpointStore keeps checkpoint records (their weights are in a checkpoint store).
type CheckpointStore interface {
	// PutCheckpoint inserts or replaces a checkpoint, keyed by (training_run_id, id).
	PutCheckpoint(ctx context.Context, workspace string, c *loopsv1.Checkpoint) error
	// GetCheckpoint returns a checkpoint of the workspace by run and checkpoint id.
	GetCheckpoint(ctx context.Context, workspace, runID, checkpointID string) (*loopsv1.Checkpoint, error)
	// GetCheckpointAnyWorkspace returns a checkpoint and its owner's workspace, whoever owns
	// it; callers must check ownership or that it is public.
	GetCheckpointAnyWorkspace(ctx context.Context, runID, checkpointID string) (*loopsv1.Checkpoint, string, error)
	// ListCheckpoints lists the workspace's checkpoints, of one run when runID is not empty,
	// and the total count.
	ListCheckpoints(ctx context.Context, workspace, runID string, page Page) ([]*loopsv1.Checkpoint, int64, error)
	// DeleteCheckpoint removes a checkpoint record.
	DeleteCheckpoint(ctx context.Context, workspace, runID, checkpointID string) error
	// ListExpiredCheckpoints lists checkpoints of all workspaces whose expire_time is set and
	// before now.
	ListExpiredCheckpoints(ctx context.Context, now time.Time) ([]OwnedCheckpoint, error)
}

// SamplerStore keeps samplers.
type SamplerStore interface {
	// PutSampler inserts or replaces a sampler.
	PutSampler(ctx context.Context, workspace string, s *loopsv1.Sampler) error
	// GetSampler returns a sampler of the workspace.
	GetSampler(ctx context.Context, workspace, id string) (*loopsv1.Sampler, error)
}

// OperationStore keeps operations one at a time, and fails or removes them in bulk.
type OperationStore interface {
	// PutOperation inserts or replaces an operation.
	PutOperation(ctx context.Context, workspace string, op *loopsv1.Operation) error
	// GetOperation returns an operation of the workspace.
	GetOperation(ctx context.Context, workspace, id string) (*loopsv1.Operation, error)
	// FailUnfinishedOperations marks every operation that is not done as failed with the
	// given error (called at start-up: work in flight at a crash is never lost silently) and
	// returns how many it changed. The stored operation itself changes: its state becomes
	// OPERATION_STATE_FAILED, its error e and its done_time now.
	FailUnfinishedOperations(ctx context.Context, e *loopsv1.OperationError, now time.Time) (int, error)
	// DeleteOperationsDoneBefore removes finished (succeeded or failed) operations whose
	// done_time is before t and returns how many it removed; operations without a done_time
	// are kept.
	DeleteOperationsDoneBefore(ctx context.Context, t time.Time) (int, error)
}

// BatchWriter commits groups of records at once: what the core's write-behind persister
// needs (a single record is a batch of one).
type BatchWriter interface {
	// ApplyBatch writes every record of b in one transaction: all of them or, when it
	// returns an error, none. Each record is written as by its Put method (PutTrainingRun,
	// PutOperation), with the same rules; a record that its Put would refuse (a missing id,
	// an id another workspace owns) fails the whole batch. An empty batch succeeds. When a
	// record appears twice, the later one wins. Training runs are written before
	// operations, and step metrics last: a step metrics record replaces the run's record
	// with the same seq_id, is dropped when a merged record already covers its seq_id, and
	// a run left with more than MaxStepMetricsPerRun records is downsampled
	// (CompactStepMetrics); receipt steps are written after the operations. It is how the
	// core's write-behind persister commits a group of writes. A batch refused by the fence fails with ErrFenced: it was not committed, and
	// retrying it cannot succeed.
	ApplyBatch(ctx context.Context, b Batch) error
}

// StepMetricsReader reads the step metrics that batches write.
type StepMetricsReader interface {
	// ListStepMetrics lists the run's step metrics records (written by ApplyBatch), oldest
	// first (by seq_id), those whose steps overlap [fromStep, toStep] (0: no bound). A run
	// of another workspace has none. At most MaxStepMetricsPerRun records are kept per run
	// (see CompactStepMetrics).
	ListStepMetrics(ctx context.Context, workspace, runID string, fromStep, toStep int64) ([]*loopsv1.StepMetrics, error)
}

// ReceiptReader reads the receipt steps that batches write (docs/receipts.md).
type ReceiptReader interface {
	// ListReceiptSteps lists at most limit (1 to MaxPageLimit; other values mean
	// MaxPageLimit) of the run's receipt steps with seq_id >= fromSeq, in seq_id order, and
	// the count of all the run's steps. A run of another workspace has none.
	ListReceiptSteps(ctx context.Context, workspace, runID string, fromSeq int64, limit int) ([]*loopsv1.ReceiptStep, int64, error)
}

// UsageStore keeps the hourly usage counters.
type UsageStore interface {
	// AddUsage adds u.Amount to the workspace's usage row keyed by (u.BucketStart,
	// u.BaseModel, u.SessionID, u.RunID, u.Deployment, u.KeyID, u.Kind), creating the row
	// when there is none. BucketStart is
	// stored as given (callers truncate it to the hour, in UTC).
	AddUsage(ctx context.Context, workspace string, u UsageRecord) error
	// ListUsage lists the workspace's usage rows with from <= BucketStart < to, ordered by
	// BucketStart, then Kind, then BaseModel, then SessionID, then RunID, then Deployment,
	// then KeyID. Times come back in UTC.
	ListUsage(ctx context.Context, workspace string, from, to time.Time) ([]UsageRecord, error)
	// UsageCost sums the Cost of the workspace's usage rows with from <= BucketStart < to,
	// in pico-dollars (an error when the sum overflows an int64).
	UsageCost(ctx context.Context, workspace string, from, to time.Time) (int64, error)
	// KeyUsageCost is UsageCost of the rows of one API key (UsageRecord.KeyID) only.
	KeyUsageCost(ctx context.Context, workspace, keyID string, from, to time.Time) (int64, error)
}

// Pinger is implemented by stores that can check that their database answers, for the
// server's health check: Ping runs a trivial query within ctx's deadline.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Usage kinds: what a UsageRecord's Amount counts.
const (
	// UsageTraining counts tokens of forward and forward_backward (and forward-only) items.
	UsageTraining = "training"
	// UsageSamplingPrefill counts prompt tokens of sample requests (once per request),
	// less those served from a prefix cache.
	UsageSamplingPrefill = "sampling_prefill"
	// UsageSamplingCachedPrefill counts prompt tokens of sample requests served from the
	// engine's prefix cache (SampleResult.prompt_cached_tokens).
	UsageSamplingCachedPrefill = "sampling_cached_prefill"
	// UsageSamplingSample counts generated tokens (summed over a request's sequences).
	UsageSamplingSample = "sampling_sample"
	// UsageCheckpoint counts checkpoint saves.
	UsageCheckpoint = "checkpoint"
	// UsageDedicatedReplicaSeconds counts the seconds the replicas of a workspace's
	// dedicated pools ran bound to its runs (summed over replicas).
	UsageDedicatedReplicaSeconds = "dedicated_replica_seconds"
	// UsageDedicatedGPUSeconds is the same times the GPUs per replica.
	UsageDedicatedGPUSeconds = "dedicated_gpu_seconds"
	// UsageCheckpointByteSeconds counts the bytes of a session's checkpoints held over time
	// (byte-seconds: bytes held × seconds held, integrated over each hour), priced per
	// GB-month.
	UsageCheckpointByteSeconds = "checkpoint_byte_seconds"
)

// UsageRecord is one usage counter: Amount of Kind (one of the Usage* constants) for a base
// model, session, run and deployment in the hour bucket starting at BucketStart (UTC).
type UsageRecord struct {
	BucketStart time.Time
	BaseModel   string
	SessionID   string
	// RunID is the training run whose usage it is, for the kinds metered per run
	// (checkpoint storage, dedicated pool time); empty for the others, and for rows metered
	// before migration 0015, which count the whole session.
	RunID string
	// Deployment is the deployment sampled ("[<owner>:]<name>"), empty for other usage.
	Deployment string
	// KeyID is the API key whose request did the work (auth.KeyIDOf), empty for usage no
	// request did (dedicated pool time, usage from before keys were recorded).
	KeyID  string
	Kind   string
	Amount int64
	// PricedAmount is the part of Amount metered under a price sheet that priced it, and
	// Cost what it cost in pico-dollars (1e-12 USD; gateway/prices.USD): AddUsage adds
	// both. PricedAmount 0 means no cost is known (no price), never a free one.
	PricedAmount int64
	Cost         int64
}

// Batch is a group of writes that ApplyBatch commits together.
type Batch struct {
	TrainingRuns []OwnedTrainingRun
	Operations   []OwnedOperation
	StepMetrics  []OwnedStepMetrics
	ReceiptSteps []OwnedReceiptStep
}

// Len is the number of records in the batch.
func (b Batch) Len() int {
	return len(b.TrainingRuns) + len(b.Operations) + len(b.StepMetrics) + len(b.ReceiptSteps)
}

// OwnedReceiptStep is one receipt step of a training run (its training_run_id and seq_id
// key it; a step stored with the same ones is replaced), with its workspace.
type OwnedReceiptStep struct {
	Workspace string
	Step      *loopsv1.ReceiptStep
}

// OwnedStepMetrics is one step metrics record of a training run, with its workspace.
type OwnedStepMetrics struct {
	Workspace string
	RunID     string
	Metrics   *loopsv1.StepMetrics
}

// OwnedOperation is an operation with its workspace.
type OwnedOperation struct {
	Workspace string
	Operation *loopsv1.Operation
}

// OwnedTrainingRun is a training run with its workspace.
type OwnedTrainingRun struct {
	Workspace string
	Run       *loopsv1.TrainingRun
}

// OwnedCheckpoint is a checkpoint with its workspace.
type OwnedCheckpoint struct {
	Workspace  string
	Checkpoint *loopsv1.Checkpoint
}
