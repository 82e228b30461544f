package opsvc_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/stretchr/testify/require"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/loops-dev/loops/gateway/opsvc"
	// Linked in, as in the gateway's binary, and never to be revealed.
	_ "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

func serve(t *testing.T, h *opsvc.Health) string {
	t.Helper()
	mux := http.NewServeMux()
	opsvc.Register(mux, h)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func h2c() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

// TestReflectionRevealsOnlyThePublicSchema: reflection lists the loops.v1 services and
// resolves their files, their imports and the health service, but no file or symbol
// outside them, though the binary links them in (loops.backend.v1, the workers' protocol).
func TestReflectionRevealsOnlyThePublicSchema(t *testing.T) {
	h := opsvc.NewHealth(t.Context(), opsvc.HealthOptions{Services: opsvc.LoopsServices()})
	defer h.Close()
	url := serve(t, h)
	{
		stream := grpcreflect.NewClient(h2c(), url, connect.WithGRPC()).NewStream(t.Context())
		names, err := stream.ListServices()
		require.NoError(t, err)
		require.Contains(t, names, protoreflect.FullName("loops.v1.TrainingService"))
		require.Contains(t, names, protoreflect.FullName(grpchealth.HealthV1ServiceName))
		for _, n := range names {
			require.True(t, n.Parent() == "loops.v1" || strings.HasPrefix(string(n), "grpc."), "listed %s", n)
		}
		files, err := stream.FileContainingSymbol("loops.v1.TrainingService")
		require.NoError(t, err)
		var paths []string
		for _, f := range files {
			paths = append(paths, f.GetName())
		}
		require.Contains(t, paths, "google/api/annotations.proto")
		_, err = stream.FileByFilename("loops/v1/types.proto")
		require.NoError(t, err)
		_, err = stream.FileContainingSymbol(grpchealth.HealthV1ServiceName)
		require.NoError(t, err)
		_, err = stream.FileByFilename("loops/backend/v1/backend.proto")
		require.Error(t, err, "a private file")
		_, err = stream.FileContainingSymbol("loops.backend.v1.TrainerService")
		require.Error(t, err, "a private symbol")
		nums, err := stream.AllExtensionNumbers("google.protobuf.MethodOptions")
		require.NoError(t, err)
		require.Contains(t, nums, protoreflect.FieldNumber(72295728), "google.api.http")
		_, _ = stream.Close()
	}

	// v1alpha, as older clients ask.
	alpha := connect.NewClient[reflectionv1alpha.ServerReflectionRequest, reflectionv1alpha.ServerReflectionResponse](
		h2c(), url+"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", connect.WithGRPC())
	bidi := alpha.CallBidiStream(t.Context())
	ask := func(req *reflectionv1alpha.ServerReflectionRequest) *reflectionv1alpha.ServerReflectionResponse {
		require.NoError(t, bidi.Send(req))
		res, err := bidi.Receive()
		require.NoError(t, err)
		return res
	}
	res := ask(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}})
	var listed []string
	for _, s := range res.GetListServicesResponse().GetService() {
		listed = append(listed, s.GetName())
	}
	require.Contains(t, listed, "loops.v1.SessionService")
	res = ask(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "loops.backend.v1.SamplerService"}})
	require.EqualValues(t, connect.CodeNotFound, res.GetErrorResponse().GetErrorCode())
	res = ask(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "loops.v1.SamplingService"}})
	require.NotEmpty(t, res.GetFileDescriptorResponse().GetFileDescriptorProto())
	require.NoError(t, bidi.CloseRequest())
	require.NoError(t, bidi.CloseResponse())
}

// TestWatchesAreBounded: one Watch more than MaxWatchers is refused with
// ResourceExhausted; a closed one frees its place.
func TestWatchesAreBounded(t *testing.T) {
	h := opsvc.NewHealth(t.Context(), opsvc.HealthOptions{MaxWatchers: 2})
	defer h.Close()
	req := &grpchealth.CheckRequest{}
	stop1, err := h.Watch(t.Context(), req, func() {})
	require.NoError(t, err)
	_, err = h.Watch(t.Context(), req, func() {})
	require.NoError(t, err)
	_, err = h.Watch(t.Context(), req, func() {})
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	stop1()
	_, err = h.Watch(t.Context(), req, func() {})
	require.NoError(t, err)
	_, err = h.Watch(t.Context(), &grpchealth.CheckRequest{Service: "nope.Service"}, func() {})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

// TestProbeDecidesHealth: a failing probe makes Check NOT_SERVING from the start, and a
// drain does for good; watchers are told of each change.
func TestProbeDecidesHealth(t *testing.T) {
	failing := "the store is down"
	h := opsvc.NewHealth(t.Context(), opsvc.HealthOptions{Probe: func(context.Context) string { return failing }})
	defer h.Close()
	res, err := h.Check(t.Context(), &grpchealth.CheckRequest{})
	require.NoError(t, err)
	require.Equal(t, grpchealth.StatusNotServing, res.Status)

	ok := opsvc.NewHealth(t.Context(), opsvc.HealthOptions{})
	defer ok.Close()
	changes := 0
	_, err = ok.Watch(t.Context(), &grpchealth.CheckRequest{}, func() { changes++ })
	require.NoError(t, err)
	res, err = ok.Check(t.Context(), &grpchealth.CheckRequest{})
	require.NoError(t, err)
	require.Equal(t, grpchealth.StatusServing, res.Status)
	ok.Drain()
	ok.Drain()
	require.Equal(t, 1, changes)
	res, err = ok.Check(t.Context(), &grpchealth.CheckRequest{})
	require.NoError(t, err)
	require.Equal(t, grpchealth.StatusNotServing, res.Status)
	rec := httptest.NewRecorder()
	ok.Readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	rec = httptest.NewRecorder()
	ok.Livez(rec, httptest.NewRequest(http.MethodGet, "/livez", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.True(t, slices.Contains(opsvc.LoopsServices(), "loops.v1.PoolService"))
}
