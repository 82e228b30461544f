package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// depServer runs a gateway on dataDir with keys A (its derived workspace), B ("team-b") and
// C ("team-c"); stop closes it.
func depServer(t *testing.T, dataDir string) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b", keyC + "=team-c"})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dataDir, Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

const keyC = "tml-test-key-c"

// oai posts an OpenAI completion (greedy, 6 tokens) and returns the status and body.
func oai(t *testing.T, url, key, model string) (int, map[string]any) {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{"model": model, "prompt": "hello", "max_tokens": 6, "temperature": 0})
	req, err := http.NewRequestWithContext(t.Context(), "POST", url+"/oai/api/v1/completions", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	return resp.StatusCode, out
}

func completionText(t *testing.T, body map[string]any) string {
	t.Helper()
	choices, ok := body["choices"].([]any)
	require.True(t, ok, "%v", body)
	return choices[0].(map[string]any)["text"].(string)
}

func errMessage(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// TestDeployments: a deployment serves its checkpoints on the OpenAI route under its name,
// pins them (delete is a 409 naming it), is shared read-only by a grant and withdrawn by a
// revoke or a delete, is metered per workspace under its name, and survives a restart.
func TestDeployments(t *testing.T) {
	dataDir := t.TempDir()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	url, stop := depServer(t, dataDir)
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMlp: true},
	}))).GetTrainingRun().GetId()
	save := func(name string) string {
		return wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: name,
			Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))).GetSaveWeights().GetPath()
	}
	c1 := save("c1")
	// Train a step so that c2 differs from c1.
	in, tgt, w := tokens(12)
	wait(must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})))
	wait(must(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 0.05}})))
	c2 := save("c2")

	depA := loopsv1connect.NewDeploymentServiceClient(http.DefaultClient, url, withKey(keyA))
	depB := loopsv1connect.NewDeploymentServiceClient(http.DefaultClient, url, withKey(keyB))
	wsA := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyA)).GetWorkspace(ctx, &loopsv1.GetWorkspaceRequest{})).GetName()

	// Bad creations: each a clear 4xx.
	for name, tc := range map[string]struct {
		req  *loopsv1.CreateDeploymentRequest
		code connect.Code
	}{
		"bad name":     {&loopsv1.CreateDeploymentRequest{Name: "a/b", Checkpoints: []string{c1}}, connect.CodeInvalidArgument},
		"no ckpt":      {&loopsv1.CreateDeploymentRequest{Name: "x"}, connect.CodeInvalidArgument},
		"replicas":     {&loopsv1.CreateDeploymentRequest{Name: "x", Checkpoints: []string{c1}, Replicas: 9}, connect.CodeInvalidArgument},
		"missing ckpt": {&loopsv1.CreateDeploymentRequest{Name: "x", Checkpoints: []string{"tinker://" + run + "/sampler_weights/nope"}}, connect.CodeNotFound},
		"same name":    {&loopsv1.CreateDeploymentRequest{Name: "x", Checkpoints: []string{c1, c1}}, connect.CodeInvalidArgument},
	} {
		_, err := depA.CreateDeployment(ctx, tc.req)
		require.Equal(t, tc.code, connect.CodeOf(err), "%s: %v", name, err)
	}
	// Another workspace cannot deploy A's checkpoint.
	_, err := depB.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "steal", Checkpoints: []string{c1}})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "%v", err)

	d := must(depA.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "dep", Checkpoints: []string{c1, c2}}))
	require.Equal(t, []string{"dep/c1", "dep/c2"}, d.GetModels())
	require.Equal(t, "loops/tiny", d.GetBaseModel())
	require.EqualValues(t, 1, d.GetReplicas())
	_, err = depA.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "dep", Checkpoints: []string{c1}})
	require.Equal(t, connect.CodeAlreadyExists, connect.CodeOf(err))

	// The deployment's checkpoints answer as their paths do.
	for ck, path := range map[string]string{"c1": c1, "c2": c2} {
		st, want := oai(t, url, keyA, path)
		require.Equal(t, 200, st, "%v", want)
		st, got := oai(t, url, keyA, "dep/"+ck)
		require.Equal(t, 200, st, "%v", got)
		require.Equal(t, completionText(t, want), completionText(t, got))
	}
	// GET /models lists the deployment's model strings.
	mreq, _ := http.NewRequestWithContext(ctx, "GET", url+"/oai/api/v1/models", nil)
	mreq.Header.Set("Authorization", "Bearer "+keyA)
	mresp, err := http.DefaultClient.Do(mreq)
	require.NoError(t, err)
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	require.Contains(t, string(mb), `"id":"dep/c1"`)
	require.Contains(t, string(mb), `"id":"dep/c2"`)
	for model, want := range map[string]int{"dep/c1": 200, "dep/c3": 404} {
		greq, _ := http.NewRequestWithContext(ctx, "GET", url+"/oai/api/v1/models/"+model, nil)
		greq.Header.Set("Authorization", "Bearer "+keyA)
		gresp, err := http.DefaultClient.Do(greq)
		require.NoError(t, err)
		gb, _ := io.ReadAll(gresp.Body)
		gresp.Body.Close()
		require.Equal(t, want, gresp.StatusCode, "%s: %s", model, gb)
	}
	st, body := oai(t, url, keyA, "dep")
	require.Equal(t, 400, st)
	require.Contains(t, errMessage(body), "dep/c1")

	// Pinned: deleting a deployed checkpoint is a 409 that names the deployment.
	req, _ := http.NewRequestWithContext(ctx, "DELETE", url+"/v1/checkpoint?path="+neturl.QueryEscape(c1), nil)
	req.Header.Set("X-API-Key", keyA)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode, string(b))
	require.Contains(t, string(b), "dep")

	// Not shared: B gets a 404 naming the model (model_not_found); shared: B samples it, read-only.
	shared := wsA + ":dep/c2"
	st, body = oai(t, url, keyB, shared)
	require.Equal(t, 404, st, "%v", body)
	_, err = depA.GrantDeployment(ctx, &loopsv1.GrantDeploymentRequest{Name: "dep", Workspace: "team-b"})
	require.NoError(t, err)
	st, got := oai(t, url, keyB, shared)
	require.Equal(t, 200, st, "%v", got)
	_, want := oai(t, url, keyA, c2)
	require.Equal(t, completionText(t, want), completionText(t, got))
	st, body = oai(t, url, keyC, shared)
	require.Equal(t, 404, st, "a grant is for one workspace: %v", body)
	list := must(depB.ListDeployments(ctx, &loopsv1.ListDeploymentsRequest{}))
	require.Len(t, list.GetDeployments(), 1)
	require.Equal(t, wsA, list.GetDeployments()[0].GetOwner())
	require.Empty(t, list.GetDeployments()[0].GetGrants(), "grants are the owner's to see")
	require.Equal(t, []string{wsA + ":dep/c1", wsA + ":dep/c2"}, list.GetDeployments()[0].GetModels())
	_, err = depB.DeleteDeployment(ctx, &loopsv1.DeleteDeploymentRequest{Name: "dep"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = depB.GrantDeployment(ctx, &loopsv1.GrantDeploymentRequest{Name: "dep", Workspace: "team-c"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// Metered: B's usage holds its tokens under the deployment.
	usage := must(loopsv1connect.NewUsageServiceClient(http.DefaultClient, url, withKey(keyB)).GetUsage(ctx, &loopsv1.GetUsageRequest{}))
	amounts := map[loopsv1.UsageKind]int64{}
	for _, u := range usage.GetBuckets() {
		require.Equal(t, wsA+":dep", u.GetDeployment())
		amounts[u.GetKind()] += u.GetAmount()
	}
	require.Positive(t, amounts[loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS])
	require.EqualValues(t, 6, amounts[loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS])

	// Revoked: B's remembered sampler stops at its next request.
	_, err = depA.RevokeDeployment(ctx, &loopsv1.RevokeDeploymentRequest{Name: "dep", Workspace: "team-b"})
	require.NoError(t, err)
	st, body = oai(t, url, keyB, shared)
	require.Equal(t, 404, st, "%v", body)

	// A restart keeps the deployment and its pins.
	stop()
	url, _ = depServer(t, dataDir)
	depA = loopsv1connect.NewDeploymentServiceClient(http.DefaultClient, url, withKey(keyA))
	got2 := must(depA.GetDeployment(ctx, &loopsv1.GetDeploymentRequest{Name: "dep"}))
	require.Equal(t, []string{"dep/c1", "dep/c2"}, got2.GetModels())
	st, body = oai(t, url, keyA, "dep/c1")
	require.Equal(t, 200, st, "%v", body)
	cks := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withKey(keyA))
	_, err = cks.DeleteCheckpoint(ctx, &loopsv1.DeleteCheckpointRequest{Path: c1})
	require.Equal(t, connect.CodeAlreadyExists, connect.CodeOf(err), "%v", err)

	// Replaced (deleted and created again): the name serves the new checkpoints at once,
	// also to the samplers remembered under it, which never keep the old ones.
	sampling := loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(keyA))
	held := must(sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{Deployment: "dep/c1"}))
	require.Equal(t, c1, held.GetModelPath())
	training = loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(keyA))
	ops = loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(keyA))
	run2 := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 2, TrainAttn: true},
	}))).GetTrainingRun().GetId()
	other := wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run2, Name: "c1",
		Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))).GetSaveWeights().GetPath()
	_, err = depA.DeleteDeployment(ctx, &loopsv1.DeleteDeploymentRequest{Name: "dep"})
	require.NoError(t, err)
	must(depA.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "dep", Checkpoints: []string{other}}))
	_, err = sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: held.GetId(), Prompt: []int32{1, 2, 3},
		Params: &loopsv1.SamplingParams{MaxTokens: 2}})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "a sampler of the old dep/c1: %v", err)
	require.Contains(t, err.Error(), "replaced")
	st, body = oai(t, url, keyA, "dep/c1") // the route's remembered sampler is replaced by one on the new c1
	require.Equal(t, 200, st, "%v", body)
	require.Equal(t, other, must(sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{Deployment: "dep/c1"})).GetModelPath())
	_, err = depA.DeleteDeployment(ctx, &loopsv1.DeleteDeploymentRequest{Name: "dep"})
	require.NoError(t, err)
	must(depA.CreateDeployment(ctx, &loopsv1.CreateDeploymentRequest{Name: "dep", Checkpoints: []string{c2}}))
	st, body = oai(t, url, keyA, "dep/c1")
	require.Equal(t, 404, st, "the remembered dep/c1 sampler must not serve a checkpoint the deployment no longer has: %v", body)
	st, got = oai(t, url, keyA, "dep")
	require.Equal(t, 200, st, "%v", got)
	_, want = oai(t, url, keyA, c2)
	require.Equal(t, completionText(t, want), completionText(t, got))

	// Deleted: the checkpoints are free again, and the name answers no more.
	_, err = depA.DeleteDeployment(ctx, &loopsv1.DeleteDeploymentRequest{Name: "dep"})
	require.NoError(t, err)
	_, err = cks.DeleteCheckpoint(ctx, &loopsv1.DeleteCheckpointRequest{Path: c1})
	require.NoError(t, err)
	st, body = oai(t, url, keyA, "dep/c2")
	require.Equal(t, 404, st, "%v", body)
}
