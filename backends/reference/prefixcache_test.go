package reference

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference/prefix"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// prefixEngines returns an engine with the prefix cache and one without, on the shared
// test data folder, and two saved adapters of different weights.
func prefixEngines(t *testing.T) (on, off *Engine, dirs []string) {
	t.Helper()
	engine(t) // writes the tiny model to engDir
	on, err := New(Options{DataDir: engDir, MaxLoraRank: 32})
	require.NoError(t, err)
	off, err = New(Options{DataDir: engDir, MaxLoraRank: 32, PrefixCacheBytes: -1})
	require.NoError(t, err)
	t.Cleanup(func() { on.Close(); off.Close() })
	for i, rank := range []int{4, 8} {
		id := fmt.Sprintf("prefix-%d", i)
		createAdapter(t, on, id, rank, uint64(11+i))
		fb(t, on, &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
		_, err := on.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: &loopsv1.AdamParams{LearningRate: 1e-2}})
		require.NoError(t, err)
		dir := t.TempDir()
		_, err = on.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: dir})
		require.NoError(t, err)
		dirs = append(dirs, dir)
	}
	return on, off, dirs
}

func prefixSample(t *testing.T, e *Engine, ws, dir string, prompt []int, seed uint64) *loopsv1.SampleResult {
	t.Helper()
	r, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Workspace: ws, AdapterDir: dir, Prompt: toks32(prompt), NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 1, TopP: 0.95, Seed: &seed}})
	require.NoError(t, err)
	return r.Result
}

// TestPrefixCacheBitsEqual: prompts that share prefixes, of lengths on both sides of the
// row-kernel and chunk bounds (64, 512), with the base model and two adapters, sampled with
// seeds: the engine with the cache gives the tokens and log-probs, bit for bit, of the
// engine without it, and serves most prompt tokens from the cache.
func TestPrefixCacheBitsEqual(t *testing.T) {
	on, off, dirs := prefixEngines(t)
	long := make([]int, 600)
	for i := range long {
		long[i] = (i*37 + 11) % 509
	}
	var prompts [][]int
	for _, n := range []int{17, 40, 64, 65, 100, 200, 511, 512, 513, 600} {
		prompts = append(prompts, long[:n])
	}
	// a multi-turn episode: each prompt the one before plus a new tail
	turn := append([]int(nil), long[:90]...)
	for i := range 4 {
		turn = append(turn, long[300+i*20:300+i*20+13+i]...)
		prompts = append(prompts, append([]int(nil), turn...))
	}
	hits := 0
	for _, dir := range append([]string{""}, dirs...) {
		for i, p := range prompts {
			want := prefixSample(t, off, "ws", dir, p, uint64(i))
			for pass := range 2 {
				got := prefixSample(t, on, "ws", dir, p, uint64(i))
				require.Len(t, got.Sequences, len(want.Sequences))
				for s := range want.Sequences {
					require.Equal(t, want.Sequences[s].Tokens, got.Sequences[s].Tokens, "adapter %q prompt %d pass %d", dir, len(p), pass)
					require.Equal(t, want.Sequences[s].Logprobs, got.Sequences[s].Logprobs, "adapter %q prompt %d pass %d", dir, len(p), pass)
				}
				require.Zero(t, want.PromptCachedTokens)
				require.Less(t, int(got.PromptCachedTokens), len(p), "the last prompt token always runs")
				require.Zero(t, int(got.PromptCachedTokens)%prefix.BlockTokens)
				if pass == 1 {
					require.Equal(t, (len(p)-1)/prefix.BlockTokens*prefix.BlockTokens, int(got.PromptCachedTokens), "a repeated prompt reuses every whole block before its last token")
				}
				hits += int(got.PromptCachedTokens)
			}
		}
	}
	st := on.PrefixStats()
	require.Equal(t, int64(hits), st.HitTokens)
	require.Positive(t, st.Bytes)
	require.Zero(t, off.PrefixStats().LookupTokens)
}

// TestPrefixCacheIsolation: a prompt's keys and values serve only its workspace, with the
// same base model and adapter weights; an adapter rewritten in place is a new scope.
func TestPrefixCacheIsolation(t *testing.T) {
	on, _, dirs := prefixEngines(t)
	p := make([]int, 150)
	for i := range p {
		p[i] = (i*13 + 5) % 509
	}
	hit := func() int64 { return on.PrefixStats().HitTokens }
	require.Zero(t, prefixSample(t, on, "ws-a", "", p, 1).PromptCachedTokens)
	require.Zero(t, prefixSample(t, on, "ws-b", "", p, 1).PromptCachedTokens, "another workspace, the same base-model prompt")
	require.Zero(t, prefixSample(t, on, "ws-a", dirs[0], p, 1).PromptCachedTokens, "an adapter's prompt never reuses the base model's")
	require.Zero(t, prefixSample(t, on, "ws-b", dirs[0], p, 1).PromptCachedTokens, "another workspace, the same adapter")
	require.Zero(t, prefixSample(t, on, "ws-a", dirs[1], p, 1).PromptCachedTokens, "another adapter")
	require.Zero(t, hit())
	require.EqualValues(t, 144, prefixSample(t, on, "ws-a", dirs[0], p, 1).PromptCachedTokens)
	require.EqualValues(t, 144, prefixSample(t, on, "ws-b", "", p, 1).PromptCachedTokens)
	require.EqualValues(t, 288, hit())
	// new weights in the same folder: nothing computed under the old ones is reused
	_, err := on.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "prefix-1", Dir: dirs[0]})
	require.NoError(t, err)
	require.Zero(t, prefixSample(t, on, "ws-a", dirs[0], p, 1).PromptCachedTokens, "an adapter rewritten in place")
	require.EqualValues(t, 288, hit())
}

// TestPrefixCacheOffWithPromptScores: a request that scores its prompt runs every
// position, and reports nothing cached.
func TestPrefixCacheOffWithPromptScores(t *testing.T) {
	on, _, _ := prefixEngines(t)
	p := seqA
	prefixSample(t, on, "ws", "", p, 1)
	r, err := on.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Workspace: "ws", Prompt: toks32(p), NumSamples: 1, PromptLogprobs: true,
		Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1, TopP: 1}})
	require.NoError(t, err)
	require.Zero(t, r.Result.PromptCachedTokens)
}

// TestPrefixCacheBytesOption: the backend option and worker flag's values.
func TestPrefixCacheBytesOption(t *testing.T) {
	for v, want := range map[string]int64{"0": -1, "1": 1, "268435456": 256 << 20, "1099511627776": MaxPrefixCacheBytes} {
		got, err := ParsePrefixCacheBytes(v)
		require.NoError(t, err, v)
		require.Equal(t, want, got, v)
	}
	for _, v := range []string{"-1", "", "1e9", "256MiB", "1099511627777"} {
		_, err := ParsePrefixCacheBytes(v)
		require.ErrorContains(t, err, "is not a number of bytes from 0 (off)", v)
	}
}

// TestPrefixCacheBudget: the cache never holds more than its budget, and a request copies
// at most as many blocks as it holds: here two blocks of loops/tiny (64 KiB each), the
// prompt's first two.
func TestPrefixCacheBudget(t *testing.T) {
	engine(t)
	e, err := New(Options{DataDir: engDir, PrefixCacheBytes: 2 << 16})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	p := make([]int, 100)
	for i := range p {
		p[i] = (i*11 + 1) % 509
	}
	require.Zero(t, prefixSample(t, e, "ws", "", p, 1).PromptCachedTokens)
	require.Equal(t, prefix.Stats{LookupTokens: 100, Bytes: 2 << 16, Blocks: 2}, e.PrefixStats())
	require.EqualValues(t, 32, prefixSample(t, e, "ws", "", p, 1).PromptCachedTokens)
	require.LessOrEqual(t, e.PrefixStats().Bytes, int64(2<<16))
}
