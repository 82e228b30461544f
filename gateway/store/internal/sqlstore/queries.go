package sqlstore

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Query is a statement and its arguments.
type Query struct {
	SQL  string
	Args []any
}

// Get is a lookup of one record by its key: a Query that selects its data column.
type Get[M proto.Message] struct {
	Query
	// Kind and ID name the record, for errors.
	Kind, ID string
	new      func() M
}

// Decode returns the record of a row's data column, or store.ErrNotFound when there was no
// row (noRows), or err.
func (g Get[M]) Decode(data []byte, noRows bool, err error) (M, error) {
	var zero M
	switch {
	case noRows:
		return zero, fmt.Errorf("store: get %s %s: %w", g.Kind, g.ID, store.ErrNotFound)
	case err != nil:
		return zero, fmt.Errorf("store: get %s %s: %w", g.Kind, g.ID, err)
	}
	m := g.new()
	if err := proto.Unmarshal(data, m); err != nil {
		return zero, fmt.Errorf("store: get %s %s: decode: %w", g.Kind, g.ID, err)
	}
	return m, nil
}

func get[M proto.Message](kind, id string, newMsg func() M, sql string, args ...any) Get[M] {
	return Get[M]{Query: Query{SQL: sql, Args: args}, Kind: kind, ID: id, new: newMsg}
}

// The lookups by key.

func GetSession(workspace, id string) Get[*loopsv1.Session] {
	return get("session", id, NewSession, `SELECT data FROM sessions WHERE id = $1 AND workspace = $2`, id, workspace)
}

func GetTrainingRun(workspace, id string) Get[*loopsv1.TrainingRun] {
	return get("training run", id, NewTrainingRun, `SELECT data FROM training_runs WHERE id = $1 AND workspace = $2`, id, workspace)
}

func GetCheckpoint(workspace, runID, checkpointID string) Get[*loopsv1.Checkpoint] {
	return get("checkpoint", runID+"/"+checkpointID, NewCheckpoint,
		`SELECT data FROM checkpoints WHERE training_run_id = $1 AND id = $2 AND workspace = $3`, runID, checkpointID, workspace)
}

func GetSampler(workspace, id string) Get[*loopsv1.Sampler] {
	return get("sampler", id, NewSampler, `SELECT data FROM samplers WHERE id = $1 AND workspace = $2`, id, workspace)
}

func GetOperation(workspace, id string) Get[*loopsv1.Operation] {
	return get("operation", id, NewOperation, `SELECT data FROM operations WHERE id = $1 AND workspace = $2`, id, workspace)
}

func GetJob(workspace, id string) Get[*loopsv1.Job] {
	return get("job", id, NewJob, `SELECT data FROM jobs WHERE workspace = $1 AND id = $2`, workspace, id)
}

func GetDeployment(workspace, name string) Get[*loopsv1.Deployment] {
	return get("deployment", name, NewDeployment, `SELECT data FROM deployments WHERE workspace = $1 AND name = $2`, workspace, name)
}

// GetCheckpointAnyWorkspace selects the workspace and data of a checkpoint, whoever owns it.
const GetCheckpointAnyWorkspace = `SELECT workspace, data FROM checkpoints WHERE training_run_id = $1 AND id = $2`

// Lists of a workspace (paged: see List).
var (
	ListSessions = ListQuery{
		From:  `SELECT data FROM sessions WHERE workspace = $1`,
		Count: `SELECT count(*) FROM sessions WHERE workspace = $1`,
	}
	ListTrainingRuns = ListQuery{
		From:  `SELECT data FROM training_runs WHERE workspace = $1`,
		Count: `SELECT count(*) FROM training_runs WHERE workspace = $1`,
	}
	// ListCheckpoints lists the workspace's checkpoints of every run.
	ListCheckpoints = ListQuery{
		From:    `SELECT data FROM checkpoints WHERE workspace = $1`,
		Count:   `SELECT count(*) FROM checkpoints WHERE workspace = $1`,
		WithRun: true,
	}
	// ListRunCheckpoints lists the checkpoints of one run ($2) of the workspace.
	ListRunCheckpoints = ListQuery{
		From:  `SELECT data FROM checkpoints WHERE workspace = $1 AND training_run_id = $2`,
		Count: `SELECT count(*) FROM checkpoints WHERE workspace = $1 AND training_run_id = $2`,
	}
)

// Other reads, each selecting (workspace, data) of the records it lists (ScanOwned).
const (
	ListAllTrainingRuns     = `SELECT workspace, data FROM training_runs ORDER BY create_time DESC, id DESC`
	ListSessionTrainingRuns = `SELECT workspace, data FROM training_runs WHERE workspace = $1 AND session_id = $2 ORDER BY create_time, id`
	ListExpiredCheckpoints  = `SELECT workspace, data FROM checkpoints
		WHERE expire_time IS NOT NULL AND expire_time < $1
		ORDER BY create_time DESC, training_run_id DESC, id DESC`
	// ListSessionSamplers and ListOwnerOperations are store.TraceReader's lists (the
	// operations table's training_run_id holds store.OperationOwner).
	ListSessionSamplers = `SELECT workspace, data FROM samplers WHERE workspace = $1 AND session_id = $2 ORDER BY create_time, id LIMIT $3`
	ListOwnerOperations = `SELECT workspace, data FROM operations WHERE workspace = $1 AND training_run_id = $2 ORDER BY create_time DESC, id DESC LIMIT $3`
	ListJobs            = `SELECT workspace, data FROM jobs WHERE workspace = $1 ORDER BY create_time DESC, id DESC LIMIT $2`
	ListDeployments     = `SELECT workspace, data FROM deployments WHERE workspace = $1 ORDER BY name`
	ListAllDeployments  = `SELECT workspace, data FROM deployments WHERE (workspace, name) > ($1, $2)
		ORDER BY workspace, name LIMIT $3`
	ListGrantedDeployments = `SELECT d.workspace, d.data FROM deployment_grants g
		JOIN deployments d ON d.workspace = g.workspace AND d.name = g.deployment
		WHERE g.grantee = $1 ORDER BY d.workspace, d.name`
	// CheckpointDeployments selects the names of the deployments that pin a checkpoint.
	CheckpointDeployments = `SELECT deployment FROM deployment_pins
		WHERE workspace = $1 AND training_run_id = $2 AND checkpoint_id = $3 ORDER BY deployment`
	// ListStepMetrics selects the data of a run's step metrics overlapping a step range.
	ListStepMetrics = `SELECT data FROM step_metrics WHERE run_id = $1 AND workspace = $2 AND last_step >= $3 AND step <= $4
		ORDER BY seq_id`
	// UsageCost sums the costs of the usage rows of a workspace in a time range (ScanInt);
	// an overflow is an error in both databases.
	UsageCost = `SELECT CAST(COALESCE(SUM(cost), 0) AS BIGINT) FROM usage
		WHERE workspace = $1 AND bucket_start >= $2 AND bucket_start < $3`
	// KeyUsageCost sums the costs of the usage rows of one API key of a workspace in a time
	// range (ScanInt), as UsageCost does.
	KeyUsageCost = `SELECT CAST(COALESCE(SUM(cost), 0) AS BIGINT) FROM usage
		WHERE workspace = $1 AND key_id = $2 AND bucket_start >= $3 AND bucket_start < $4`
	// ListUsage selects the usage rows of a workspace in a time range (ScanUsage).
	ListUsage = `SELECT bucket_start, base_model, session_id, kind, amount, deployment, priced_amount, cost, key_id, training_run_id FROM usage
		WHERE workspace = $1 AND bucket_start >= $2 AND bucket_start < $3
		ORDER BY bucket_start, kind, base_model, session_id, training_run_id, deployment, key_id`
)

// Deletes, each of one record of a workspace (none deleted: store.ErrNotFound), or of old
// operations.
const (
	DeleteCheckpoint           = `DELETE FROM checkpoints WHERE training_run_id = $1 AND id = $2 AND workspace = $3`
	DeleteDeployment           = `DELETE FROM deployments WHERE workspace = $1 AND name = $2`
	DeleteJob                  = `DELETE FROM jobs WHERE workspace = $1 AND id = $2`
	DeleteOperationsDoneBefore = `DELETE FROM operations WHERE done AND done_time IS NOT NULL AND done_time < $1`
)

// AddUsage adds to a usage row, creating it when there is none.
func AddUsage(workspace string, u store.UsageRecord) (Query, error) {
	if u.Kind == "" {
		return Query{}, fmt.Errorf("add usage: missing kind")
	}
	return Query{SQL: `INSERT INTO usage (workspace, bucket_start, base_model, session_id, kind, amount, deployment, priced_amount, cost, key_id, training_run_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (workspace, bucket_start, base_model, session_id, training_run_id, deployment, key_id, kind)
		DO UPDATE SET amount = usage.amount + excluded.amount, priced_amount = usage.priced_amount + excluded.priced_amount,
			cost = usage.cost + excluded.cost`,
		Args: []any{workspace, u.BucketStart.UnixNano(), u.BaseModel, u.SessionID, u.Kind, u.Amount, u.Deployment, u.PricedAmount, u.Cost, u.KeyID, u.RunID}}, nil
}

// PutDeployment is the statements that replace a deployment with its pins and grants, to run
// in one transaction.
func PutDeployment(workspace string, d *loopsv1.Deployment, pins []store.CheckpointRef) ([]Query, error) {
	if d == nil || d.GetName() == "" {
		return nil, fmt.Errorf("put deployment: missing name")
	}
	name := d.GetName()
	data, err := proto.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("put deployment %s: encode: %w", name, err)
	}
	qs := []Query{
		{`INSERT INTO deployments (workspace, name, create_time, data) VALUES ($1, $2, $3, $4)
		  ON CONFLICT (workspace, name) DO UPDATE SET create_time = excluded.create_time, data = excluded.data`,
			[]any{workspace, name, Nanos(d.GetCreateTime()), data}},
		{`DELETE FROM deployment_pins WHERE workspace = $1 AND deployment = $2`, []any{workspace, name}},
		{`DELETE FROM deployment_grants WHERE workspace = $1 AND deployment = $2`, []any{workspace, name}},
	}
	for _, p := range pins {
		qs = append(qs, Query{`INSERT INTO deployment_pins (workspace, training_run_id, checkpoint_id, deployment)
			VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, []any{workspace, p.RunID, p.CheckpointID, name}})
	}
	for _, g := range d.GetGrants() {
		qs = append(qs, Query{`INSERT INTO deployment_grants (grantee, workspace, deployment) VALUES ($1, $2, $3)
			ON CONFLICT DO NOTHING`, []any{g, workspace, name}})
	}
	return qs, nil
}

// Constructors of the records' messages.
func NewSession() *loopsv1.Session         { return &loopsv1.Session{} }
func NewTrainingRun() *loopsv1.TrainingRun { return &loopsv1.TrainingRun{} }
func NewCheckpoint() *loopsv1.Checkpoint   { return &loopsv1.Checkpoint{} }
func NewSampler() *loopsv1.Sampler         { return &loopsv1.Sampler{} }
func NewOperation() *loopsv1.Operation     { return &loopsv1.Operation{} }
func NewJob() *loopsv1.Job                 { return &loopsv1.Job{} }
func NewDeployment() *loopsv1.Deployment   { return &loopsv1.Deployment{} }
func NewStepMetrics() *loopsv1.StepMetrics { return &loopsv1.StepMetrics{} }
