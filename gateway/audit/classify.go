package audit

import (
	"net/http"
	"strings"
)

// Class is what a call does, for the audit log.
type Class int

const (
	// Read changes nothing and reads nothing protected: not recorded.
	Read Class = iota
	// Mutate changes the workspace's records or state (creates, deletes, trains, grants,
	// revokes): recorded.
	Mutate
	// Access reads a checkpoint's weights or hands out a way to (a download, a signed
	// URL): recorded, as Tinker's checkpoint_read events are.
	Access
)

// Recorded reports whether calls of the class go to the audit log.
func (c Class) Recorded() bool { return c != Read }

// Rule classifies the calls of one route: Pattern is a net/http.ServeMux pattern (a Tinker
// route "POST /api/v1/create_model", a loops.v1 procedure "/loops.v1.SessionService/CreateSession"
// on every RPC protocol), Event names a recorded call "<resource>_<verb>".
type Rule struct {
	Pattern string
	Class   Class
	Event   string
}

// Resource is the event's resource: what comes before its last '_' ("training_run" of
// "training_run_create").
func (r Rule) Resource() string {
	if i := strings.LastIndexByte(r.Event, '_'); i > 0 {
		return r.Event[:i]
	}
	return r.Event
}

func read(p string) Rule           { return Rule{Pattern: p, Class: Read} }
func mutate(p, event string) Rule  { return Rule{Pattern: p, Class: Mutate, Event: event} }
func access(p, event string) Rule  { return Rule{Pattern: p, Class: Access, Event: event} }
func proc(svc, m string) string    { return "/loops.v1." + svc + "/" + m }
func v1read(svc, m string) Rule    { return read(proc(svc, m)) }
func v1(svc, m, event string) Rule { return mutate(proc(svc, m), event) }

// Rules classify every authenticated route of every surface. A request that none matches
// is recorded when its method is not GET, HEAD or OPTIONS (an unknown write is audited,
// never missed); TestEveryRouteClassified fails for a Tinker route or loops.v1 procedure
// that is not listed here. Keep-alives and telemetry (session_heartbeat, telemetry), the
// forward pass, sampling and future retrieval are Read: they change no record a user
// manages, and a training loop sends them by the thousand.
var Rules = []Rule{
	// Tinker (compat/routes.go).
	read("POST /api/v1/client/config"),
	read("POST /api/v1/client/dynamic_config"),
	mutate("POST /api/v1/create_session", "session_create"),
	read("POST /api/v1/session_heartbeat"),
	mutate("POST /api/v1/sessions/{id}/finish", "session_finish"),
	read("POST /api/v1/telemetry"),
	read("GET /api/v1/get_server_capabilities"),
	read("GET /api/v1/healthz"),
	mutate("POST /api/v1/create_model", "training_run_create"),
	read("POST /api/v1/get_info"),
	mutate("POST /api/v1/unload_model", "training_run_unload"),
	mutate("POST /api/v1/forward_backward", "training_run_forward_backward"),
	read("POST /api/v1/forward"),
	mutate("POST /api/v1/optim_step", "training_run_optim_step"),
	mutate("POST /api/v1/save_weights", "checkpoint_create"),
	mutate("POST /api/v1/save_weights_external", "checkpoint_create"),
	mutate("POST /api/v1/save_weights_for_sampler", "checkpoint_create"),
	mutate("POST /api/v1/load_weights", "training_run_load_weights"),
	read("POST /api/v1/weights_info"),
	mutate("POST /api/v1/create_sampling_session", "sampler_create"),
	read("POST /api/v1/asample"),
	read("GET /api/v1/samplers/{id}"),
	read("POST /api/v1/retrieve_future"),
	read("GET /api/v1/training_runs"),
	read("GET /api/v1/training_runs/{run}"),
	read("GET /api/v1/training_runs/{run}/checkpoints"),
	read("GET /api/v1/checkpoints"),
	mutate("DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}", "checkpoint_delete"),
	mutate("POST /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish", "checkpoint_publish"),
	mutate("DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish", "checkpoint_unpublish"),
	mutate("PUT /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/ttl", "checkpoint_set_ttl"),
	access("GET /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/archive", "checkpoint_read"),
	access("GET /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/external_weights_urls", "checkpoint_read"),
	read("GET /api/v1/sessions"),
	read("GET /api/v1/sessions/{id}"),
	read("GET /api/v1/billing/usage/events"),
	read("GET /api/v1/billing/usage/checkpoints/current"),
	read("GET /api/v1/audit"),
	mutate("POST /api/v1/auth/token", "key_token_create"),
	mutate("POST /api/v1/cancel_future", "operation_cancel"),
	read("POST /api/v1/retrieve_futures"),
	mutate("POST /api/v1/join_sampling_session", "sampler_join"),
	mutate("POST /api/v1/create_custom_loss", "custom_loss_create"),
	mutate("POST /api/v1/copy_weights", "checkpoint_copy"),
	read("POST /api/v1/sessions/search"),
	mutate("PUT /api/v1/sessions/{id}/project", "project_session_set"),
	read("GET /api/v1/sessions/{id}/trace_export"),
	read("GET /api/v1/auth/apikey/me"),
	mutate("DELETE /api/v1/auth/apikey/me", "key_revoke"),

	// loops.v1 (Connect, gRPC, gRPC-Web; REST reaches them over gRPC).
	v1read("AuditService", "ListAuditEvents"),
	v1read("AuditService", "GetCheckpointStorage"),
	v1("DeploymentService", "CreateDeployment", "deployment_create"),
	v1read("DeploymentService", "GetDeployment"),
	v1read("DeploymentService", "ListDeployments"),
	v1("DeploymentService", "DeleteDeployment", "deployment_delete"),
	v1("DeploymentService", "GrantDeployment", "deployment_grant"),
	v1("DeploymentService", "RevokeDeployment", "deployment_revoke"),
	v1("JobService", "SubmitJob", "job_submit"),
	v1read("JobService", "GetJob"),
	v1read("JobService", "ListJobs"),
	v1("JobService", "CancelJob", "job_cancel"),
	v1read("JobService", "ReadJobLogs"),
	v1("EvalService", "CreateEval", "eval_create"),
	v1read("EvalService", "GetEval"),
	v1read("EvalService", "ListEvals"),
	v1("EvalService", "DeleteEval", "eval_delete"),
	v1("EvalService", "AttachEval", "eval_attach"),
	v1read("EvalService", "ListEvalResults"),
	v1("KeyService", "CreateKey", "key_create"),
	v1read("KeyService", "ListKeys"),
	v1("KeyService", "RevokeKey", "key_revoke"),
	v1("KeyService", "UpdateKey", "key_update"),
	v1read("KeyService", "WhoAmI"),
	v1read("OperationService", "GetOperation"),
	v1read("OperationService", "WaitOperation"),
	v1("OperationService", "CancelOperation", "operation_cancel"),
	v1read("OperationService", "BatchGetOperations"),
	v1read("PoolService", "ListPools"),
	v1read("PoolService", "GetPool"),
	v1("PoolService", "ScalePool", "pool_scale"),
	v1("PoolService", "DeletePool", "pool_delete"),
	v1read("PoolService", "ListAllocations"),
	v1("ProjectService", "CreateProject", "project_create"),
	v1read("ProjectService", "GetProject"),
	v1read("ProjectService", "ListProjects"),
	v1("ProjectService", "DeleteProject", "project_delete"),
	v1("SamplerClientService", "JoinSampler", "sampler_join"),
	v1("SessionService", "CreateSession", "session_create"),
	v1read("SessionService", "HeartbeatSession"),
	v1("SessionService", "FinishSession", "session_finish"),
	v1read("SessionService", "GetSession"),
	v1read("SessionService", "ListSessions"),
	v1read("SessionService", "SearchSessions"),
	v1("SessionService", "SetSessionProject", "project_session_set"),
	v1("TrainingService", "CreateTrainingRun", "training_run_create"),
	v1read("TrainingService", "GetTrainingRun"),
	v1read("TrainingService", "ListTrainingRuns"),
	v1("TrainingService", "UnloadTrainingRun", "training_run_unload"),
	v1("TrainingService", "ForwardBackward", "training_run_forward_backward"),
	v1("TrainingService", "OptimStep", "training_run_optim_step"),
	v1("TrainingService", "SaveWeights", "checkpoint_create"),
	v1("TrainingService", "LoadWeights", "training_run_load_weights"),
	v1read("TrainingService", "GetTrainingRunMetrics"),
	v1read("CheckpointService", "ListCheckpoints"),
	v1read("CheckpointService", "GetCheckpoint"),
	v1("CheckpointService", "DeleteCheckpoint", "checkpoint_delete"),
	v1("CheckpointService", "SetCheckpointPublic", "checkpoint_set_public"),
	v1("CheckpointService", "SetCheckpointTTL", "checkpoint_set_ttl"),
	access(proc("CheckpointService", "GetCheckpointFileURLs"), "checkpoint_read"),
	access(proc("CheckpointService", "GetCheckpointArchiveURL"), "checkpoint_read"),
	access(proc("CheckpointService", "GetCheckpointExportURL"), "checkpoint_read"),
	v1("SamplingService", "CreateSampler", "sampler_create"),
	v1read("SamplingService", "GetSampler"),
	v1read("SamplingService", "Sample"),
	v1read("ModelService", "ListModels"),
	v1read("WorkspaceService", "GetWorkspace"),
	v1read("UsageService", "GetUsage"),
	v1read("UsageService", "EstimateCost"),
	v1read("TraceService", "ExportSessionTrace"),
	v1read("TraceService", "GetSessionTraceURL"),
	v1read("ReceiptService", "GetRunReceipt"),
	access(proc("ReceiptService", "GetReceiptBatch"), "receipt_batch_read"),
	v1("WeightsAccessService", "CreateWeightsAccessToken", "checkpoint_share"),
	v1read("WeightsAccessService", "ListWeightsAccessTokens"),
	v1("WeightsAccessService", "RevokeWeightsAccessToken", "checkpoint_unshare"),
	v1("WeightsAccessService", "CopyWeights", "checkpoint_copy"),
	v1("AccessService", "RequestAccess", "access_request_create"),
	v1read("AccessService", "ListAccessRequests"),
	v1read("AccessService", "GetAccessRequest"),
	v1("AccessService", "GrantAccessRequest", "access_request_grant"),
	v1("AccessService", "DenyAccessRequest", "access_request_deny"),
	v1read("AccessService", "ListWebhookDeliveries"),

	// Checkpoint transfers (gateway/ckhttp): exports are downloads, imports create checkpoints.
	access("GET /v1/checkpoint_exports", "checkpoint_read"),
	mutate("POST /v1/checkpoint_imports", "checkpoint_import"),

	// OpenAI- and Anthropic-compatible inference: sampling only.
	read("POST /oai/api/v1/chat/completions"),
	read("POST /oai/api/v1/completions"),
	read("POST /oai/api/v1/embeddings"),
	read("GET /oai/api/v1/models"),
	read("GET /oai/api/v1/models/{model...}"),
	read("POST /anthropic/api/v1/messages"),
	read("POST /anthropic/api/v1/messages/count_tokens"),

	// The console (gateway/console): its forms change checkpoints.
	read("GET /{$}"),
	mutate("POST /console/signout", "console_sign_out"),
	read("GET /console/runs/live"),
	read("GET /console/runs/{id}"),
	read("GET /console/runs/{id}/live"),
	read("GET /console/checkpoint"),
	read("GET /console/checkpoint/delete"),
	mutate("POST /console/checkpoint/delete", "checkpoint_delete"),
	mutate("POST /console/checkpoint/public", "checkpoint_set_public"),
	mutate("POST /console/checkpoint/ttl", "checkpoint_set_ttl"),
	access("POST /console/checkpoint/download", "checkpoint_read"),
	read("GET /console/sessions"),
	read("GET /console/usage"),
	read("GET /console/limits"),
	read("GET /console/deployments"),
}

// Classifier finds the Rule of a request.
type Classifier struct {
	mux *http.ServeMux
	by  map[string]Rule
}

// NewClassifier builds the classifier of rules. A pattern net/http refuses (or one listed
// twice) panics: the table is fixed at build time and its test builds it.
func NewClassifier(rules []Rule) *Classifier {
	c := &Classifier{mux: http.NewServeMux(), by: make(map[string]Rule, len(rules))}
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, r := range rules {
		c.mux.Handle(r.Pattern, nop)
		c.by[r.Pattern] = r
	}
	return c
}

// Classify returns the rule of r; a request that no rule matches is Mutate, with its
// method and path as the pattern, unless its method is GET, HEAD or OPTIONS.
func (c *Classifier) Classify(r *http.Request) Rule {
	if _, pattern := c.mux.Handler(r); pattern != "" {
		if rule, ok := c.by[pattern]; ok {
			return rule
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return Rule{Pattern: r.Method + " " + r.URL.Path, Class: Read}
	}
	path := r.URL.Path
	if len(path) > 256 {
		path = path[:256]
	}
	return Rule{Pattern: r.Method + " " + path, Class: Mutate, Event: unclassified}
}
