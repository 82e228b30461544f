package core

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// peftBackend is the fake backend writing real PEFT-layout checkpoints (the layout every
// checkpoint has in the store, before and after downloads learned Tinker's): a q_proj and
// an lm_head LoRA, their Adam moments, and adapter_config.json.
type peftBackend struct {
	*fakeBackend
	unembed string // the loops.unembed metadata written, if any
	config  string // adapter_config.json, when not the default
}

func (b peftBackend) Trainer() backends.Trainer { return b }
func (b peftBackend) Sampler() backends.Sampler { return b }

var peftTensors = []string{
	"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight",
	"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
}

func (b peftBackend) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	resp, err := b.fakeBackend.SaveAdapter(ctx, req)
	if err != nil {
		return nil, err
	}
	var ws, os_ []safetensors.Tensor
	for i, n := range peftTensors {
		ws = append(ws, safetensors.Tensor{Name: n, Shape: []int64{1, 2}, Data: []float32{float32(i), 0.5}})
		os_ = append(os_, safetensors.Tensor{Name: n + ".exp_avg", Shape: []int64{1, 2}, Data: []float32{1, 2}})
	}
	meta := map[string]string{"format": "pt"}
	if b.unembed != "" {
		meta[peft.UnembedMetaKey] = b.unembed
	}
	if _, err := safetensors.Write(filepath.Join(req.GetDir(), "adapter_model.safetensors"), ws, meta); err != nil {
		return nil, err
	}
	if req.GetIncludeOptimizer() {
		if _, err := safetensors.Write(filepath.Join(req.GetDir(), "optimizer.safetensors"), os_, map[string]string{"step": "1"}); err != nil {
			return nil, err
		}
	}
	cfg := `{"peft_type": "LORA", "r": 1, "lora_alpha": 32, "target_modules": ["q_proj", "lm_head"]}`
	if b.config != "" {
		cfg = b.config
	}
	return resp, os.WriteFile(filepath.Join(req.GetDir(), "adapter_config.json"), []byte(cfg), 0o644)
}

// names lists the tensor names of a safetensors image.
func names(t *testing.T, b []byte) []string {
	t.Helper()
	f, err := safetensors.Parse(bytes.NewReader(b), int64(len(b)), safetensors.Limits{})
	require.NoError(t, err)
	var out []string
	for k := range f.Tensors {
		out = append(out, k)
	}
	return out
}

// TestDownloadsInTinkerLayout: a checkpoint stored in PEFT's layout downloads, file by file
// (the tinker 0.38 CLI) and as a tar (older SDKs), in Tinker's: the unembedding's LoRA is
// model.unembed_tokens, with the announced sizes; the stored files are unchanged, so the
// checkpoint still loads with its optimizer state.
func TestDownloadsInTinkerLayout(t *testing.T) {
	be := peftBackend{fakeBackend: newFakeBackend(), unembed: peft.UnembedShared}
	h, _ := openHarnessWith(t, t.TempDir(), be, be.fakeBackend, Options{})
	run := h.newRun()
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	srv := httptest.NewServer(archiveHandler(h.core))
	defer srv.Close()
	tinkerNames := []string{
		"base_model.model.model.unembed_tokens.lora_A.weight", "base_model.model.model.unembed_tokens.lora_B.weight",
		"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
	}
	check := func(files map[string][]byte) {
		t.Helper()
		require.ElementsMatch(t, tinkerNames, names(t, files["adapter_model.safetensors"]))
		var cfg map[string]any
		require.NoError(t, json.Unmarshal(files["adapter_config.json"], &cfg))
		require.Equal(t, []any{"q_proj", "unembed_tokens"}, cfg["target_modules"])
		require.EqualValues(t, 32, cfg["lora_alpha"])
		if o, ok := files["optimizer.safetensors"]; ok {
			require.Contains(t, names(t, o), "base_model.model.model.unembed_tokens.lora_B.weight.exp_avg")
		}
	}

	urls, err := h.svc.Checkpoints.GetCheckpointFileURLs(h.ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: path})
	require.NoError(t, err)
	files := map[string][]byte{}
	for name, u := range urls.GetUrls() {
		resp, err := http.Get(srv.URL + u)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.Equal(t, strconv.Itoa(len(b)), resp.Header.Get("Content-Length"), name)
		files[name] = b
	}
	check(files)

	arch, err := h.svc.Checkpoints.GetCheckpointArchiveURL(h.ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: path})
	require.NoError(t, err)
	resp, err := http.Get(srv.URL + arch.GetUrl())
	require.NoError(t, err)
	defer resp.Body.Close()
	tr := tar.NewReader(resp.Body)
	files = map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		files[hdr.Name], err = io.ReadAll(tr)
		require.NoError(t, err)
	}
	require.Contains(t, files, "optimizer.safetensors")
	check(files)

	// Stored as written (PEFT's layout): it loads with its optimizer state as before.
	ck, _, err := h.core.resolveOwned(h.ctx, "ws-a", path)
	require.NoError(t, err)
	ref, ok, err := h.core.ckpt.Open(h.ctx, mustKey(t, h.core, ck))
	require.NoError(t, err)
	require.True(t, ok)
	stored, err := os.ReadFile(filepath.Join(ref.Dir(), "adapter_model.safetensors"))
	ref.Release()
	require.NoError(t, err)
	require.ElementsMatch(t, peftTensors, names(t, stored))
	op, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path, WithOptimizer: true})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
}

// TestHeadOnlyTiedDownloadRefused: an adapter an engine saved with the head-only rule on a
// model with tied embeddings (loops.unembed = head-only: trained before the shared-matrix
// rule) is refused in Tinker's layout, file by file and as a tar, with a 400-class error
// saying why and what to use instead (the cookbook would merge it into the embedding too).
func TestHeadOnlyTiedDownloadRefused(t *testing.T) {
	be := peftBackend{fakeBackend: newFakeBackend(), unembed: peft.UnembedHeadOnly}
	testHeadOnlyTiedRefused(t, be)
}

// TestOldHeadOnlyTiedDownloadRefused: a checkpoint written before engines recorded the
// unembedding's rule (no loops.unembed metadata) and without ensure_weight_tying, on a base
// model with tied embeddings (ModelInfo.tied_embeddings), follows the head-only rule; served
// straight from the store (the SDK's archive URL, never saved again) it is refused as the
// CLI's path refuses it once the engine has saved it again, file by file and as a tar. The
// same files with ensure_weight_tying, or on an untied base model, download converted.
func TestOldHeadOnlyTiedDownloadRefused(t *testing.T) {
	const old = `{"peft_type": "LORA", "r": 1, "lora_alpha": 32, "target_modules": ["q_proj", "lm_head"], "base_model_name_or_path": "fake/model"}`
	tie := func(be peftBackend, tied bool) peftBackend {
		be.fakeBackend.tiedEmbeddings = tied
		return be
	}
	testHeadOnlyTiedRefused(t, tie(peftBackend{fakeBackend: newFakeBackend(), config: old}, true))

	for name, be := range map[string]peftBackend{
		"ensure_weight_tying": tie(peftBackend{fakeBackend: newFakeBackend(), config: strings.Replace(old, "{", `{"ensure_weight_tying": true, `, 1)}, true),
		"untied":              tie(peftBackend{fakeBackend: newFakeBackend(), config: old}, false),
	} {
		h, _ := openHarnessWith(t, t.TempDir(), be, be.fakeBackend, Options{})
		path, err := h.save(h.newRun(), "c", false)
		require.NoError(t, err)
		srv := httptest.NewServer(archiveHandler(h.core))
		arch, err := h.svc.Checkpoints.GetCheckpointArchiveURL(h.ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: path})
		require.NoError(t, err)
		resp, err := http.Get(srv.URL + arch.GetUrl())
		require.NoError(t, err)
		tr := tar.NewReader(resp.Body)
		found := false
		for {
			hd, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, name)
			if filepath.Base(hd.Name) == peft.AdapterWeightsFile {
				b, err := io.ReadAll(tr)
				require.NoError(t, err)
				require.Contains(t, names(t, b), "base_model.model.model.unembed_tokens.lora_A.weight", name)
				found = true
			}
		}
		resp.Body.Close()
		srv.Close()
		require.True(t, found, name)
	}
}

func testHeadOnlyTiedRefused(t *testing.T, be peftBackend) {
	t.Helper()
	h, _ := openHarnessWith(t, t.TempDir(), be, be.fakeBackend, Options{})
	run := h.newRun()
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	srv := httptest.NewServer(archiveHandler(h.core))
	defer srv.Close()
	urls, err := h.svc.Checkpoints.GetCheckpointFileURLs(h.ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: path})
	require.NoError(t, err)
	u, ok := urls.GetUrls()["adapter_model.safetensors"]
	require.True(t, ok)
	resp, err := http.Get(srv.URL + u)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	require.Contains(t, string(b), "tied embeddings")
	require.Contains(t, string(b), "loops checkpoints export --format merged")

	arch, err := h.svc.Checkpoints.GetCheckpointArchiveURL(h.ctx, &loopsv1.GetCheckpointArchiveURLRequest{Path: path})
	require.NoError(t, err)
	resp, err = http.Get(srv.URL + arch.GetUrl())
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	require.Contains(t, string(b), "tied embeddings")
}
