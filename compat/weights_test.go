package compat

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// fakeWeights is the fake core's WeightsAccessService: CopyWeights records its request.
type fakeWeights struct {
	f *fakeCore
}

func (w fakeWeights) CreateWeightsAccessToken(ctx context.Context, r *loopsv1.CreateWeightsAccessTokenRequest) (*loopsv1.CreateWeightsAccessTokenResponse, error) {
	return loopsv1connect.UnimplementedWeightsAccessServiceHandler{}.CreateWeightsAccessToken(ctx, r)
}

func (w fakeWeights) ListWeightsAccessTokens(context.Context, *loopsv1.ListWeightsAccessTokensRequest) (*loopsv1.ListWeightsAccessTokensResponse, error) {
	return &loopsv1.ListWeightsAccessTokensResponse{}, nil
}

func (w fakeWeights) RevokeWeightsAccessToken(context.Context, *loopsv1.RevokeWeightsAccessTokenRequest) (*loopsv1.RevokeWeightsAccessTokenResponse, error) {
	return &loopsv1.RevokeWeightsAccessTokenResponse{}, nil
}

func (w fakeWeights) CopyWeights(_ context.Context, r *loopsv1.CopyWeightsRequest) (*loopsv1.CopyWeightsResponse, error) {
	if err := w.f.enter("CopyWeights", r); err != nil {
		return nil, err
	}
	return &loopsv1.CopyWeightsResponse{TinkerPath: "tinker://run-copy/weights/c"}, nil
}

// fakeClients is the fake core's SamplerClientService: every join of a known sampler is 1.
type fakeClients struct {
	f *fakeCore
}

func (c fakeClients) JoinSampler(_ context.Context, r *loopsv1.JoinSamplerRequest) (*loopsv1.JoinSamplerResponse, error) {
	if err := c.f.enter("JoinSampler", r); err != nil {
		return nil, err
	}
	return &loopsv1.JoinSamplerResponse{ClientCounter: 1}, nil
}

// TestCopyWeightsRoute: the token comes from the SDK's header (or the body, not both
// different), the idempotency key from X-Idempotency-Key; the answer is {"tinker_path"} at
// once; session-slot addressing is a 400 saying what to send.
func TestCopyWeightsRoute(t *testing.T) {
	e := newEnv(t)
	post := func(body string, headers map[string]string) resp {
		t.Helper()
		h := map[string]string{"Content-Type": "application/json"}
		for k, v := range headers {
			h[k] = v
		}
		return e.do(http.MethodPost, "/api/v1/copy_weights", []byte(body), h)
	}
	r := post(`{"source_path":"tinker://r/weights/c","destination_project_id":"proj","ttl_seconds":3600}`,
		map[string]string{"X-Tinker-Weights-Access-Token": "lwat_secret", "X-Idempotency-Key": "k-1"})
	require.Equal(t, 200, r.status, string(r.body))
	require.JSONEq(t, `{"tinker_path":"tinker://run-copy/weights/c"}`, string(r.body))
	ttl := int64(3600)
	require.Empty(t, cmp.Diff(&loopsv1.CopyWeightsRequest{SourcePath: "tinker://r/weights/c", DestinationProjectId: "proj",
		TtlSeconds: &ttl, WeightsAccessToken: "lwat_secret", IdempotencyKey: "k-1"}, e.core.lastReq("CopyWeights"), protocmp.Transform()))

	r = post(`{"source_path":"tinker://r/weights/c","weights_access_token":"in-body"}`, nil)
	require.Equal(t, 200, r.status)
	require.Equal(t, "in-body", e.core.lastReq("CopyWeights").(*loopsv1.CopyWeightsRequest).GetWeightsAccessToken())

	r = post(`{"source_path":"tinker://r/weights/c","weights_access_token":"a"}`, map[string]string{"X-Tinker-Weights-Access-Token": "b"})
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "differ")
	r = post(`{"destination_project_id":"p"}`, nil)
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "source_path")

	// SDK 0.30: a session's slot; the copy inherits the session's project, the slot keys retries.
	sid := e.postJSON("/api/v1/create_session", `{"tags":[],"user_metadata":{},"sdk_version":"0.30.4","project_id":"proj-s"}`).json(t)["session_id"].(string)
	e.core.sessions[sid].ProjectId = "proj-s" // as the core records it
	r = post(`{"source_path":"tinker://r/weights/c","session_id":"`+sid+`","model_seq_id":3,"weights_access_token":"tok"}`, nil)
	require.Equal(t, 200, r.status, string(r.body))
	require.Empty(t, cmp.Diff(&loopsv1.CopyWeightsRequest{SourcePath: "tinker://r/weights/c", DestinationProjectId: "proj-s",
		WeightsAccessToken: "tok", IdempotencyKey: sid + ":train:3"}, e.core.lastReq("CopyWeights"), protocmp.Transform()))
	r = post(`{"source_path":"tinker://r/weights/c","session_id":"nope","model_seq_id":0}`, nil)
	require.Equal(t, 404, r.status)
	r = post(`{"source_path":"tinker://r/weights/c","session_id":"`+sid+`"}`, nil)
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "model_seq_id")
}

// TestJoinSamplingSessionRoute: the answer carries client_counter and the type literal;
// client/config turns the SDK's join on.
func TestJoinSamplingSessionRoute(t *testing.T) {
	e := newEnv(t)
	r := e.postJSON("/api/v1/join_sampling_session", `{"sampling_session_id":"smp-1","type":"join_sampling_session"}`)
	require.Equal(t, 200, r.status, string(r.body))
	require.JSONEq(t, `{"client_counter":1,"type":"join_sampling_session"}`, string(r.body))
	require.Equal(t, "smp-1", e.core.lastReq("JoinSampler").(*loopsv1.JoinSamplerRequest).GetSamplerId())
	require.Equal(t, 400, e.postJSON("/api/v1/join_sampling_session", `{}`).status)
	require.Equal(t, true, e.postJSON("/api/v1/client/config", `{"sdk_version":"0.38.0"}`).json(t)["sample_join_sampling_session"])
}
