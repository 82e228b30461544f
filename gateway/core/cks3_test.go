package core

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// gatewayOn is a core on the reference engine (loops/tiny) in its own data dir, recording in
// the SQLite database at db (shared by the gateways of a test) and keeping checkpoints in cks.
type gatewayOn struct {
	core *Core
	svc  Services
	ctx  context.Context // workspace ws-a
	ctxB context.Context // workspace ws-b
}

func startGatewayOn(t *testing.T, db string, cks ckstore.Store, now func() time.Time) *gatewayOn {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	eng, err := reference.New(reference.Options{DataDir: dir, Threads: 1})
	require.NoError(t, err)
	st, err := sqlite.Open(t.Context(), db)
	require.NoError(t, err)
	c, err := New(t.Context(), st, eng, Options{DataDir: dir, CheckpointStore: cks, Now: now})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	return &gatewayOn{core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a"), ctxB: auth.WithWorkspace(t.Context(), "ws-b")}
}

// done returns a func that waits for an operation and requires that it succeeded.
func (g *gatewayOn) done(t *testing.T, ctx context.Context) func(*loopsv1.Operation, error) *loopsv1.Operation {
	return func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := g.svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(60 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
}

func tinyDatum() *loopsv1.Datum {
	d := &loopsv1.Datum{LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32},
	}}
	for j := range 12 {
		d.Tokens = append(d.Tokens, int32(65+j))
		d.LossFnInputs["target_tokens"].Int64Data = append(d.LossFnInputs["target_tokens"].Int64Data, int64(66+j))
		d.LossFnInputs["weights"].Float32Data = append(d.LossFnInputs["weights"].Float32Data, 1)
	}
	return d
}

// loss runs one forward_backward of tinyDatum on run and returns its loss:sum.
func (g *gatewayOn) loss(t *testing.T, ctx context.Context, run string) float64 {
	t.Helper()
	op, err := g.svc.Training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{tinyDatum()}})
	return g.done(t, ctx)(op, err).GetForwardBackward().GetMetrics()["loss:sum"]
}

// sample samples from a sampler on the checkpoint path with a fixed seed.
func (g *gatewayOn) sample(t *testing.T, ctx context.Context, path string) *loopsv1.SampleResult {
	t.Helper()
	smp, err := g.svc.Sampling.CreateSampler(ctx, &loopsv1.CreateSamplerRequest{ModelPath: path})
	require.NoError(t, err)
	seed := uint64(7)
	op, err := g.svc.Sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{72, 105}, NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 8, Temperature: 1, Seed: &seed}})
	return g.done(t, ctx)(op, err).GetSample()
}

// TestS3CheckpointsThroughTheCore runs a checkpoint's life through the tinker-facing core on
// an S3 checkpoint store (a real S3-compatible server): save (training and sampler
// checkpoints), list, load_state, a sampler, publish and unpublish, archive and file
// downloads, a second gateway (another core and data dir on the same database and bucket)
// that loads and samples the first one's checkpoints bit-identically, delete, and TTL
// expiry; after each removal the bucket holds no generation of it.
func TestS3CheckpointsThroughTheCore(t *testing.T) {
	cks := newS3Store(t)
	db := filepath.Join(t.TempDir(), "loops.db")
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	g1 := startGatewayOn(t, db, cks, clock)
	ctx := g1.ctx

	run := g1.done(t, ctx)(g1.svc.Training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 3, TrainAttn: true, TrainMlp: true},
	})).GetTrainingRunId()
	g1.loss(t, ctx, run)
	g1.done(t, ctx)(g1.svc.Training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 0.01}}))
	save := func(kind loopsv1.CheckpointKind, name string, ttl *int64) string {
		op, err := g1.svc.Training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: kind, Name: name, TtlSeconds: ttl})
		return g1.done(t, ctx)(op, err).GetSaveWeights().GetPath()
	}
	train := save(loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, "t1", nil)
	sampler := save(loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, "s1", nil)
	brief := save(loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, "brief", ptr(int64(60)))
	list, err := g1.svc.Checkpoints.ListCheckpoints(ctx, &loopsv1.ListCheckpointsRequest{TrainingRunId: run})
	require.NoError(t, err)
	require.Len(t, list.GetCheckpoints(), 3)
	keys, err := cks.List(ctx, "ws-a/"+run)
	require.NoError(t, err)
	require.Len(t, keys, 3, "one generation in the bucket per checkpoint")
	for _, ck := range list.GetCheckpoints() {
		m, err := cks.Stat(ctx, mustKey(t, g1.core, ck))
		require.NoError(t, err)
		require.Equal(t, m.Size(), ck.GetSizeBytes(), "the record's size is the stored files'")
	}

	// The loss the trained adapter gives; load_state of its checkpoint keeps it.
	want := g1.loss(t, ctx, run)
	g1.done(t, ctx)(g1.svc.Training.LoadWeights(ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: train, WithOptimizer: true}))
	require.Equal(t, want, g1.loss(t, ctx, run))
	wantSample := g1.sample(t, ctx, sampler)

	// Archive and file downloads stream from the bucket.
	web := httptest.NewServer(archiveHandler(g1.core))
	defer web.Close()
	files := map[string][]byte{}
	urls, err := g1.svc.Checkpoints.GetCheckpointFileURLs(ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: train})
	require.NoError(t, err)
	require.Contains(t, urls.GetUrls(), "adapter_model.safetensors")
	require.NotContains(t, urls.GetUrls(), completeMarker)
	for name, u := range urls.GetUrls() {
		code, body := httpGet(t, web, u)
		require.Equal(t, http.StatusOK, code, name)
		files[name] = []byte(body)
	}
	arch, err := g1.svc.Checkpoints.GetCheckpointArchiveURL(ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: train})
	require.NoError(t, err)
	code, body := httpGet(t, web, arch.GetUrl())
	require.Equal(t, http.StatusOK, code)
	tr := tar.NewReader(bytes.NewReader([]byte(body)))
	inTar := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got, err := io.ReadAll(tr)
		require.NoError(t, err)
		if hdr.Name != completeMarker {
			require.Equal(t, files[hdr.Name], got, hdr.Name)
			inTar++
		}
	}
	require.Equal(t, len(files), inTar)

	// Another workspace reads it only while it is public.
	_, err = g1.svc.Checkpoints.SetCheckpointPublic(ctx, &loopsv1.SetCheckpointPublicRequest{Path: train, Public: true})
	require.NoError(t, err)
	other := g1.done(t, g1.ctxB)(g1.svc.Training.CreateTrainingRun(g1.ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: train})).GetTrainingRunId()
	require.Equal(t, want, g1.loss(t, g1.ctxB, other))
	_, err = g1.svc.Checkpoints.SetCheckpointPublic(ctx, &loopsv1.SetCheckpointPublicRequest{Path: train, Public: false})
	require.NoError(t, err)
	_, err = g1.svc.Training.CreateTrainingRun(g1.ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: train})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// A second gateway on the same database and bucket, with nothing on its disk, loads
	// and samples the first one's checkpoints with the same results.
	g2 := startGatewayOn(t, db, cks, clock)
	copied := g2.done(t, g2.ctx)(g2.svc.Training.CreateTrainingRun(g2.ctx, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: train, WithOptimizer: true})).GetTrainingRunId()
	require.Equal(t, want, g2.loss(t, g2.ctx, copied))
	require.Equal(t, wantSample.String(), g2.sample(t, g2.ctx, sampler).String())
	web2 := httptest.NewServer(archiveHandler(g2.core))
	defer web2.Close()
	urls2, err := g2.svc.Checkpoints.GetCheckpointFileURLs(g2.ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: train})
	require.NoError(t, err)
	code, body = httpGet(t, web2, urls2.GetUrls()["adapter_model.safetensors"])
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, files["adapter_model.safetensors"], []byte(body))

	// Deleted on the first gateway: gone from the bucket, and for the second gateway.
	_, err = g1.svc.Checkpoints.DeleteCheckpoint(ctx, &loopsv1.DeleteCheckpointRequest{Path: train})
	require.NoError(t, err)
	_, err = g2.svc.Training.CreateTrainingRun(g2.ctx, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: train})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	keys, err = cks.List(ctx, "ws-a/"+run+"/weights")
	require.NoError(t, err)
	require.Empty(t, keys)

	// The TTL'd one expires with the janitor.
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	g1.core.sweep(ctx)
	_, err = g1.svc.Checkpoints.GetCheckpoint(ctx, &loopsv1.GetCheckpointRequest{Path: brief})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	keys, err = cks.List(ctx, "ws-a/"+run)
	require.NoError(t, err)
	require.Len(t, keys, 1, "only s1 is left")
}

func mustKey(t *testing.T, c *Core, ck *loopsv1.Checkpoint) string {
	t.Helper()
	key, err := c.ckpt.recordKey("ws-a", ck)
	require.NoError(t, err)
	return key
}

// qwen3Adapter writes the files of a Qwen3-0.6B-shaped rank-32 LoRA training checkpoint
// (28 layers; q,k,v,o,gate,up,down; hidden 1024, 16×128 query and 8×128 key/value heads,
// MLP 3072): 20.2 M float32 parameters, 80.7 MB of adapter and twice that of Adam moments,
// random bytes. largeBackend saves it and checks it on load.
type largeBackend struct {
	*fakeBackend
	mu   sync.Mutex
	sums map[string]string // file -> sha256 of what SaveAdapter wrote last
	seen map[string]string // file -> sha256 of what LoadAdapter found
}

// qwen3LoraParams is the parameter count of a rank-32 LoRA on every attention and MLP
// projection of Qwen3-0.6B.
const qwen3LoraParams = 28 * 32 * ((1024 + 2048) + 2*(1024+1024) + (2048 + 1024) + 3*(1024+3072))

func (b *largeBackend) Trainer() backends.Trainer { return b }

func (b *largeBackend) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	sizes := map[string]int64{"adapter_config.json": 600, "adapter_model.safetensors": 4 * qwen3LoraParams}
	if req.GetIncludeOptimizer() {
		sizes["optimizer.safetensors"] = 2 * 4 * qwen3LoraParams
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sums = map[string]string{}
	for name, size := range sizes {
		f, err := os.Create(filepath.Join(req.GetDir(), name))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.CopyN(io.MultiWriter(f, h), rand.Reader, size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		b.sums[name] = hex.EncodeToString(h.Sum(nil))
	}
	return &backendv1.SaveAdapterResponse{}, nil
}

func (b *largeBackend) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen = map[string]string{}
	for name := range b.sums {
		f, err := os.Open(filepath.Join(req.GetDir(), name))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		b.seen[name] = hex.EncodeToString(h.Sum(nil))
	}
	return &backendv1.LoadAdapterResponse{}, nil
}

// TestS3LargeAdapterRoundTrip saves a Qwen3-0.6B-shaped rank-32 training checkpoint (242
// MB with its optimizer state) through the core into S3 and loads it on a second gateway
// with an empty disk: every file arrives byte for byte. It takes tens of seconds on a busy
// 2-core machine, so it runs only with LOOPS_TEST_LARGE=1 (make test-large, part of make
// test).
func TestS3LargeAdapterRoundTrip(t *testing.T) {
	if os.Getenv("LOOPS_TEST_LARGE") != "1" {
		t.Skip("a 242 MB checkpoint: set LOOPS_TEST_LARGE=1 (make test-large)")
	}
	cks := newS3Store(t)
	dir := t.TempDir()
	be := &largeBackend{fakeBackend: newFakeBackend()}
	h, _ := openHarnessWith(t, dir, be, be.fakeBackend, Options{CheckpointStore: cks})
	run := h.newRun()
	start := time.Now()
	path, err := h.save(run, "big", false)
	require.NoError(t, err)
	saved := time.Since(start)

	dir2 := t.TempDir()
	be2 := &largeBackend{fakeBackend: newFakeBackend(), sums: be.sums}
	st2, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	defer st2.Close()
	c2, err := New(t.Context(), st2, be2, Options{DataDir: dir2, CheckpointStore: cks})
	require.NoError(t, err)
	defer c2.Close()
	h2 := &harness{t: t, dir: dir2, fake: be2.fakeBackend, core: c2, svc: c2.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	start = time.Now()
	op, err := h2.svc.Training.CreateTrainingRun(h2.ctx, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: path, WithOptimizer: true})
	require.NoError(t, err)
	done := h2.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	loaded := time.Since(start)
	require.Len(t, be.sums, 3)
	require.Equal(t, be.sums, be2.seen, "every file arrives byte for byte")
	t.Log(fmt.Sprintf("%.0f MB: save %s, load on a second gateway %s", float64(12*qwen3LoraParams+600)/1e6, saved.Round(time.Millisecond), loaded.Round(time.Millisecond)))
}

// heldSampler is the fake backend whose Sample waits at a gate and then fails unless the
// adapter folder it was given still exists.
type heldSampler struct {
	*fakeBackend
	gate    chan struct{}
	entered chan string
}

func (g *heldSampler) Sampler() backends.Sampler { return g }

func (g *heldSampler) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	g.entered <- req.GetAdapterDir()
	<-g.gate
	if _, err := os.Stat(filepath.Join(req.GetAdapterDir(), "adapter_model.safetensors")); err != nil {
		return nil, err
	}
	return g.fakeBackend.Sample(ctx, req)
}

// TestS3SampleKeepsItsAdapter: a sample whose sampler leaves memory while the sample waits
// or runs keeps the sampler's cached checkpoint copy until it is done, even with a cache
// bound that keeps nothing unused; then the copy goes.
func TestS3SampleKeepsItsAdapter(t *testing.T) {
	cks := newS3Store(t)
	be := &heldSampler{fakeBackend: newFakeBackend(), gate: make(chan struct{}), entered: make(chan string, 1)}
	h, _ := openHarnessWith(t, t.TempDir(), be, be.fakeBackend, Options{CheckpointStore: cks, CheckpointCacheBytes: 1})
	run := h.newRun()
	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "s"})
	require.NoError(t, err)
	path := h.wait(op).GetSaveWeights().GetPath()
	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{ModelPath: path})
	require.NoError(t, err)
	sample, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1}, NumSamples: 1, Params: &loopsv1.SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	dir := <-be.entered
	require.NotEmpty(t, dir)
	st, err := h.core.samplers.get(h.ctx, "ws-a", smp.GetId())
	require.NoError(t, err)
	h.core.samplers.mu.Lock()
	h.core.samplers.dropLocked(st) // the sampler leaves memory while its sample runs
	h.core.samplers.mu.Unlock()
	close(be.gate)
	done := h.wait(sample)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	require.Eventually(t, func() bool { _, err := os.Stat(dir); return os.IsNotExist(err) }, 10*time.Second, 10*time.Millisecond,
		"released by the sample and the sampler, the copy goes past the cache bound")
}
