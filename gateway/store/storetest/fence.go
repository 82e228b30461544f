package storetest

import (
	"context"
	"crypto/sha256"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TakeLease makes holder the holder of the lease that a fenced store checks, in a new term,
// whoever held it before (as a takeover after the lease lapsed does), and returns the fence
// of that term.
type TakeLease func(t *testing.T, holder string) store.Fence

// reads are the methods of store.Store that change nothing: a fence does not check them.
var reads = []string{
	"GetSession", "ListSessions", "GetTrainingRun", "ListTrainingRuns", "ListAllTrainingRuns",
	"ListSessionTrainingRuns", "GetCheckpoint", "GetCheckpointAnyWorkspace", "ListCheckpoints",
	"ListExpiredCheckpoints", "GetSampler", "GetOperation", "ListStepMetrics", "ListReceiptSteps", "ListUsage", "UsageCost", "KeyUsageCost", "ListBudgetAlerts",
	"GetDeployment", "ListDeployments", "ListAllDeployments", "ListGrantedDeployments",
	"CheckpointDeployments", "GetJob", "ListJobs", "ListAuditEvents", "CheckpointStorage", "CheckpointBytes",
	"GetProject", "ListProjects", "SearchSessions", "ListProjectTrainingRuns", "ListUnindexedSessions",
	"APIKeyByHash", "GetAPIKey", "ListAPIKeys", "SigningKeys",
	"GetWeightsAccessToken", "ListWeightsAccessTokens",
	"GetAccessRequest", "ListAccessRequests", "GrantedAccessRequests", "DueWebhookDeliveries",
	"ListWebhookDeliveries", "CountPendingWebhookDeliveries",
	"ListSessionSamplers", "ListOwnerOperations",
	"GetEval", "GetEvalByName", "GetEvalDataset", "ListEvals", "ListEvalAttachments", "ListEvalResults",
	"SetFence", "Close",
}

// RunFencing checks a store that several gateways share (store.Fencer): two stores opened
// at one path, as two gateways on one database, the first fenced with holder A's term; once
// B has taken the lease over, every write of A's store (every method of store.Store that is
// not a read: a method added to the interface must be added here) fails with
// store.ErrFenced and changes nothing, A's Fence.Lost hears of it, reads still work, and B's
// store, fenced with B's term, writes. A fence of term 0 refuses every write.
func RunFencing(t *testing.T, open Opener, take TakeLease) {
	ctx := t.Context()
	path := newPath(t)
	old := openAt(t, open, path)
	cur := openAt(t, open, path)

	var mu sync.Mutex
	var lost []error
	fa := take(t, "gateway-a")
	fa.Lost = func(err error) {
		mu.Lock()
		defer mu.Unlock()
		lost = append(lost, err)
	}
	require.NoError(t, old.SetFence(fa))
	seedFenced(t, old)

	writes := fencedWrites()
	var methods []string
	for m := range reflect.TypeFor[store.Store]().Methods() {
		methods = append(methods, m.Name)
	}
	for _, m := range methods {
		_, isWrite := writes[m]
		require.True(t, isWrite != slices.Contains(reads, m),
			"store.Store.%s must be either a read or a write that storetest.RunFencing checks", m)
	}

	fb := take(t, "gateway-b")
	require.NoError(t, cur.SetFence(fb))
	before := snapshot(t, cur)
	for _, m := range methods {
		if w, ok := writes[m]; ok {
			require.ErrorIs(t, w(ctx, old), store.ErrFenced, "%s by the holder of an older term", m)
		}
	}
	require.Empty(t, cmp.Diff(before, snapshot(t, cur), protocmp.Transform()), "a refused write changed records")
	require.Empty(t, cmp.Diff(before, snapshot(t, old), protocmp.Transform()), "the old holder still reads")
	mu.Lock()
	require.NotEmpty(t, lost, "Fence.Lost heard of the refusals")
	require.ErrorIs(t, lost[0], store.ErrFenced)
	mu.Unlock()

	// The new holder writes: the records are its own.
	for _, m := range methods {
		if w, ok := writes[m]; ok {
			require.NoError(t, w(ctx, cur), "%s by the holder of the current term", m)
		}
	}
	got, err := cur.GetSession(ctx, wsA, "sess-fenced")
	require.NoError(t, err)
	requireProtoEqual(t, session("sess-fenced", time.Hour), got)

	// Term 0 (a standby's fence) refuses everything.
	fb.Term, fb.Lost = 0, nil
	require.NoError(t, cur.SetFence(fb))
	require.ErrorIs(t, cur.PutSession(ctx, wsA, session("sess-standby", 0)), store.ErrFenced)
}

// seedFenced writes what fencedWrites change.
func seedFenced(t *testing.T, st store.Store) {
	ctx := t.Context()
	require.NoError(t, st.PutSession(ctx, wsA, session("sess-1", 0)))
	require.NoError(t, st.PutTrainingRun(ctx, wsA, trainingRun("run-1", 0)))
	require.NoError(t, st.PutCheckpoint(ctx, wsA, checkpoint("run-1", "ckpt-1", 0)))
	require.NoError(t, st.PutSampler(ctx, wsA, sampler("smp-1", 0)))
	require.NoError(t, st.PutOperation(ctx, wsA, operation("op-pending", loopsv1.OperationState_OPERATION_STATE_PENDING, 0)))
	require.NoError(t, st.PutOperation(ctx, wsA, operation("op-done", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)))
	require.NoError(t, st.AddUsage(ctx, wsA, usage(0, "m", "sess-1", store.UsageTraining, 5)))
	require.NoError(t, st.PutDeployment(ctx, wsA, deployment("d1", 0, wsB), []store.CheckpointRef{pin("run-1", "ckpt-1")}))
	require.NoError(t, st.PutJob(ctx, wsA, job("job-1", 0, loopsv1.JobState_JOB_STATE_RUNNING)))
	require.NoError(t, st.PutJob(ctx, wsA, job("job-2", 0, loopsv1.JobState_JOB_STATE_SUCCEEDED)))
	require.NoError(t, st.CreateProject(ctx, wsA, &loopsv1.Project{Name: "p-1", CreateTime: ts(0)}))
	require.NoError(t, st.CreateAPIKey(ctx, apiKey("key-1", wsA, 0, loopsv1.KeyRole_KEY_ROLE_MEMBER), sha256.Sum256([]byte("tml-1"))))
	require.NoError(t, st.PutSigningKey(ctx, store.SigningKey{ID: "sk-1", Created: base, Seed: make([]byte, 32)}))
	require.NoError(t, st.AppendAuditEvents(ctx, []store.OwnedAuditEvent{
		auditEvent(wsA, 0, "key-a", "session_create", "sess-1"), auditEvent(wsA, time.Minute, "key-a", "session_create", "sess-2")}))
	require.NoError(t, st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-1", 0, 2000*time.Hour), hashOf("wat-1"), base, 10))
	require.NoError(t, st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-old", 0, time.Second), hashOf("wat-old"), base, 10))
	_, _, err := st.PutAccessRequest(ctx, accessRequest("acr-1", wsA, "key-a", "m", 0), 10, hookFor("evt-1", wsA))
	require.NoError(t, err)
	require.NoError(t, st.CreateEval(ctx, wsA, fencedEval("eval-1"), []byte("{}\n")))
	require.NoError(t, st.PutEvalAttachment(ctx, wsA, &loopsv1.EvalAttachment{TrainingRunId: "run-1", EvalId: "eval-1", CreateTime: ts(0)}))
	require.NoError(t, st.PutEvalResult(ctx, wsA, fencedEvalResult("eval-1", 1)))
}

// fencedEval is an eval seedFenced and fencedWrites write.
func fencedEval(id string) *loopsv1.Eval {
	return &loopsv1.Eval{Id: id, Name: id, Kind: loopsv1.EvalKind_EVAL_KIND_NLL, CreateTime: ts(0)}
}

// fencedEvalResult is a result of eval id on run-1's ckpt-1.
func fencedEvalResult(id string, score float64) *loopsv1.EvalResult {
	return &loopsv1.EvalResult{TrainingRunId: "run-1", CheckpointId: "ckpt-1", EvalId: id, Score: score, CreateTime: ts(0),
		State: loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED}
}

// fencedTokens are the weights-access tokens seedFenced and fencedWrites touch.
var fencedTokens = []string{"wat-1", "wat-old", "wat-fenced"}

// fencedWrites are the writes of store.Store by name, each one that changes records of
// seedFenced's (so that a write let through shows in a snapshot).
func fencedWrites() map[string]func(context.Context, store.Store) error {
	far := base.Add(1000 * time.Hour)
	return map[string]func(context.Context, store.Store) error{
		"PutSession": func(ctx context.Context, st store.Store) error {
			return st.PutSession(ctx, wsA, session("sess-fenced", time.Hour))
		},
		"PutTrainingRun": func(ctx context.Context, st store.Store) error {
			return st.PutTrainingRun(ctx, wsA, trainingRun("run-fenced", time.Hour))
		},
		"PutCheckpoint": func(ctx context.Context, st store.Store) error {
			return st.PutCheckpoint(ctx, wsA, checkpoint("run-1", "ckpt-fenced", time.Hour))
		},
		"DeleteCheckpoint": func(ctx context.Context, st store.Store) error {
			return st.DeleteCheckpoint(ctx, wsA, "run-1", "ckpt-1")
		},
		"PutSampler": func(ctx context.Context, st store.Store) error {
			return st.PutSampler(ctx, wsA, sampler("smp-fenced", time.Hour))
		},
		"PutOperation": func(ctx context.Context, st store.Store) error {
			return st.PutOperation(ctx, wsA, operation("op-fenced", loopsv1.OperationState_OPERATION_STATE_RUNNING, time.Hour))
		},
		"FailUnfinishedOperations": func(ctx context.Context, st store.Store) error {
			_, err := st.FailUnfinishedOperations(ctx, &loopsv1.OperationError{Message: "fenced"}, far)
			return err
		},
		"DeleteOperationsDoneBefore": func(ctx context.Context, st store.Store) error {
			_, err := st.DeleteOperationsDoneBefore(ctx, far)
			return err
		},
		"ApplyBatch": func(ctx context.Context, st store.Store) error {
			run := trainingRun("run-1", 0)
			run.LastSeqId = 99
			return st.ApplyBatch(ctx, store.Batch{
				TrainingRuns: []store.OwnedTrainingRun{{Workspace: wsA, Run: run}},
				Operations:   []store.OwnedOperation{{Workspace: wsA, Operation: operation("op-pending", loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, 0)}},
				StepMetrics:  stepRecords(wsA, "run-1", 1),
				ReceiptSteps: receiptSteps(wsA, "run-1", 1),
			})
		},
		"AddUsage": func(ctx context.Context, st store.Store) error {
			return st.AddUsage(ctx, wsA, usage(0, "m", "sess-1", store.UsageTraining, 7))
		},
		"PutDeployment": func(ctx context.Context, st store.Store) error {
			return st.PutDeployment(ctx, wsA, deployment("d-fenced", time.Hour), nil)
		},
		"DeleteDeployment": func(ctx context.Context, st store.Store) error {
			return st.DeleteDeployment(ctx, wsA, "d1")
		},
		"PutJob": func(ctx context.Context, st store.Store) error {
			return st.PutJob(ctx, wsA, job("job-fenced", time.Hour, loopsv1.JobState_JOB_STATE_RUNNING))
		},
		"DeleteJob": func(ctx context.Context, st store.Store) error {
			return st.DeleteJob(ctx, wsA, "job-2")
		},
		"FailRunningJobs": func(ctx context.Context, st store.Store) error {
			_, err := st.FailRunningJobs(ctx, "fenced", far)
			return err
		},
		"CreateProject": func(ctx context.Context, st store.Store) error {
			return st.CreateProject(ctx, wsA, &loopsv1.Project{Name: "p-fenced", CreateTime: ts(time.Hour)})
		},
		"DeleteProject": func(ctx context.Context, st store.Store) error {
			return st.DeleteProject(ctx, wsA, "p-1")
		},
		"CreateAPIKey": func(ctx context.Context, st store.Store) error {
			return st.CreateAPIKey(ctx, apiKey("key-fenced", wsA, time.Hour, loopsv1.KeyRole_KEY_ROLE_ADMIN), sha256.Sum256([]byte("tml-fenced")))
		},
		"RevokeAPIKey": func(ctx context.Context, st store.Store) error {
			_, err := st.RevokeAPIKey(ctx, wsA, "key-1", far)
			return err
		},
		"SetAPIKeyBudgets": func(ctx context.Context, st store.Store) error {
			_, err := st.SetAPIKeyBudgets(ctx, wsA, "key-1", "9", "")
			return err
		},
		"TouchAPIKey": func(ctx context.Context, st store.Store) error {
			return st.TouchAPIKey(ctx, "key-1", far)
		},
		"PutSigningKey": func(ctx context.Context, st store.Store) error {
			return st.PutSigningKey(ctx, store.SigningKey{ID: "sk-fenced", Created: far, Seed: make([]byte, 32)})
		},
		"DeleteSigningKeys": func(ctx context.Context, st store.Store) error {
			_, err := st.DeleteSigningKeys(ctx, far)
			return err
		},
		"AppendAuditEvents": func(ctx context.Context, st store.Store) error {
			return st.AppendAuditEvents(ctx, []store.OwnedAuditEvent{auditEvent(wsA, time.Hour, "key-a", "session_create", "sess-fenced")})
		},
		"RecordBudgetAlert": func(ctx context.Context, st store.Store) error {
			a := store.BudgetAlert{Workspace: wsA, Budget: "budget_usd_total", Percent: 50, Time: far}
			_, err := st.RecordBudgetAlert(ctx, a, auditEvent(wsA, time.Hour, "", "budget_alert", "budget_usd_total 50%"))
			return err
		},
		"DeleteAuditEventsBefore": func(ctx context.Context, st store.Store) error {
			_, err := st.DeleteAuditEventsBefore(ctx, far)
			return err
		},
		"TrimAuditEvents": func(ctx context.Context, st store.Store) error {
			_, err := st.TrimAuditEvents(ctx, 1)
			return err
		},
		"CreateWeightsAccessToken": func(ctx context.Context, st store.Store) error {
			return st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-fenced", time.Hour, 2000*time.Hour), hashOf("wat-fenced"), base, 10)
		},
		"DeleteWeightsAccessToken": func(ctx context.Context, st store.Store) error {
			return st.DeleteWeightsAccessToken(ctx, wsA, "wat-1")
		},
		"DeleteExpiredWeightsAccessTokens": func(ctx context.Context, st store.Store) error {
			_, err := st.DeleteExpiredWeightsAccessTokens(ctx, base.Add(time.Hour))
			return err
		},
		"PutAccessRequest": func(ctx context.Context, st store.Store) error {
			_, _, err := st.PutAccessRequest(ctx, accessRequest("acr-fenced", wsA, "key-b", "m", time.Hour), 10, hookFor("evt-fenced", wsA))
			return err
		},
		"TransitionAccessRequest": func(ctx context.Context, st store.Store) error {
			r := accessRequest("acr-1", wsA, "key-a", "m", 0)
			r.State = loopsv1.AccessState_ACCESS_STATE_DENIED
			return st.TransitionAccessRequest(ctx, r, loopsv1.AccessState_ACCESS_STATE_PENDING,
				auditEvent(wsA, time.Hour, "key-admin", "access_request_deny", "acr-1"), nil)
		},
		"CreateEval": func(ctx context.Context, st store.Store) error {
			return st.CreateEval(ctx, wsA, fencedEval("eval-fenced"), nil)
		},
		"DeleteEval": func(ctx context.Context, st store.Store) error {
			return st.DeleteEval(ctx, wsA, "eval-1")
		},
		"PutEvalAttachment": func(ctx context.Context, st store.Store) error {
			return st.PutEvalAttachment(ctx, wsA, &loopsv1.EvalAttachment{TrainingRunId: "run-1", EvalId: "eval-1", EveryNSteps: 3, CreateTime: ts(0)})
		},
		"PutEvalResult": func(ctx context.Context, st store.Store) error {
			return st.PutEvalResult(ctx, wsA, fencedEvalResult("eval-1", 2))
		},
		"DeleteEvalResults": func(ctx context.Context, st store.Store) error {
			return st.DeleteEvalResults(ctx, wsA, "run-1", "ckpt-1")
		},
		"UpdateWebhookDelivery": func(ctx context.Context, st store.Store) error {
			d := hookFor("evt-1", wsA).Delivery
			d.State = store.WebhookDelivered
			return st.UpdateWebhookDelivery(ctx, d)
		},
	}
}

// fencedState is what seedFenced and fencedWrites touch, as the store reads it.
type fencedState struct {
	Sessions    []*loopsv1.Session
	Runs        []*loopsv1.TrainingRun
	Checkpoints []*loopsv1.Checkpoint
	Samplers    []*loopsv1.Sampler
	Operations  []*loopsv1.Operation
	StepMetrics []*loopsv1.StepMetrics
	Usage       []store.UsageRecord
	Deployments []*loopsv1.Deployment
	Jobs        []*loopsv1.Job
	Projects    []*loopsv1.Project
	APIKeys     []*loopsv1.ApiKey
	SigningKeys []store.SigningKey
	Audit       []store.AuditEvent
	Tokens      []*loopsv1.WeightsAccessToken
	Access      []*loopsv1.AccessRequest
	Webhooks    []*loopsv1.WebhookDelivery
	Evals       []*loopsv1.Eval
	Attachments []*loopsv1.EvalAttachment
	EvalResults []*loopsv1.EvalResult
}

func snapshot(t *testing.T, st store.Store) fencedState {
	t.Helper()
	ctx := t.Context()
	var s fencedState
	var err error
	s.Sessions, _, err = st.ListSessions(ctx, wsA, store.Page{})
	require.NoError(t, err)
	s.Runs, _, err = st.ListTrainingRuns(ctx, wsA, store.Page{})
	require.NoError(t, err)
	s.Checkpoints, _, err = st.ListCheckpoints(ctx, wsA, "", store.Page{})
	require.NoError(t, err)
	for _, id := range []string{"smp-1", "smp-fenced"} {
		if m, err := st.GetSampler(ctx, wsA, id); err == nil {
			s.Samplers = append(s.Samplers, m)
		}
	}
	for _, id := range []string{"op-pending", "op-done", "op-fenced"} {
		if m, err := st.GetOperation(ctx, wsA, id); err == nil {
			s.Operations = append(s.Operations, m)
		}
	}
	s.StepMetrics, err = st.ListStepMetrics(ctx, wsA, "run-1", 0, 0)
	require.NoError(t, err)
	s.Usage, err = st.ListUsage(ctx, wsA, base.Add(-time.Hour), base.Add(2000*time.Hour))
	require.NoError(t, err)
	s.Deployments, err = st.ListDeployments(ctx, wsA)
	require.NoError(t, err)
	s.Jobs, err = st.ListJobs(ctx, wsA, 0)
	require.NoError(t, err)
	s.Projects, err = st.ListProjects(ctx, wsA)
	require.NoError(t, err)
	s.APIKeys, err = st.ListAPIKeys(ctx, "", 0)
	require.NoError(t, err)
	s.SigningKeys, err = st.SigningKeys(ctx, time.Time{})
	require.NoError(t, err)
	s.Audit, err = st.ListAuditEvents(ctx, wsA, store.AuditQuery{})
	require.NoError(t, err)
	for _, id := range fencedTokens {
		if m, _, err := st.GetWeightsAccessToken(ctx, hashOf(id)); err == nil {
			s.Tokens = append(s.Tokens, m)
		}
	}
	s.Access, err = st.ListAccessRequests(ctx, wsA, store.AccessQuery{})
	require.NoError(t, err)
	s.Webhooks, err = st.ListWebhookDeliveries(ctx, wsA, 0)
	require.NoError(t, err)
	s.Evals, err = st.ListEvals(ctx, wsA)
	require.NoError(t, err)
	s.Attachments, err = st.ListEvalAttachments(ctx, wsA, "run-1")
	require.NoError(t, err)
	s.EvalResults, err = st.ListEvalResults(ctx, wsA, "run-1", "", "", 100)
	require.NoError(t, err)
	return s
}
