package reference

import (
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestEmbed: SampleRequest.embed is the mean over the prompt of the final normalised hidden
// state, with a sampler adapter applied, within 1e-5 of a float64 forward pass of loops/tiny
// (loaded from the folder tiny.Write writes) for a prompt of two forward chunks; it
// samples nothing, and sampling options are refused.
func TestEmbed(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "embed", 8, 3)
	fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "embed", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
	_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "embed", Adam: &loopsv1.AdamParams{LearningRate: 1e-2}})
	require.NoError(t, err)
	adDir := t.TempDir()
	_, err = e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "embed", Dir: adDir})
	require.NoError(t, err)

	modelDir := filepath.Join(t.TempDir(), "tiny")
	require.NoError(t, tiny.Write(modelDir))
	m, err := nn.Load[float64](modelDir)
	require.NoError(t, err)
	ad, err := nn.LoadAdapter(adDir, m, false, 64)
	require.NoError(t, err)

	prompt := make([]int, nn.PrefillChunk+45)
	for i := range prompt {
		prompt[i] = (i*53 + 19) % tiny.VocabLen
	}
	want := func(ad *nn.Adapter[float64]) []float64 {
		pos, caches := make([]int, len(prompt)), make([]*nn.KVCache[float64], len(prompt))
		c := m.NewCache()
		for i := range prompt {
			pos[i], caches[i] = i, c
		}
		h := m.Step(prompt, pos, caches, ad)
		D := m.Cfg.Hidden
		out := make([]float64, D)
		for i := range prompt {
			for d := range D {
				out[d] += h[i*D+d] / float64(len(prompt))
			}
		}
		return out
	}
	for _, tc := range []struct {
		dir string
		ad  *nn.Adapter[float64]
	}{{"", nil}, {adDir, ad}} {
		r, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: tc.dir, Prompt: toks32(prompt), Embed: true})
		require.NoError(t, err)
		require.Empty(t, r.GetResult().GetSequences())
		got := r.GetResult().GetEmbedding()
		w := want(tc.ad)
		require.Len(t, got, len(w))
		for d := range w {
			require.InDelta(t, w[d], float64(got[d]), 1e-5, "adapter %q, dimension %d", tc.dir, d)
		}
	}
	base, tuned := want(nil), want(ad)
	diff := 0.0
	for d := range base {
		diff = max(diff, base[d]-tuned[d], tuned[d]-base[d])
	}
	require.Greater(t, diff, 1e-4, "the adapter changes the embedding")

	for _, req := range []*backendv1.SampleRequest{
		{Params: &loopsv1.SamplingParams{MaxTokens: 1}},
		{NumSamples: 2},
		{PromptLogprobs: true},
		{Prompt: make([]int32, 4097)},
		{Prompt: []int32{tiny.VocabLen}},
		{Prompt: []int32{}},
	} {
		req.BaseModel, req.Embed = tiny.Name, true
		if req.Prompt == nil {
			req.Prompt = []int32{1, 2}
		}
		_, err := e.Sample(ctx, req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	}
}
