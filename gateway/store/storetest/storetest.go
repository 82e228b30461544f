package storetest

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Opener opens the store kept at path. The suite chooses the paths: each test gets a fresh
// one under t.TempDir(), and a test may open the same path again after closing the first
// store, in which case the new store must see everything the first one wrote. Backends that
// do not live in a file may treat path as the name of a database (for example, derive a
// schema name from it); the path's directory exists, the path itself does not. The suite
// closes every store it opens; Opener should fail t when it cannot open one.
type Opener func(t *testing.T, path string) store.Store

// Workspaces used by the suite.
const (
	wsA = "ws-a"
	wsB = "ws-b"
)

// base is the create_time of the suite's first records; later records are newer.
var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// Run runs the contract suite against the stores open returns. Every subtest opens its own
// store, so they are independent of one another.
func Run(t *testing.T, open Opener) {
	t.Helper()
	s := func(name string, fn func(t *testing.T, open func(t *testing.T) store.Store)) {
		t.Run(name, func(t *testing.T) {
			fn(t, func(t *testing.T) store.Store { return openAt(t, open, newPath(t)) })
		})
	}
	s("Sessions", testSessions)
	s("TrainingRuns", testTrainingRuns)
	s("SessionTrainingRuns", testSessionTrainingRuns)
	s("Checkpoints", testCheckpoints)
	s("ExpiredCheckpoints", testExpiredCheckpoints)
	s("Samplers", testSamplers)
	s("Operations", testOperations)
	s("FailUnfinishedOperations", testFailUnfinishedOperations)
	s("DeleteOperationsDoneBefore", testDeleteOperationsDoneBefore)
	s("TraceReader", testTraceReader)
	s("ApplyBatch", testApplyBatch)
	s("Paging", testPaging)
	s("KeysetPaging", testKeysetPaging)
	s("InvalidPut", testInvalidPut)
	s("ForeignID", testForeignID)
	s("Concurrency", testConcurrency)
	s("Usage", testUsage)
	s("UsageWorkspaces", testUsageWorkspaces)
	s("UsageRange", testUsageRange)
	s("StepMetrics", testStepMetrics)
	s("StepMetricsBound", testStepMetricsBound)
	s("Deployments", testDeployments)
	s("DeploymentGrants", testDeploymentGrants)
	s("UsageDeployments", testUsageDeployments)
	s("Jobs", testJobs)
	s("Projects", testProjects)
	s("SearchSessions", testSearchSessions)
	s("ProjectTrainingRuns", testProjectTrainingRuns)
	s("APIKeys", testAPIKeys)
	s("SigningKeys", testSigningKeys)
	s("Audit", testAudit)
	s("AuditRetention", testAuditRetention)
	s("CheckpointStorage", testCheckpointStorage)
	s("BudgetAlerts", testBudgetAlerts)
	s("WeightsAccessTokens", testWeightsAccessTokens)
	s("WeightsAccessTokenLimit", testWeightsAccessTokenLimit)
	s("AccessRequests", testAccessRequests)
	s("WebhookDeliveries", testWebhookDeliveries)
	s("Evals", testEvals)
	t.Run("Reopen", func(t *testing.T) { testReopen(t, open) })
	t.Run("ReceiptSteps", func(t *testing.T) { testReceiptSteps(t, open) })
	t.Run("DeploymentsReopen", func(t *testing.T) { testDeploymentsReopen(t, open) })
	t.Run("FailRunningJobs", func(t *testing.T) { testFailRunningJobs(t, open) })
}

// newPath returns a fresh path in a fresh temporary directory.
func newPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), "loops.db")
}

// openAt opens the store at path and closes it when the test ends.
func openAt(t *testing.T, open Opener, path string) store.Store {
	t.Helper()
	st := open(t, path)
	require.NotNil(t, st)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	return st
}

// ts returns base plus d as a timestamp.
func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(base.Add(d)) }

// requireProtoEqual fails t unless want and got are equal protobuf values (messages or
// slices or structs of them).
func requireProtoEqual(t *testing.T, want, got any) {
	t.Helper()
	require.Empty(t, cmp.Diff(want, got, protocmp.Transform()))
}

// requireNotFound fails t unless err is store.ErrNotFound.
func requireNotFound(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, store.ErrNotFound)
}

func session(id string, created time.Duration) *loopsv1.Session {
	return &loopsv1.Session{
		Id:                id,
		Tags:              []string{"t1", "t2"},
		UserMetadata:      map[string]string{"k": "v"},
		SdkVersion:        "0.1.0",
		ProjectId:         "proj",
		CreateTime:        ts(created),
		LastHeartbeatTime: ts(created + time.Second),
		TrainingRunIds:    []string{"run-" + id},
	}
}

func trainingRun(id string, created time.Duration) *loopsv1.TrainingRun {
	return &loopsv1.TrainingRun{
		Id:           id,
		SessionId:    "sess-1",
		BaseModel:    "base/model",
		Lora:         &loopsv1.LoraConfig{Rank: 8},
		UserMetadata: map[string]string{"k": "v"},
		CreateTime:   ts(created),
		LastCheckpoint: &loopsv1.Checkpoint{
			Id: "ckpt-0", TrainingRunId: id, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING,
		},
		LastSeqId: 7,
	}
}

func checkpoint(runID, id string, created time.Duration) *loopsv1.Checkpoint {
	return &loopsv1.Checkpoint{
		Id:            id,
		TrainingRunId: runID,
		Kind:          loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING,
		Name:          "name-" + id,
		TinkerPath:    "tinker://" + runID + "/weights/" + id,
		SizeBytes:     1234,
		CreateTime:    ts(created),
		BaseModel:     "base/model",
		Lora:          &loopsv1.LoraConfig{Rank: 4},
	}
}

func sampler(id string, created time.Duration) *loopsv1.Sampler {
	return &loopsv1.Sampler{
		Id:         id,
		SessionId:  "sess-1",
		BaseModel:  "base/model",
		ModelPath:  "tinker://run/sampler_weights/x",
		CreateTime: ts(created),
	}
}

func operation(id string, state loopsv1.OperationState, created time.Duration) *loopsv1.Operation {
	op := &loopsv1.Operation{
		Id:            id,
		Kind:          loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS,
		State:         state,
		TrainingRunId: "run-1",
		SeqId:         3,
		CreateTime:    ts(created),
	}
	switch state {
	case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED:
		op.DoneTime = ts(created + time.Minute)
		op.Result = &loopsv1.Operation_SaveWeights{SaveWeights: &loopsv1.SaveWeightsResult{
			Path: "tinker://run-1/weights/x", Checkpoint: checkpoint("run-1", "x", created),
		}}
	case loopsv1.OperationState_OPERATION_STATE_FAILED:
		op.DoneTime = ts(created + time.Minute)
		op.Error = &loopsv1.OperationError{
			Code: 3, Message: "bad input", Category: loopsv1.ErrorCategory_ERROR_CATEGORY_USER,
		}
	case loopsv1.OperationState_OPERATION_STATE_CANCELLED:
		op.DoneTime = ts(created + time.Minute)
		op.CancelTime = ts(created + time.Second)
		op.Error = &loopsv1.OperationError{
			Code: 1, Message: "cancelled by its client", Category: loopsv1.ErrorCategory_ERROR_CATEGORY_USER,
		}
	}
	return op
}

func testSessions(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	_, err := st.GetSession(ctx, wsA, "missing")
	requireNotFound(t, err)

	s1 := session("s1", 0)
	require.NoError(t, st.PutSession(ctx, wsA, s1))
	got, err := st.GetSession(ctx, wsA, "s1")
	require.NoError(t, err)
	requireProtoEqual(t, s1, got)

	// The store keeps its own copy: changing the message after Put or after Get changes
	// nothing stored.
	s1.SdkVersion = "changed"
	got.SdkVersion = "changed too"
	again, err := st.GetSession(ctx, wsA, "s1")
	require.NoError(t, err)
	require.Equal(t, "0.1.0", again.GetSdkVersion())

	// Another workspace sees nothing.
	_, err = st.GetSession(ctx, wsB, "s1")
	requireNotFound(t, err)
	list, total, err := st.ListSessions(ctx, wsB, store.Page{})
	require.NoError(t, err)
	require.Empty(t, list)
	require.Zero(t, total)

	// Replace.
	s1 = session("s1", 0)
	s1.Expired = true
	s1.SamplerIds = []string{"samp-1"}
	s1.Tags = nil
	require.NoError(t, st.PutSession(ctx, wsA, s1))
	got, err = st.GetSession(ctx, wsA, "s1")
	require.NoError(t, err)
	requireProtoEqual(t, s1, got)

	// Newest first; equal create_time falls back to id, descending.
	s2 := session("s2", time.Hour)
	s3 := session("s3", -time.Hour)
	s4 := session("s4", time.Hour)
	for _, s := range []*loopsv1.Session{s2, s3, s4} {
		require.NoError(t, st.PutSession(ctx, wsA, s))
	}
	require.NoError(t, st.PutSession(ctx, wsB, session("b1", 2*time.Hour)))
	list, total, err = st.ListSessions(ctx, wsA, store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 4, total)
	requireProtoEqual(t, []*loopsv1.Session{s4, s2, s1, s3}, list)

	list, total, err = st.ListSessions(ctx, wsA, store.Page{Limit: 2, Offset: 1})
	require.NoError(t, err)
	require.EqualValues(t, 4, total)
	requireProtoEqual(t, []*loopsv1.Session{s2, s1}, list)

	list, total, err = st.ListSessions(ctx, wsA, store.Page{Limit: 2, Offset: 10})
	require.NoError(t, err)
	require.EqualValues(t, 4, total)
	require.Empty(t, list)
}

func testTrainingRuns(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	_, err := st.GetTrainingRun(ctx, wsA, "missing")
	requireNotFound(t, err)
	all, err := st.ListAllTrainingRuns(ctx)
	require.NoError(t, err)
	require.Empty(t, all)

	r1 := trainingRun("r1", 0)
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r1))
	got, err := st.GetTrainingRun(ctx, wsA, "r1")
	require.NoError(t, err)
	requireProtoEqual(t, r1, got)

	_, err = st.GetTrainingRun(ctx, wsB, "r1")
	requireNotFound(t, err)

	// Replace.
	r1.LastSeqId = 42
	r1.Corrupted = true
	r1.LastSamplerCheckpoint = checkpoint("r1", "s", time.Second)
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r1))
	got, err = st.GetTrainingRun(ctx, wsA, "r1")
	require.NoError(t, err)
	requireProtoEqual(t, r1, got)

	r2 := trainingRun("r2", time.Hour)
	r3 := trainingRun("r3", -time.Hour)
	b1 := trainingRun("b1", 30*time.Minute)
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r2))
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r3))
	require.NoError(t, st.PutTrainingRun(ctx, wsB, b1))

	list, total, err := st.ListTrainingRuns(ctx, wsA, store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 3, total)
	requireProtoEqual(t, []*loopsv1.TrainingRun{r2, r1, r3}, list)

	list, total, err = st.ListTrainingRuns(ctx, wsB, store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 1, total)
	requireProtoEqual(t, []*loopsv1.TrainingRun{b1}, list)

	list, total, err = st.ListTrainingRuns(ctx, wsA, store.Page{Limit: 1, Offset: 2})
	require.NoError(t, err)
	require.EqualValues(t, 3, total)
	requireProtoEqual(t, []*loopsv1.TrainingRun{r3}, list)

	all, err = st.ListAllTrainingRuns(ctx)
	require.NoError(t, err)
	requireProtoEqual(t, []store.OwnedTrainingRun{
		{Workspace: wsA, Run: r2},
		{Workspace: wsB, Run: b1},
		{Workspace: wsA, Run: r1},
		{Workspace: wsA, Run: r3},
	}, all)
}

// testSessionTrainingRuns: a session's runs, oldest first, of its workspace only.
func testSessionTrainingRuns(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	runs, err := st.ListSessionTrainingRuns(ctx, wsA, "sess-1")
	require.NoError(t, err)
	require.Empty(t, runs)

	r1, r2, r3 := trainingRun("r1", time.Hour), trainingRun("r2", 0), trainingRun("r3", time.Minute)
	r3.SessionId = "sess-2"
	b1 := trainingRun("b1", 0) // another workspace's run naming the same session id
	for _, r := range []*loopsv1.TrainingRun{r1, r2, r3} {
		require.NoError(t, st.PutTrainingRun(ctx, wsA, r))
	}
	require.NoError(t, st.PutTrainingRun(ctx, wsB, b1))

	runs, err = st.ListSessionTrainingRuns(ctx, wsA, "sess-1")
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.TrainingRun{r2, r1}, runs)
	runs, err = st.ListSessionTrainingRuns(ctx, wsB, "sess-1")
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.TrainingRun{b1}, runs)
	runs, err = st.ListSessionTrainingRuns(ctx, wsB, "sess-2")
	require.NoError(t, err)
	require.Empty(t, runs)
}

func testCheckpoints(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	_, err := st.GetCheckpoint(ctx, wsA, "r1", "missing")
	requireNotFound(t, err)
	_, _, err = st.GetCheckpointAnyWorkspace(ctx, "r1", "missing")
	requireNotFound(t, err)
	requireNotFound(t, st.DeleteCheckpoint(ctx, wsA, "r1", "missing"))

	// The same checkpoint id in two runs names two checkpoints.
	c1 := checkpoint("r1", "c1", 0)
	c1other := checkpoint("r2", "c1", time.Minute)
	c2 := checkpoint("r1", "c2", time.Hour)
	c2.Kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER
	c2.Public = true
	c2.ExpireTime = ts(48 * time.Hour)
	c3 := checkpoint("r1", "c3", -time.Hour)
	b1 := checkpoint("rb", "b1", 2*time.Hour)
	for _, c := range []*loopsv1.Checkpoint{c1, c1other, c2, c3} {
		require.NoError(t, st.PutCheckpoint(ctx, wsA, c))
	}
	require.NoError(t, st.PutCheckpoint(ctx, wsB, b1))

	got, err := st.GetCheckpoint(ctx, wsA, "r1", "c1")
	require.NoError(t, err)
	requireProtoEqual(t, c1, got)
	got, err = st.GetCheckpoint(ctx, wsA, "r2", "c1")
	require.NoError(t, err)
	requireProtoEqual(t, c1other, got)
	_, err = st.GetCheckpoint(ctx, wsA, "r3", "c1")
	requireNotFound(t, err)

	// Another workspace: not found, whether public or not, and cannot delete.
	_, err = st.GetCheckpoint(ctx, wsB, "r1", "c1")
	requireNotFound(t, err)
	_, err = st.GetCheckpoint(ctx, wsB, "r1", "c2")
	requireNotFound(t, err)
	requireNotFound(t, st.DeleteCheckpoint(ctx, wsB, "r1", "c1"))

	// Any workspace: returns the owner.
	got, owner, err := st.GetCheckpointAnyWorkspace(ctx, "r1", "c2")
	require.NoError(t, err)
	require.Equal(t, wsA, owner)
	requireProtoEqual(t, c2, got)
	got, owner, err = st.GetCheckpointAnyWorkspace(ctx, "rb", "b1")
	require.NoError(t, err)
	require.Equal(t, wsB, owner)
	requireProtoEqual(t, b1, got)

	// Lists: one run, or every run of the workspace; newest first.
	list, total, err := st.ListCheckpoints(ctx, wsA, "r1", store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 3, total)
	requireProtoEqual(t, []*loopsv1.Checkpoint{c2, c1, c3}, list)
	list, total, err = st.ListCheckpoints(ctx, wsA, "", store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 4, total)
	requireProtoEqual(t, []*loopsv1.Checkpoint{c2, c1other, c1, c3}, list)
	list, total, err = st.ListCheckpoints(ctx, wsA, "", store.Page{Limit: 2, Offset: 1})
	require.NoError(t, err)
	require.EqualValues(t, 4, total)
	requireProtoEqual(t, []*loopsv1.Checkpoint{c1other, c1}, list)
	list, total, err = st.ListCheckpoints(ctx, wsB, "r1", store.Page{})
	require.NoError(t, err)
	require.Zero(t, total)
	require.Empty(t, list)

	// Replace.
	c1.Public = true
	c1.Name = "renamed"
	c1.ExpireTime = ts(time.Hour)
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c1))
	got, err = st.GetCheckpoint(ctx, wsA, "r1", "c1")
	require.NoError(t, err)
	requireProtoEqual(t, c1, got)
	_, total, err = st.ListCheckpoints(ctx, wsA, "r1", store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 3, total)

	// Delete removes that one checkpoint only.
	require.NoError(t, st.DeleteCheckpoint(ctx, wsA, "r1", "c1"))
	_, err = st.GetCheckpoint(ctx, wsA, "r1", "c1")
	requireNotFound(t, err)
	_, _, err = st.GetCheckpointAnyWorkspace(ctx, "r1", "c1")
	requireNotFound(t, err)
	requireNotFound(t, st.DeleteCheckpoint(ctx, wsA, "r1", "c1"))
	got, err = st.GetCheckpoint(ctx, wsA, "r2", "c1")
	require.NoError(t, err)
	requireProtoEqual(t, c1other, got)
	list, total, err = st.ListCheckpoints(ctx, wsA, "r1", store.Page{})
	require.NoError(t, err)
	require.EqualValues(t, 2, total)
	requireProtoEqual(t, []*loopsv1.Checkpoint{c2, c3}, list)
}

func testExpiredCheckpoints(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	now := base.Add(10 * time.Hour)
	expiredA := checkpoint("r1", "old", 0)
	expiredA.ExpireTime = timestamppb.New(now.Add(-time.Hour))
	expiredB := checkpoint("rb", "old", time.Hour)
	expiredB.ExpireTime = timestamppb.New(now.Add(-time.Second))
	later := checkpoint("r1", "later", 2*time.Hour)
	later.ExpireTime = timestamppb.New(now.Add(time.Hour))
	never := checkpoint("r1", "never", 3*time.Hour)
	require.NoError(t, st.PutCheckpoint(ctx, wsA, expiredA))
	require.NoError(t, st.PutCheckpoint(ctx, wsB, expiredB))
	require.NoError(t, st.PutCheckpoint(ctx, wsA, later))
	require.NoError(t, st.PutCheckpoint(ctx, wsA, never))

	got, err := st.ListExpiredCheckpoints(ctx, now)
	require.NoError(t, err)
	requireProtoEqual(t, []store.OwnedCheckpoint{
		{Workspace: wsB, Checkpoint: expiredB},
		{Workspace: wsA, Checkpoint: expiredA},
	}, got)

	got, err = st.ListExpiredCheckpoints(ctx, base)
	require.NoError(t, err)
	require.Empty(t, got)

	// Clearing the expire time, or deleting, takes a checkpoint off the list.
	expiredA.ExpireTime = nil
	require.NoError(t, st.PutCheckpoint(ctx, wsA, expiredA))
	require.NoError(t, st.DeleteCheckpoint(ctx, wsB, "rb", "old"))
	got, err = st.ListExpiredCheckpoints(ctx, now)
	require.NoError(t, err)
	require.Empty(t, got)

	got, err = st.ListExpiredCheckpoints(ctx, now.Add(2*time.Hour))
	require.NoError(t, err)
	requireProtoEqual(t, []store.OwnedCheckpoint{{Workspace: wsA, Checkpoint: later}}, got)
}

func testSamplers(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	_, err := st.GetSampler(ctx, wsA, "missing")
	requireNotFound(t, err)

	s1 := sampler("s1", 0)
	require.NoError(t, st.PutSampler(ctx, wsA, s1))
	got, err := st.GetSampler(ctx, wsA, "s1")
	require.NoError(t, err)
	requireProtoEqual(t, s1, got)
	_, err = st.GetSampler(ctx, wsB, "s1")
	requireNotFound(t, err)

	s1.ModelPath = "tinker://run/sampler_weights/y"
	s1.SessionId = "sess-2"
	require.NoError(t, st.PutSampler(ctx, wsA, s1))
	got, err = st.GetSampler(ctx, wsA, "s1")
	require.NoError(t, err)
	requireProtoEqual(t, s1, got)
}

func testOperations(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	_, err := st.GetOperation(ctx, wsA, "missing")
	requireNotFound(t, err)

	op := operation("op1", loopsv1.OperationState_OPERATION_STATE_PENDING, 0)
	require.NoError(t, st.PutOperation(ctx, wsA, op))
	got, err := st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, op, got)
	_, err = st.GetOperation(ctx, wsB, "op1")
	requireNotFound(t, err)

	// Replace through its life: running, then succeeded with a result.
	op.State = loopsv1.OperationState_OPERATION_STATE_RUNNING
	require.NoError(t, st.PutOperation(ctx, wsA, op))
	got, err = st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, op, got)

	op = operation("op1", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)
	require.NoError(t, st.PutOperation(ctx, wsA, op))
	got, err = st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, op, got)

	failed := operation("op2", loopsv1.OperationState_OPERATION_STATE_FAILED, time.Second)
	require.NoError(t, st.PutOperation(ctx, wsB, failed))
	got, err = st.GetOperation(ctx, wsB, "op2")
	require.NoError(t, err)
	requireProtoEqual(t, failed, got)
}

// testApplyBatch: a batch writes training runs and operations of several workspaces in one
// go, the later of two versions of a record wins, an empty batch is fine, and a batch with
// a record its Put would refuse changes nothing.
func testApplyBatch(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	require.NoError(t, st.ApplyBatch(ctx, store.Batch{}))

	r1 := trainingRun("r1", 0)
	r2 := trainingRun("r2", time.Second)
	pending := operation("op1", loopsv1.OperationState_OPERATION_STATE_PENDING, 0)
	done := operation("op1", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)
	other := operation("op2", loopsv1.OperationState_OPERATION_STATE_FAILED, time.Second)
	b := store.Batch{
		TrainingRuns: []store.OwnedTrainingRun{{Workspace: wsA, Run: r1}, {Workspace: wsB, Run: r2}},
		Operations: []store.OwnedOperation{
			{Workspace: wsA, Operation: pending}, {Workspace: wsA, Operation: done}, {Workspace: wsB, Operation: other},
		},
	}
	require.Equal(t, 5, b.Len())
	require.NoError(t, st.ApplyBatch(ctx, b))
	gotR, err := st.GetTrainingRun(ctx, wsA, "r1")
	require.NoError(t, err)
	requireProtoEqual(t, r1, gotR)
	gotR, err = st.GetTrainingRun(ctx, wsB, "r2")
	require.NoError(t, err)
	requireProtoEqual(t, r2, gotR)
	_, err = st.GetTrainingRun(ctx, wsA, "r2")
	requireNotFound(t, err)
	gotOp, err := st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, done, gotOp) // the later version wins
	gotOp, err = st.GetOperation(ctx, wsB, "op2")
	require.NoError(t, err)
	requireProtoEqual(t, other, gotOp)

	// Updates replace records as Put does; the finished operation counts as done.
	r1.LastSeqId = 7
	n, err := st.FailUnfinishedOperations(ctx, &loopsv1.OperationError{Message: "x"}, base)
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, st.ApplyBatch(ctx, store.Batch{TrainingRuns: []store.OwnedTrainingRun{{Workspace: wsA, Run: r1}}}))
	gotR, err = st.GetTrainingRun(ctx, wsA, "r1")
	require.NoError(t, err)
	require.EqualValues(t, 7, gotR.GetLastSeqId())

	// All or nothing: op1 belongs to wsA, so this batch fails and writes neither record.
	bad := store.Batch{Operations: []store.OwnedOperation{
		{Workspace: wsB, Operation: operation("op3", loopsv1.OperationState_OPERATION_STATE_PENDING, 0)},
		{Workspace: wsB, Operation: operation("op1", loopsv1.OperationState_OPERATION_STATE_FAILED, 0)},
	}}
	err = st.ApplyBatch(ctx, bad)
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrNotFound)
	_, err = st.GetOperation(ctx, wsB, "op3")
	requireNotFound(t, err)
	gotOp, err = st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, done, gotOp)

	// A missing id fails the batch too.
	require.Error(t, st.ApplyBatch(ctx, store.Batch{Operations: []store.OwnedOperation{{Workspace: wsA, Operation: &loopsv1.Operation{}}}}))
	require.Error(t, st.ApplyBatch(ctx, store.Batch{TrainingRuns: []store.OwnedTrainingRun{{Workspace: wsA, Run: &loopsv1.TrainingRun{}}}}))
}

func testFailUnfinishedOperations(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	cause := &loopsv1.OperationError{
		Code: 14, Message: "gateway restarted", Category: loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER,
	}
	now := base.Add(time.Hour)

	n, err := st.FailUnfinishedOperations(ctx, cause, now)
	require.NoError(t, err)
	require.Zero(t, n)

	pending := operation("pending", loopsv1.OperationState_OPERATION_STATE_PENDING, 0)
	running := operation("running", loopsv1.OperationState_OPERATION_STATE_RUNNING, time.Second)
	running.TrainingRunId = "run-b"
	succeeded := operation("succeeded", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 2*time.Second)
	failed := operation("failed", loopsv1.OperationState_OPERATION_STATE_FAILED, 3*time.Second)
	// A cancelled operation is done: a restart leaves it (and its cancel_time) as it is.
	cancelled := operation("cancelled", loopsv1.OperationState_OPERATION_STATE_CANCELLED, 4*time.Second)
	require.NoError(t, st.PutOperation(ctx, wsA, pending))
	require.NoError(t, st.PutOperation(ctx, wsB, running))
	require.NoError(t, st.PutOperation(ctx, wsA, succeeded))
	require.NoError(t, st.PutOperation(ctx, wsA, failed))
	require.NoError(t, st.PutOperation(ctx, wsA, cancelled))

	n, err = st.FailUnfinishedOperations(ctx, cause, now)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	for _, c := range []struct {
		ws string
		op *loopsv1.Operation
	}{{wsA, pending}, {wsB, running}} {
		want := proto.CloneOf(c.op)
		want.State = loopsv1.OperationState_OPERATION_STATE_FAILED
		want.Error = cause
		want.DoneTime = timestamppb.New(now)
		got, err := st.GetOperation(ctx, c.ws, c.op.GetId())
		require.NoError(t, err)
		requireProtoEqual(t, want, got)
	}
	for _, op := range []*loopsv1.Operation{succeeded, failed, cancelled} {
		got, err := st.GetOperation(ctx, wsA, op.GetId())
		require.NoError(t, err)
		requireProtoEqual(t, op, got)
	}

	// They are now done: a second call changes nothing, and they age out like any other
	// finished operation.
	n, err = st.FailUnfinishedOperations(ctx, cause, now.Add(time.Hour))
	require.NoError(t, err)
	require.Zero(t, n)
	deleted, err := st.DeleteOperationsDoneBefore(ctx, now.Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, 5, deleted)
}

func testDeleteOperationsDoneBefore(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	n, err := st.DeleteOperationsDoneBefore(ctx, base.Add(time.Hour))
	require.NoError(t, err)
	require.Zero(t, n)

	// Done at base+1m and base+2m (see operation).
	oldOK := operation("old-ok", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)
	oldFailed := operation("old-failed", loopsv1.OperationState_OPERATION_STATE_FAILED, time.Minute)
	// Done at base+61m.
	recent := operation("recent", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, time.Hour)
	// Not done, however old.
	oldPending := operation("old-pending", loopsv1.OperationState_OPERATION_STATE_PENDING, -time.Hour)
	oldRunning := operation("old-running", loopsv1.OperationState_OPERATION_STATE_RUNNING, -time.Hour)
	require.NoError(t, st.PutOperation(ctx, wsA, oldOK))
	require.NoError(t, st.PutOperation(ctx, wsB, oldFailed))
	require.NoError(t, st.PutOperation(ctx, wsA, recent))
	require.NoError(t, st.PutOperation(ctx, wsA, oldPending))
	require.NoError(t, st.PutOperation(ctx, wsA, oldRunning))

	n, err = st.DeleteOperationsDoneBefore(ctx, base.Add(30*time.Minute))
	require.NoError(t, err)
	require.Equal(t, 2, n)

	_, err = st.GetOperation(ctx, wsA, "old-ok")
	requireNotFound(t, err)
	_, err = st.GetOperation(ctx, wsB, "old-failed")
	requireNotFound(t, err)
	for _, op := range []*loopsv1.Operation{recent, oldPending, oldRunning} {
		got, err := st.GetOperation(ctx, wsA, op.GetId())
		require.NoError(t, err)
		requireProtoEqual(t, op, got)
	}

	n, err = st.DeleteOperationsDoneBefore(ctx, base.Add(30*time.Minute))
	require.NoError(t, err)
	require.Zero(t, n)
}

func testPaging(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	// Limit <= 0 means 100, and a limit above 1000 means 1000.
	const n = 1005
	for i := range n {
		require.NoError(t, st.PutSession(ctx, wsA, &loopsv1.Session{
			Id: fmt.Sprintf("s%04d", i), CreateTime: ts(time.Duration(i) * time.Second),
		}))
	}
	for _, limit := range []int{0, -1} {
		list, total, err := st.ListSessions(ctx, wsA, store.Page{Limit: limit})
		require.NoError(t, err)
		require.EqualValues(t, n, total)
		require.Len(t, list, 100)
		require.Equal(t, "s1004", list[0].GetId())
		require.Equal(t, "s0905", list[99].GetId())
	}
	list, total, err := st.ListSessions(ctx, wsA, store.Page{Limit: 5000})
	require.NoError(t, err)
	require.EqualValues(t, n, total)
	require.Len(t, list, 1000)
	list, total, err = st.ListSessions(ctx, wsA, store.Page{Limit: 1000, Offset: 1000})
	require.NoError(t, err)
	require.EqualValues(t, n, total)
	require.Len(t, list, 5)
	require.Equal(t, "s0004", list[0].GetId())
	require.Equal(t, "s0000", list[4].GetId())

	// Every page in turn covers the whole list exactly once, in order.
	var ids []string
	for off := 0; off < n; off += 97 {
		list, total, err := st.ListSessions(ctx, wsA, store.Page{Limit: 97, Offset: off})
		require.NoError(t, err)
		require.EqualValues(t, n, total)
		for _, s := range list {
			ids = append(ids, s.GetId())
		}
	}
	require.Len(t, ids, n)
	for i, id := range ids {
		require.Equal(t, fmt.Sprintf("s%04d", n-1-i), id)
	}
}

// testKeysetPaging pages with Page.After through lists whose records share create_times
// (and, for checkpoints, ids across runs): every page continues exactly after the previous
// one, and the total is always that of the whole list.
func testKeysetPaging(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	// Three records per create_time; ids sort differently from insertion order.
	const n = 31
	for i := range n {
		created := time.Duration(i/3) * time.Second
		id := fmt.Sprintf("k%02d", (i*7)%n)
		require.NoError(t, st.PutSession(ctx, wsA, &loopsv1.Session{Id: id, CreateTime: ts(created)}))
		require.NoError(t, st.PutTrainingRun(ctx, wsA, &loopsv1.TrainingRun{Id: id, CreateTime: ts(created)}))
		// Each checkpoint id appears in two runs, with the same create_time.
		for _, run := range []string{"run-a", "run-b"} {
			require.NoError(t, st.PutCheckpoint(ctx, wsA, checkpoint(run, id, created)))
		}
	}
	// Records of another workspace never show up.
	require.NoError(t, st.PutSession(ctx, wsB, &loopsv1.Session{Id: "other", CreateTime: ts(0)}))
	require.NoError(t, st.PutCheckpoint(ctx, wsB, checkpoint("run-b2", "k00", 0)))

	type listFn func(page store.Page) ([]*store.Cursor, int64, error)
	lists := map[string]listFn{
		"sessions": func(p store.Page) ([]*store.Cursor, int64, error) {
			l, total, err := st.ListSessions(ctx, wsA, p)
			return cursorsOf(l), total, err
		},
		"training runs": func(p store.Page) ([]*store.Cursor, int64, error) {
			l, total, err := st.ListTrainingRuns(ctx, wsA, p)
			return cursorsOf(l), total, err
		},
		"checkpoints of every run": func(p store.Page) ([]*store.Cursor, int64, error) {
			l, total, err := st.ListCheckpoints(ctx, wsA, "", p)
			return cursorsOf(l), total, err
		},
		"checkpoints of one run": func(p store.Page) ([]*store.Cursor, int64, error) {
			l, total, err := st.ListCheckpoints(ctx, wsA, "run-b", p)
			return cursorsOf(l), total, err
		},
	}
	for name, list := range lists {
		all, total, err := list(store.Page{Limit: 1000})
		require.NoError(t, err, name)
		require.EqualValues(t, len(all), total, name)
		for _, size := range []int{1, 4, 7, len(all), len(all) + 1} {
			var got []*store.Cursor
			var after *store.Cursor
			for {
				page, total, err := list(store.Page{Limit: size, After: after})
				require.NoError(t, err, name)
				require.EqualValues(t, len(all), total, "%s: total of the whole list", name)
				require.LessOrEqual(t, len(page), size, name)
				if len(page) == 0 {
					break
				}
				got = append(got, page...)
				after = page[len(page)-1]
			}
			require.Equal(t, all, got, "%s, pages of %d", name, size)
		}
		// Offset counts from the cursor.
		page, _, err := list(store.Page{Limit: 2, Offset: 3, After: all[4]})
		require.NoError(t, err, name)
		require.Equal(t, all[8:10], page, name)
		// A cursor between records: strictly after its position.
		mid := *all[5]
		mid.ID += "~"
		page, _, err = list(store.Page{Limit: 1, After: &mid})
		require.NoError(t, err, name)
		require.Equal(t, all[5:6], page, "%s: after a position between records", name)
	}
}

// cursorsOf returns the positions of listed records.
func cursorsOf[M interface {
	GetCreateTime() *timestamppb.Timestamp
	GetId() string
}](list []M) []*store.Cursor {
	out := make([]*store.Cursor, 0, len(list))
	for _, m := range list {
		out = append(out, store.CursorOf(m))
	}
	return out
}

func testInvalidPut(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	require.Error(t, st.PutSession(ctx, wsA, &loopsv1.Session{}))
	require.Error(t, st.PutTrainingRun(ctx, wsA, &loopsv1.TrainingRun{}))
	require.Error(t, st.PutCheckpoint(ctx, wsA, &loopsv1.Checkpoint{TrainingRunId: "r1"}))
	require.Error(t, st.PutCheckpoint(ctx, wsA, &loopsv1.Checkpoint{Id: "c1"}))
	require.Error(t, st.PutSampler(ctx, wsA, &loopsv1.Sampler{}))
	require.Error(t, st.PutOperation(ctx, wsA, &loopsv1.Operation{}))
	require.Error(t, st.PutSession(ctx, wsA, nil))
}

// testForeignID checks that a Put with an id another workspace owns fails and leaves the
// owner's record alone.
func testForeignID(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	s := session("s1", 0)
	r := trainingRun("r1", 0)
	c := checkpoint("r1", "c1", 0)
	sa := sampler("sa1", 0)
	op := operation("op1", loopsv1.OperationState_OPERATION_STATE_PENDING, 0)
	require.NoError(t, st.PutSession(ctx, wsA, s))
	require.NoError(t, st.PutTrainingRun(ctx, wsA, r))
	require.NoError(t, st.PutCheckpoint(ctx, wsA, c))
	require.NoError(t, st.PutSampler(ctx, wsA, sa))
	require.NoError(t, st.PutOperation(ctx, wsA, op))

	err := st.PutSession(ctx, wsB, session("s1", time.Hour))
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrNotFound)
	require.Error(t, st.PutTrainingRun(ctx, wsB, trainingRun("r1", time.Hour)))
	require.Error(t, st.PutCheckpoint(ctx, wsB, checkpoint("r1", "c1", time.Hour)))
	require.Error(t, st.PutSampler(ctx, wsB, sampler("sa1", time.Hour)))
	require.Error(t, st.PutOperation(ctx, wsB, operation("op1", loopsv1.OperationState_OPERATION_STATE_FAILED, time.Hour)))

	gotS, err := st.GetSession(ctx, wsA, "s1")
	require.NoError(t, err)
	requireProtoEqual(t, s, gotS)
	gotR, err := st.GetTrainingRun(ctx, wsA, "r1")
	require.NoError(t, err)
	requireProtoEqual(t, r, gotR)
	gotC, owner, err := st.GetCheckpointAnyWorkspace(ctx, "r1", "c1")
	require.NoError(t, err)
	require.Equal(t, wsA, owner)
	requireProtoEqual(t, c, gotC)
	gotSa, err := st.GetSampler(ctx, wsA, "sa1")
	require.NoError(t, err)
	requireProtoEqual(t, sa, gotSa)
	gotOp, err := st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, op, gotOp)
	_, err = st.GetSession(ctx, wsB, "s1")
	requireNotFound(t, err)
}

// testReopen writes every kind of record, closes the store, opens the same path again and
// reads them back.
func testReopen(t *testing.T, open Opener) {
	ctx := t.Context()
	path := newPath(t)

	s := session("s1", 0)
	r := trainingRun("r1", 0)
	c := checkpoint("r1", "c1", 0)
	c.ExpireTime = ts(time.Hour)
	sa := sampler("sa1", 0)
	op := operation("op1", loopsv1.OperationState_OPERATION_STATE_RUNNING, 0)

	first := open(t, path)
	require.NoError(t, first.PutSession(ctx, wsA, s))
	require.NoError(t, first.PutTrainingRun(ctx, wsA, r))
	require.NoError(t, first.PutCheckpoint(ctx, wsB, c))
	require.NoError(t, first.PutSampler(ctx, wsA, sa))
	require.NoError(t, first.PutOperation(ctx, wsA, op))
	require.NoError(t, first.Close())

	st := openAt(t, open, path)
	gotS, err := st.GetSession(ctx, wsA, "s1")
	require.NoError(t, err)
	requireProtoEqual(t, s, gotS)
	all, err := st.ListAllTrainingRuns(ctx)
	require.NoError(t, err)
	requireProtoEqual(t, []store.OwnedTrainingRun{{Workspace: wsA, Run: r}}, all)
	gotC, owner, err := st.GetCheckpointAnyWorkspace(ctx, "r1", "c1")
	require.NoError(t, err)
	require.Equal(t, wsB, owner)
	requireProtoEqual(t, c, gotC)
	expired, err := st.ListExpiredCheckpoints(ctx, base.Add(2*time.Hour))
	require.NoError(t, err)
	requireProtoEqual(t, []store.OwnedCheckpoint{{Workspace: wsB, Checkpoint: c}}, expired)
	gotSa, err := st.GetSampler(ctx, wsA, "sa1")
	require.NoError(t, err)
	requireProtoEqual(t, sa, gotSa)
	gotOp, err := st.GetOperation(ctx, wsA, "op1")
	require.NoError(t, err)
	requireProtoEqual(t, op, gotOp)

	// The reopened store fails what the previous process left running.
	n, err := st.FailUnfinishedOperations(ctx, &loopsv1.OperationError{Message: "restart"}, base.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// testConcurrency runs writers and readers of every kind at once; none may fail (in
// particular, no "database is locked" may leak out).
func testConcurrency(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)

	const workers = 8
	const rounds = 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			ws := fmt.Sprintf("ws-%d", w%2)
			err := func() error {
				for i := range rounds {
					id := fmt.Sprintf("w%d-%d", w, i)
					created := time.Duration(i) * time.Second
					if err := st.PutSession(ctx, ws, session(id, created)); err != nil {
						return err
					}
					if _, err := st.GetSession(ctx, ws, id); err != nil {
						return err
					}
					if err := st.PutTrainingRun(ctx, ws, trainingRun(id, created)); err != nil {
						return err
					}
					if err := st.PutCheckpoint(ctx, ws, checkpoint(id, "c", created)); err != nil {
						return err
					}
					op := operation(id, loopsv1.OperationState_OPERATION_STATE_PENDING, created)
					if err := st.PutOperation(ctx, ws, op); err != nil {
						return err
					}
					op.State = loopsv1.OperationState_OPERATION_STATE_SUCCEEDED
					op.DoneTime = ts(created)
					if err := st.PutOperation(ctx, ws, op); err != nil {
						return err
					}
					if _, err := st.GetOperation(ctx, ws, id); err != nil {
						return err
					}
					if _, _, err := st.ListSessions(ctx, ws, store.Page{Limit: 10}); err != nil {
						return err
					}
					if _, _, err := st.ListCheckpoints(ctx, ws, "", store.Page{}); err != nil {
						return err
					}
					if _, err := st.ListAllTrainingRuns(ctx); err != nil {
						return err
					}
					if i%10 == 0 {
						if _, err := st.FailUnfinishedOperations(ctx, &loopsv1.OperationError{}, base); err != nil {
							return err
						}
						if _, err := st.DeleteOperationsDoneBefore(ctx, base.Add(-time.Hour)); err != nil {
							return err
						}
					}
				}
				return nil
			}()
			if err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	require.NoError(t, errors.Join(all...))

	for w := range 2 {
		_, total, err := st.ListSessions(ctx, fmt.Sprintf("ws-%d", w), store.Page{})
		require.NoError(t, err)
		require.EqualValues(t, workers/2*rounds, total)
	}
	runs, err := st.ListAllTrainingRuns(ctx)
	require.NoError(t, err)
	require.Len(t, runs, workers*rounds)
}

// usage returns a usage record in the hour bucket h hours after base.
func usage(h int, model, session, kind string, amount int64) store.UsageRecord {
	return store.UsageRecord{
		BucketStart: base.Add(time.Duration(h) * time.Hour), BaseModel: model,
		SessionID: session, Kind: kind, Amount: amount,
	}
}

func testUsage(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	got, err := st.ListUsage(ctx, wsA, base.Add(-time.Hour), base.Add(time.Hour))
	require.NoError(t, err)
	require.Empty(t, got)

	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m", "s1", store.UsageTraining, 10)))
	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m", "s1", store.UsageTraining, 5)))
	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m", "s1", store.UsageCheckpoint, 1)))
	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m", "s2", store.UsageTraining, 7)))
	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m2", "s1", store.UsageTraining, 3)))
	require.NoError(t, st.AddUsage(ctx, wsA, usage(1, "m", "s1", store.UsageTraining, 2)))

	got, err = st.ListUsage(ctx, wsA, base, base.Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{
		usage(0, "m", "s1", store.UsageCheckpoint, 1),
		usage(0, "m", "s1", store.UsageTraining, 15),
		usage(0, "m", "s2", store.UsageTraining, 7),
		usage(0, "m2", "s1", store.UsageTraining, 3),
		usage(1, "m", "s1", store.UsageTraining, 2),
	}, got)
	for _, u := range got {
		require.Equal(t, time.UTC, u.BucketStart.Location())
	}

	require.Error(t, st.AddUsage(ctx, wsA, usage(0, "m", "s1", "", 1)), "a record needs a kind")

	// Costs add up with the amounts; an unpriced part adds to the amount only.
	priced := func(amount, pricedAmount, cost int64) store.UsageRecord {
		u := usage(3, "m", "s1", store.UsageSamplingSample, amount)
		u.PricedAmount, u.Cost = pricedAmount, cost
		return u
	}
	require.NoError(t, st.AddUsage(ctx, wsA, priced(10, 10, 6_000_000)))
	require.NoError(t, st.AddUsage(ctx, wsA, priced(4, 0, 0)))
	require.NoError(t, st.AddUsage(ctx, wsA, priced(5, 5, 1<<50)))
	got, err = st.ListUsage(ctx, wsA, base.Add(3*time.Hour), base.Add(4*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{priced(19, 15, 6_000_000+1<<50)}, got)
	sum, err := st.UsageCost(ctx, wsA, base, base.Add(4*time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(6_000_000+1<<50), sum)
	sum, err = st.UsageCost(ctx, wsA, base.Add(4*time.Hour), base.Add(5*time.Hour))
	require.NoError(t, err)
	require.Zero(t, sum, "no rows: 0")
	require.NoError(t, st.AddUsage(ctx, wsA, func() store.UsageRecord { u := priced(1, 1, 1<<62); u.BucketStart = base.Add(2 * time.Hour); return u }()))
	require.NoError(t, st.AddUsage(ctx, wsA, func() store.UsageRecord { u := priced(1, 1, 1<<62); u.BucketStart = base.Add(1 * time.Hour); return u }()))
	_, err = st.UsageCost(ctx, wsA, base, base.Add(4*time.Hour))
	require.Error(t, err, "a sum past an int64 is an error, never a wrong number")

	// Each API key has its rows.
	keyed := func(key string, amount int64) store.UsageRecord {
		u := usage(5, "m", "s1", store.UsageTraining, amount)
		u.KeyID = key
		return u
	}
	require.NoError(t, st.AddUsage(ctx, wsA, keyed("key-b", 2)))
	require.NoError(t, st.AddUsage(ctx, wsA, keyed("key-a", 1)))
	require.NoError(t, st.AddUsage(ctx, wsA, keyed("key-b", 3)))
	require.NoError(t, st.AddUsage(ctx, wsA, keyed("", 4)))
	got, err = st.ListUsage(ctx, wsA, base.Add(5*time.Hour), base.Add(6*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{keyed("", 4), keyed("key-a", 1), keyed("key-b", 5)}, got)

	// A key's spend is the cost of its rows only, in the range, of its workspace only.
	keyCost := func(key string, hour int, cost int64) store.UsageRecord {
		u := usage(hour, "m", "s1", store.UsageSamplingSample, 1)
		u.KeyID, u.PricedAmount, u.Cost = key, 1, cost
		return u
	}
	require.NoError(t, st.AddUsage(ctx, wsA, keyCost("key-c", 7, 100)))
	require.NoError(t, st.AddUsage(ctx, wsA, keyCost("key-c", 8, 20)))
	require.NoError(t, st.AddUsage(ctx, wsA, keyCost("key-d", 7, 3)))
	require.NoError(t, st.AddUsage(ctx, wsB, keyCost("key-c", 7, 4000)))
	sum, err = st.KeyUsageCost(ctx, wsA, "key-c", base.Add(7*time.Hour), base.Add(9*time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(120), sum)
	sum, err = st.KeyUsageCost(ctx, wsA, "key-c", base.Add(8*time.Hour), base.Add(9*time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(20), sum)
	sum, err = st.KeyUsageCost(ctx, wsB, "key-c", base, base.Add(9*time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(4000), sum)
	sum, err = st.KeyUsageCost(ctx, wsA, "key-none", base, base.Add(9*time.Hour))
	require.NoError(t, err)
	require.Zero(t, sum)

	// Each run of a session has its rows (checkpoint storage, pool time), beside the
	// session's row of no run (usage metered before runs were recorded); all sum.
	ofRun := func(run string, amount, cost int64) store.UsageRecord {
		u := usage(10, "m", "s1", store.UsageCheckpointByteSeconds, amount)
		u.RunID, u.PricedAmount, u.Cost = run, amount, cost
		return u
	}
	require.NoError(t, st.AddUsage(ctx, wsA, ofRun("run-2", 5, 50)))
	require.NoError(t, st.AddUsage(ctx, wsA, ofRun("run-1", 2, 20)))
	require.NoError(t, st.AddUsage(ctx, wsA, ofRun("", 1, 10)))
	require.NoError(t, st.AddUsage(ctx, wsA, ofRun("run-2", 3, 30)))
	got, err = st.ListUsage(ctx, wsA, base.Add(10*time.Hour), base.Add(11*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{ofRun("", 1, 10), ofRun("run-1", 2, 20), ofRun("run-2", 8, 80)}, got)
	sum, err = st.UsageCost(ctx, wsA, base.Add(10*time.Hour), base.Add(11*time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(110), sum)
}

func testUsageWorkspaces(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m", "s1", store.UsageSamplingSample, 10)))
	require.NoError(t, st.AddUsage(ctx, wsB, usage(0, "m", "s1", store.UsageSamplingSample, 4)))

	got, err := st.ListUsage(ctx, wsA, base, base.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{usage(0, "m", "s1", store.UsageSamplingSample, 10)}, got)
	got, err = st.ListUsage(ctx, wsB, base, base.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{usage(0, "m", "s1", store.UsageSamplingSample, 4)}, got)
	got, err = st.ListUsage(ctx, "ws-c", base, base.Add(time.Hour))
	require.NoError(t, err)
	require.Empty(t, got)
}

func testUsageRange(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	for h := range 5 {
		require.NoError(t, st.AddUsage(ctx, wsA, usage(h, "m", "s", store.UsageSamplingPrefill, int64(h+1))))
	}
	got, err := st.ListUsage(ctx, wsA, base.Add(time.Hour), base.Add(3*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{
		usage(1, "m", "s", store.UsageSamplingPrefill, 2),
		usage(2, "m", "s", store.UsageSamplingPrefill, 3),
	}, got, "from is inclusive, to exclusive")

	got, err = st.ListUsage(ctx, wsA, base.Add(90*time.Minute), base.Add(150*time.Minute))
	require.NoError(t, err)
	require.Equal(t, []store.UsageRecord{usage(2, "m", "s", store.UsageSamplingPrefill, 3)}, got)

	got, err = st.ListUsage(ctx, wsA, base.Add(3*time.Hour), base.Add(3*time.Hour))
	require.NoError(t, err)
	require.Empty(t, got, "an empty range")
}

// testTraceReader: a session's samplers (oldest first, limited, its workspace's only) and
// the operations of a run or of a sampler (newest first, limited, the workspace's only; a
// sample is found by its sampler), also when written in a batch.
func testTraceReader(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	s1, s2, other := sampler("smp-1", 0), sampler("smp-2", time.Second), sampler("smp-3", 2*time.Second)
	other.SessionId = "sess-2"
	for _, s := range []*loopsv1.Sampler{s2, s1, other} {
		require.NoError(t, st.PutSampler(ctx, wsA, s))
	}
	got, err := st.ListSessionSamplers(ctx, wsA, "sess-1", 10)
	require.NoError(t, err)
	require.Len(t, got, 2)
	requireProtoEqual(t, s1, got[0])
	requireProtoEqual(t, s2, got[1])
	got, err = st.ListSessionSamplers(ctx, wsA, "sess-1", 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	got, err = st.ListSessionSamplers(ctx, wsB, "sess-1", 10)
	require.NoError(t, err)
	require.Empty(t, got)

	trainOld := operation("op-train-1", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)
	trainNew := operation("op-train-2", loopsv1.OperationState_OPERATION_STATE_CANCELLED, time.Second)
	sample := operation("op-sample", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 2*time.Second)
	sample.Kind, sample.TrainingRunId, sample.SamplerId = loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp-1"
	require.NoError(t, st.PutOperation(ctx, wsA, trainOld))
	require.NoError(t, st.PutOperation(ctx, wsA, sample))
	require.NoError(t, st.ApplyBatch(ctx, store.Batch{Operations: []store.OwnedOperation{{Workspace: wsA, Operation: trainNew}}}))
	ops, err := st.ListOwnerOperations(ctx, wsA, "run-1", 10)
	require.NoError(t, err)
	require.Len(t, ops, 2)
	requireProtoEqual(t, trainNew, ops[0])
	requireProtoEqual(t, trainOld, ops[1])
	ops, err = st.ListOwnerOperations(ctx, wsA, "run-1", 1)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	ops, err = st.ListOwnerOperations(ctx, wsA, "smp-1", 10)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	requireProtoEqual(t, sample, ops[0])
	ops, err = st.ListOwnerOperations(ctx, wsB, "run-1", 10)
	require.NoError(t, err)
	require.Empty(t, ops)
}
