package core

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// urlBackend is the fake backend as a worker on another host: it takes checkpoints only as
// presigned URLs (checkpoint_urls), uploading what it saves and downloading (and
// verifying) what it loads and samples with over plain HTTP.
type urlBackend struct {
	*fakeBackend
	mu      sync.Mutex
	content string            // adapter_model.safetensors of the next saves, when set
	loaded  map[string]string // file -> content of the last load
	sampled []*backendv1.FileURL
}

func (b *urlBackend) set(content string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.content = content
}

func (b *urlBackend) Trainer() backends.Trainer { return b }
func (b *urlBackend) Sampler() backends.Sampler { return b }

func (b *urlBackend) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	caps, err := b.fakeBackend.GetCapabilities(ctx, req)
	caps.CheckpointUrls = true
	return caps, err
}

func (b *urlBackend) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	if req.GetDir() != "" || len(req.GetUpload()) == 0 {
		return nil, fmt.Errorf("a worker on another host needs upload URLs, got dir %q", req.GetDir())
	}
	resp := &backendv1.SaveAdapterResponse{}
	for _, u := range req.GetUpload() {
		if u.GetName() == "optimizer.safetensors" && !req.GetIncludeOptimizer() {
			continue
		}
		body := []byte(req.GetAdapterId() + ":" + u.GetName())
		b.mu.Lock()
		if u.GetName() == "adapter_model.safetensors" && b.content != "" {
			body = []byte(b.content)
		}
		b.mu.Unlock()
		hr, err := http.NewRequestWithContext(ctx, http.MethodPut, u.GetUrl(), bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		res, err := http.DefaultClient.Do(hr)
		if err != nil {
			return nil, err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("PUT %s: %s", u.GetName(), res.Status)
		}
		h := sha256.Sum256(body)
		resp.Files = append(resp.Files, &backendv1.FileURL{Name: u.GetName(), Size: int64(len(body)), Sha256: hex.EncodeToString(h[:])})
	}
	return resp, nil
}

func download(files []*backendv1.FileURL) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range files {
		res, err := http.Get(f.GetUrl())
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return nil, err
		}
		h := sha256.Sum256(body)
		if int64(len(body)) != f.GetSize() || hex.EncodeToString(h[:]) != f.GetSha256() {
			return nil, fmt.Errorf("%s does not match its size and hash", f.GetName())
		}
		out[f.GetName()] = string(body)
	}
	return out, nil
}

func (b *urlBackend) LoadAdapter(_ context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	if req.GetDir() != "" || len(req.GetDownload()) == 0 {
		return nil, fmt.Errorf("a worker on another host needs download URLs, got dir %q", req.GetDir())
	}
	got, err := download(req.GetDownload())
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.loaded = got
	return &backendv1.LoadAdapterResponse{}, nil
}

func (b *urlBackend) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	if req.GetAdapterDir() != "" {
		return nil, fmt.Errorf("a worker on another host cannot read %q", req.GetAdapterDir())
	}
	if _, err := download(req.GetAdapterFiles()); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.sampled = req.GetAdapterFiles()
	b.mu.Unlock()
	return b.fakeBackend.Sample(ctx, req)
}

// TestS3CheckpointsThroughWorkerURLs: with an S3 checkpoint store and a backend that takes
// URLs, checkpoints never touch the gateway's disk: the backend uploads a save through
// presigned PUT URLs (committed with the checkpoint_complete marker and the sizes and
// hashes it reports), downloads a load_state and a sampler's adapter through presigned GET
// URLs, and downloads still stream from the bucket.
func TestS3CheckpointsThroughWorkerURLs(t *testing.T) {
	cks := newS3Store(t)
	dir := t.TempDir()
	be := &urlBackend{fakeBackend: newFakeBackend()}
	h, _ := openHarnessWith(t, dir, be, be.fakeBackend, Options{CheckpointStore: cks})
	require.NotNil(t, h.core.ckpt.URLs(), "the core sends URLs")
	run := h.newRun()
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	ck, _, err := h.core.resolveOwned(h.ctx, "ws-a", path)
	require.NoError(t, err)
	m, err := cks.Stat(h.ctx, mustKey(t, h.core, ck))
	require.NoError(t, err)
	var names []string
	for _, f := range m.Files {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"adapter_config.json", "adapter_model.safetensors", ckfiles.CompleteMarker, "optimizer.safetensors"}, names)
	require.Equal(t, m.Size(), ck.GetSizeBytes())

	op, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path, WithOptimizer: true})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	require.Equal(t, run+":adapter_model.safetensors", be.loaded["adapter_model.safetensors"])
	require.Equal(t, run+":optimizer.safetensors", be.loaded["optimizer.safetensors"])

	sop, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "s"})
	require.NoError(t, err)
	spath := h.wait(sop).GetSaveWeights().GetPath()
	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{ModelPath: spath})
	require.NoError(t, err)
	sample, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1}, NumSamples: 1, Params: &loopsv1.SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	done = h.wait(sample)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	require.Len(t, be.sampled, 3, "config, weights and marker of the sampler checkpoint")

	for _, sub := range []string{ckfiles.StagingFolder, ckfiles.CacheFolder} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		require.NoError(t, err)
		require.Empty(t, entries, "nothing on the gateway's disk: %s", sub)
	}
	web := httptest.NewServer(archiveHandler(h.core))
	defer web.Close()
	urls, err := h.svc.Checkpoints.GetCheckpointFileURLs(h.ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: path})
	require.NoError(t, err)
	code, body := httpGet(t, web, urls.GetUrls()["adapter_model.safetensors"])
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, run+":adapter_model.safetensors", body)
}
