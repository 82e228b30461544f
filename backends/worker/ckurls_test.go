package worker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestCheckpointURLsThroughS3 has the torch worker write and read adapters through a real
// S3-compatible server with presigned URLs only, as a worker on another host with no file
// system shared with the gateway does: an adapter saved through upload URLs and committed
// comes back through download URLs bit for bit (weights and Adam state), samples the same
// as from a folder, and a download whose hash does not match fails the load.
func TestCheckpointURLsThroughS3(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	srv := s3test.Start(t)
	srv.SetEnv(t)
	// a worker whose checkpoint store is srv: it takes URLs of srv's origin only
	o := testOptions(t, t.TempDir())
	o.CheckpointOrigins = []string{srv.Endpoint}
	b, err := New(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	caps, err := b.Trainer().GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	require.True(t, caps.GetCheckpointUrls(), "the torch worker takes checkpoints as URLs")
	st, err := ckstore.Open(ctx, "s3://"+srv.NewBucket(t)+"/w", ckstore.Options{})
	require.NoError(t, err)
	ups := st.(ckstore.Uploads)
	tr := b.Trainer()
	dir := t.TempDir()

	// A trained adapter (non-zero B, Adam state) from the reference engine, loaded into the
	// worker from a folder.
	ref, err := reference.New(reference.Options{DataDir: sharedDir})
	require.NoError(t, err)
	lora := &loopsv1.LoraConfig{Rank: 4, Seed: 9, TrainAttn: true, TrainMlp: true}
	_, err = ref.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "t", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	_, err = ref.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{
		AdapterId: "t", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(2, 20, "cross_entropy")}}}})
	require.NoError(t, err)
	_, err = ref.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "t", Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}})
	require.NoError(t, err)
	start := filepath.Join(dir, "start")
	_, err = ref.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "t", Dir: start, IncludeOptimizer: true})
	require.NoError(t, err)
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "u", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "u", Dir: start, LoadOptimizer: true})
	require.NoError(t, err)

	// Saved through upload URLs, committed by the "gateway".
	const key = "ws/run/weights/c@1"
	names := []string{"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors"}
	up, err := ups.BeginUpload(ctx, key, names, time.Hour)
	require.NoError(t, err)
	req := &backendv1.SaveAdapterRequest{AdapterId: "u", IncludeOptimizer: true}
	for _, n := range names {
		req.Upload = append(req.Upload, &backendv1.FileURL{Name: n, Url: up.URLs[n]})
	}
	resp, err := tr.SaveAdapter(ctx, req)
	require.NoError(t, err)
	require.Len(t, resp.GetFiles(), 3)
	var files []ckstore.File
	for _, f := range resp.GetFiles() {
		require.Empty(t, f.GetUrl())
		files = append(files, ckstore.File{Name: f.GetName(), Size: f.GetSize(), SHA256: f.GetSha256()})
	}
	m, err := ups.CommitUpload(ctx, up, files)
	require.NoError(t, err, "the sizes the worker reports are the uploaded objects'")
	fetched := filepath.Join(dir, "fetched")
	_, err = st.Fetch(ctx, key, fetched)
	require.NoError(t, err, "the hashes the worker reports are the content's")

	// Read back through download URLs into another adapter: the same bytes.
	urls, err := ups.DownloadURLs(ctx, key, m, time.Hour)
	require.NoError(t, err)
	var download []*backendv1.FileURL
	for _, f := range m.Files {
		download = append(download, &backendv1.FileURL{Name: f.Name, Url: urls[f.Name], Size: f.Size, Sha256: f.SHA256})
	}
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "v", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "v", Download: download, LoadOptimizer: true})
	require.NoError(t, err)
	for _, id := range []string{"u", "v"} {
		_, err = tr.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: filepath.Join(dir, "out-"+id), IncludeOptimizer: true})
		require.NoError(t, err)
	}
	for _, n := range []string{"adapter_model.safetensors", "optimizer.safetensors"} {
		u := readTensors(t, filepath.Join(dir, "out-u", n))
		require.NotEmpty(t, u)
		require.Zero(t, maxAbsTensors(t, u, readTensors(t, filepath.Join(dir, "out-v", n))), "%s: loaded from URLs, the same tensors", n)
		require.Zero(t, maxAbsTensors(t, u, readTensors(t, filepath.Join(fetched, n))), "%s: uploaded, the same tensors", n)
	}

	// Sampling with the adapter as URLs is sampling with it as a folder.
	seed := uint64(5)
	sreq := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: []int32{72, 101, 108}, NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 0.9, TopP: 1, Seed: &seed}}
	sreq.AdapterDir = fetched
	fromDir, err := b.Sampler().Sample(ctx, sreq)
	require.NoError(t, err)
	sreq.AdapterDir, sreq.AdapterFiles = "", download
	for range 2 { // the second from the worker's cache
		fromURLs, err := b.Sampler().Sample(ctx, sreq)
		require.NoError(t, err)
		require.Equal(t, fromDir.GetResult().String(), fromURLs.GetResult().String())
	}

	// A URL of another origin is refused before anything is fetched.
	elsewhere := []*backendv1.FileURL{{Name: download[0].GetName(), Url: strings.Replace(download[0].GetUrl(), "127.0.0.1", "localhost", 1),
		Size: download[0].GetSize(), Sha256: download[0].GetSha256()}}
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "v", Download: elsewhere})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "not this worker's checkpoint store")

	// A file that does not match its hash fails the load, naming the file.
	bad := download[0]
	bad.Sha256 = strings.Repeat("0", 64)
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "v", Download: download})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "SHA-256")
}
