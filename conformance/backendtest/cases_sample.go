package backendtest

import (
	"math"
	"strings"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/conformance/oracle"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// greedyCheck requires a backend continuation to be the oracle's greedy one. Where the
// oracle's two best logits are closer than 1e-4 the float32 argmax may differ, so only the
// prefix up to that step is compared.
func (h *harness) greedyCheck(seq *loopsv1.SampledSequence, want oracle.Continuation) {
	h.t.Helper()
	got := ints(seq.GetTokens())
	require.Len(h.t, seq.GetLogprobs(), len(got), "logprobs length equals tokens length")
	if want.MinGap < 1e-4 {
		h.t.Logf("greedy path has a near tie (gap %g); not comparing", want.MinGap)
		return
	}
	require.Equal(h.t, want.Tokens, got, "greedy tokens")
	reason := loopsv1.StopReason_STOP_REASON_LENGTH
	if want.Stopped {
		reason = loopsv1.StopReason_STOP_REASON_STOP
	}
	require.Equal(h.t, reason, seq.GetStopReason(), "stop_reason")
}

// samplingLogprobs checks each sampled token's log-prob against the oracle's at the
// temperature (top_k and top_p unset).
func (h *harness) samplingLogprobs(prompt []int, ad *oracle.Adapter, seqs []*loopsv1.SampledSequence, temperature float64, maxTokens int) {
	h.t.Helper()
	worst := 0.0
	for i, s := range seqs {
		gen := ints(s.GetTokens())
		require.Len(h.t, s.GetLogprobs(), len(gen), "sequence %d: logprobs length", i)
		require.NotEmpty(h.t, gen, "sequence %d is empty", i)
		require.LessOrEqual(h.t, len(gen), maxTokens, "sequence %d is longer than max_tokens", i)
		want := h.o.SequenceLogProbs(prompt, gen, ad, temperature)
		for j, v := range s.GetLogprobs() {
			e := math.Abs(float64(v) - want[j])
			worst = math.Max(worst, e)
			require.LessOrEqual(h.t, e, h.opts.LogprobTolerance, "sequence %d token %d (%d): logprob %g, oracle %g at temperature %g", i, j, gen[j], v, want[j], temperature)
		}
		last := gen[len(gen)-1]
		if s.GetStopReason() == loopsv1.StopReason_STOP_REASON_STOP {
			require.True(h.t, h.o.IsEOS(last), "sequence %d stopped on %d, which is not an EOS id", i, last)
		} else {
			require.Equal(h.t, loopsv1.StopReason_STOP_REASON_LENGTH, s.GetStopReason(), "sequence %d stop_reason", i)
			require.Len(h.t, gen, maxTokens, "sequence %d ended early without a stop", i)
		}
		for j, t := range gen[:len(gen)-1] {
			require.False(h.t, h.o.IsEOS(t), "sequence %d continues after EOS at %d", i, j)
		}
	}
	h.note("sampled logprobs abs", worst)
}

// topLogprobsCase checks SamplingParams.top_logprobs (Tinker's topk_sample_logprobs): for
// every sampled token the k most likely tokens, with their log-probs, of the distribution
// it was drawn from (top_k and top_p unset: softmax(logits/T); greedy: temperature 1),
// computed by the oracle in float64 on the sequence's own context.
func topLogprobsCase(name string, temperature float32) testCase {
	return testCase{"sample/top_logprobs/" + name, func(h *harness) {
		dir, ad := h.warm(loraConfig())
		prompt := h.tokens(5)
		const k = 5
		p := params(6, temperature, 13)
		p.TopLogprobs = k
		res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 2, Params: p})
		T := float64(temperature)
		if T <= 0 {
			T = 1
		}
		worst := 0.0
		for i, s := range res.GetSequences() {
			gen := ints(s.GetTokens())
			tk := s.GetTopLogprobs()
			require.NotNil(h.t, tk, "sequence %d: top_logprobs missing", i)
			require.Equal(h.t, int32(k), tk.GetK())
			require.Equal(h.t, int32(len(gen)), tk.GetLength())
			require.Len(h.t, tk.GetTokenIds(), k*len(gen))
			for j := range gen {
				ctx := append(append([]int(nil), prompt...), gen[:j]...)
				want := oracle.TopK(h.o.NextLogProbs(ctx, ad, T), k)
				for c := range k {
					lp := float64(tk.GetLogprobs()[j*k+c])
					e := math.Abs(lp - want[c].LogProb)
					worst = math.Max(worst, e)
					require.LessOrEqual(h.t, e, h.opts.LogprobTolerance, "sequence %d token %d rank %d: %g, oracle %g", i, j, c, lp, want[c].LogProb)
					tied := (c > 0 && want[c-1].LogProb-want[c].LogProb < 1e-4) || (c+1 < len(want) && want[c].LogProb-want[c+1].LogProb < 1e-4)
					if !tied {
						require.Equal(h.t, int32(want[c].Token), tk.GetTokenIds()[j*k+c], "sequence %d token %d rank %d", i, j, c)
					}
					if int(tk.GetTokenIds()[j*k+c]) == gen[j] {
						require.InDelta(h.t, s.GetLogprobs()[j], tk.GetLogprobs()[j*k+c], 1e-6, "sequence %d token %d: the sampled token's entry is its log-prob", i, j)
					}
				}
			}
		}
		h.note("top logprobs abs", worst)
	}}
}

func params(maxTokens int, temperature float32, seed uint64) *loopsv1.SamplingParams {
	return &loopsv1.SamplingParams{MaxTokens: int32(maxTokens), Temperature: temperature, TopP: 1, Seed: &seed}
}

func sampleCases() []testCase {
	logprobCase := func(name string, temperature float32) testCase {
		return testCase{"sample/logprobs/" + name, func(h *harness) {
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(5)
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 3, Params: params(8, temperature, 11)})
			require.Len(h.t, res.GetSequences(), 3)
			h.samplingLogprobs(prompt, ad, res.GetSequences(), float64(temperature), 8)
		}}
	}
	embedCase := func(name string, withAdapter bool) testCase {
		return testCase{"sample/embed/" + name, func(h *harness) {
			var (
				dir string
				ad  *oracle.Adapter
			)
			if withAdapter {
				dir, ad = h.warm(loraConfig())
			}
			prompt := h.tokens(7)
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), Embed: true})
			require.Empty(h.t, res.GetSequences(), "an embedding samples nothing")
			want := h.o.MeanHidden(prompt, ad)
			got := res.GetEmbedding()
			require.Len(h.t, got, len(want))
			for i := range want {
				require.InDelta(h.t, want[i], float64(got[i]), h.opts.LogprobTolerance, "dimension %d of the mean final hidden state", i)
			}
		}}
	}
	return []testCase{
		embedCase("base_model", false),
		embedCase("adapter", true),
		{"sample/greedy/base_model", func(h *harness) {
			prompt := h.tokens(6)
			res := h.sample(&backendv1.SampleRequest{Prompt: toInt32(prompt), NumSamples: 1, Params: params(10, 0, 1)})
			require.Len(h.t, res.GetSequences(), 1)
			h.greedyCheck(res.GetSequences()[0], h.o.Greedy(prompt, nil, 10, oracle.StopRule{}))
		}},
		{"sample/greedy/adapter", func(h *harness) {
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(4)
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 2, Params: params(10, 0, 1)})
			require.Len(h.t, res.GetSequences(), 2)
			want := h.o.Greedy(prompt, ad, 10, oracle.StopRule{})
			for _, s := range res.GetSequences() {
				h.greedyCheck(s, want)
			}
			if base := h.o.Greedy(prompt, nil, 10, oracle.StopRule{}); equalInts(base.Tokens, want.Tokens) {
				h.t.Logf("note: the adapter does not change the greedy continuation of this prompt")
			}
		}},
		{"sample/top_k_1_is_greedy", func(h *harness) {
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(5)
			p := params(8, 1, 5)
			p.TopK = 1
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 2, Params: p})
			want := h.o.Greedy(prompt, ad, 8, oracle.StopRule{})
			for _, s := range res.GetSequences() {
				h.greedyCheck(s, want)
			}
		}},
		{"sample/top_p_tiny_is_greedy", func(h *harness) {
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(5)
			p := params(8, 1, 5)
			p.TopP = 1e-6
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 2, Params: p})
			want := h.o.Greedy(prompt, ad, 8, oracle.StopRule{})
			for _, s := range res.GetSequences() {
				h.greedyCheck(s, want)
			}
		}},
		logprobCase("temperature_1", 1),
		logprobCase("temperature_0.7", 0.7),
		logprobCase("temperature_1.5", 1.5),
		{"sample/seed", func(h *harness) {
			// the same seed gives the same output; another seed another output
			prompt := toInt32(h.tokens(4))
			run := func(seed uint64) *loopsv1.SampleResult {
				return h.sample(&backendv1.SampleRequest{Prompt: prompt, NumSamples: 2, Params: params(12, 1, seed)})
			}
			a, b, c := run(42), run(42), run(43)
			require.Len(h.t, a.GetSequences(), 2)
			for i := range a.GetSequences() {
				require.Equal(h.t, a.GetSequences()[i].GetTokens(), b.GetSequences()[i].GetTokens(), "seed 42, sample %d: tokens differ between calls", i)
				require.Equal(h.t, a.GetSequences()[i].GetLogprobs(), b.GetSequences()[i].GetLogprobs(), "seed 42, sample %d: logprobs differ between calls", i)
			}
			require.NotEqual(h.t, a.GetSequences()[0].GetTokens(), c.GetSequences()[0].GetTokens(), "seeds 42 and 43 give the same tokens")
		}},
		{"sample/num_samples", func(h *harness) {
			prompt := toInt32(h.tokens(4))
			res := h.sample(&backendv1.SampleRequest{Prompt: prompt, NumSamples: 4, Params: params(12, 1, 3)})
			require.Len(h.t, res.GetSequences(), 4)
			distinct := map[string]bool{}
			for _, s := range res.GetSequences() {
				distinct[string(toBytes(s.GetTokens()))] = true
			}
			require.Greater(h.t, len(distinct), 1, "the 4 samples are all the same")
		}},
		{"sample/max_tokens", func(h *harness) {
			prompt := h.tokens(5)
			want := h.o.Greedy(prompt, nil, 3, oracle.StopRule{})
			res := h.sample(&backendv1.SampleRequest{Prompt: toInt32(prompt), NumSamples: 1, Params: params(3, 0, 1)})
			h.greedyCheck(res.GetSequences()[0], want)
			if !want.Stopped {
				require.Len(h.t, res.GetSequences()[0].GetTokens(), 3)
				require.Equal(h.t, loopsv1.StopReason_STOP_REASON_LENGTH, res.GetSequences()[0].GetStopReason())
			}
		}},
		{"sample/stop/token", func(h *harness) {
			// a stop token ends the sequence, which includes it; stop_reason is stop
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(5)
			full := h.o.Greedy(prompt, ad, 8, oracle.StopRule{})
			require.GreaterOrEqual(h.t, len(full.Tokens), 4, "the greedy continuation ends too early to test stops")
			stop := []int{full.Tokens[3], h.tokens(1)[0]}
			want := h.o.Greedy(prompt, ad, 8, oracle.StopRule{Tokens: stop})
			require.True(h.t, want.Stopped)
			p := params(8, 0, 1)
			p.StopTokens = toInt32(stop)
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: p})
			h.greedyCheck(res.GetSequences()[0], want)
		}},
		{"sample/stop/string", func(h *harness) {
			// a stop string ends the sequence at the token that completes it (included)
			dir, ad := h.warm(loraConfig())
			var prompt []int
			var full oracle.Continuation
			var stop string
			for try := 0; try < 20 && stop == ""; try++ {
				prompt = h.tokens(5)
				full = h.o.Greedy(prompt, ad, 10, oracle.StopRule{})
				for i := 2; i < len(full.Tokens) && stop == ""; i++ {
					if s := h.dec.Decode(full.Tokens[i : i+1]); printable(s) && !strings.Contains(h.dec.Decode(full.Tokens[:i]), s) {
						stop = s
					}
				}
			}
			require.NotEmpty(h.t, stop, "found no printable greedy token to use as a stop string")
			want := h.o.Greedy(prompt, ad, 10, oracle.StopRule{Strings: []string{stop}, Decode: func(ids []int) string { return h.dec.Decode(ids) }})
			require.True(h.t, want.Stopped)
			h.t.Logf("stop string %q after %d tokens", stop, len(want.Tokens))
			p := params(10, 0, 1)
			p.StopStrings = []string{stop}
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: p})
			h.greedyCheck(res.GetSequences()[0], want)
		}},
		{"sample/prompt_logprobs", func(h *harness) {
			// temperature 1 whatever the sampling temperature; the first is NaN
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(9)
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: params(2, 0.5, 1), PromptLogprobs: true})
			want, _ := h.o.PromptLogProbs(prompt, ad, 0)
			got := res.GetPromptLogprobs()
			require.Len(h.t, got, len(prompt))
			require.True(h.t, math.IsNaN(float64(got[0])), "the first prompt logprob is %g, want NaN", got[0])
			worst := 0.0
			for i := 1; i < len(got); i++ {
				e := math.Abs(float64(got[i]) - want[i])
				worst = math.Max(worst, e)
				require.LessOrEqual(h.t, e, h.opts.LogprobTolerance, "prompt logprob %d: %g, oracle %g", i, got[i], want[i])
			}
			h.note("prompt logprobs abs", worst)
		}},
		{"sample/topk_prompt_logprobs", func(h *harness) {
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(7)
			const k = 4
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: params(1, 1, 1), TopkPromptLogprobs: k})
			_, want := h.o.PromptLogProbs(prompt, ad, k)
			tk := res.GetTopkPromptLogprobs()
			require.NotNil(h.t, tk, "topk_prompt_logprobs missing")
			require.Equal(h.t, int32(k), tk.GetK())
			require.Equal(h.t, int32(len(prompt)), tk.GetLength())
			require.Len(h.t, tk.GetTokenIds(), k*len(prompt))
			require.Len(h.t, tk.GetLogprobs(), k*len(prompt))
			for c := 0; c < k; c++ {
				require.Equal(h.t, int32(0), tk.GetTokenIds()[c], "the first position has no candidates")
				require.Equal(h.t, float32(-99999), tk.GetLogprobs()[c], "the first position has no candidates")
			}
			worst := 0.0
			for r := 1; r < len(prompt); r++ {
				for c := 0; c < k; c++ {
					lp := float64(tk.GetLogprobs()[r*k+c])
					if c > 0 {
						require.LessOrEqual(h.t, lp, float64(tk.GetLogprobs()[r*k+c-1]), "row %d is not sorted", r)
					}
					e := math.Abs(lp - want[r][c].LogProb)
					worst = math.Max(worst, e)
					require.LessOrEqual(h.t, e, h.opts.LogprobTolerance, "row %d rank %d: %g, oracle %g", r, c, lp, want[r][c].LogProb)
					tied := (c > 0 && want[r][c-1].LogProb-want[r][c].LogProb < 1e-4) || (c+1 < len(want[r]) && want[r][c].LogProb-want[r][c+1].LogProb < 1e-4)
					if !tied {
						require.Equal(h.t, int32(want[r][c].Token), tk.GetTokenIds()[r*k+c], "row %d rank %d token", r, c)
					}
				}
			}
			h.note("topk prompt logprobs abs", worst)
		}},
		topLogprobsCase("temperature_0.8", 0.8),
		topLogprobsCase("greedy", 0),
		{"sample/target_prompt_logprobs", func(h *harness) {
			// each id's log-prob at temperature 1 at its position, NaN where the id is -1,
			// whatever the sampling temperature
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(8)
			const k = 3
			V := h.o.Cfg.VocabSize
			ids := make([]int32, (len(prompt)-1)*k)
			for i := range ids {
				ids[i] = int32(h.rng.IntN(V))
				if i%4 == 1 {
					ids[i] = -1
				}
			}
			ids[k] = int32(prompt[2]) // row 1 (position 2) asks for the prompt's own token
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: params(1, 0.6, 1),
				PromptLogprobs: true, TargetPromptTokens: &loopsv1.TargetPromptTokens{K: k, TokenIds: ids}})
			rows := h.o.PromptRows(prompt, ad, 1)
			require.NotNil(h.t, res.GetTargetPromptLogprobs(), "target_prompt_logprobs missing")
			require.Equal(h.t, int32(k), res.GetTargetPromptLogprobs().GetK())
			got := res.GetTargetPromptLogprobs().GetLogprobs()
			require.Len(h.t, got, len(ids), "target_prompt_logprobs has the layout of target_prompt_tokens")
			worst := 0.0
			for c, id := range ids {
				if id < 0 {
					require.True(h.t, math.IsNaN(float64(got[c])), "cell %d asked for nothing: %g, want NaN", c, got[c])
					continue
				}
				e := math.Abs(float64(got[c]) - rows[c/k][id])
				worst = math.Max(worst, e)
				require.LessOrEqual(h.t, e, h.opts.LogprobTolerance, "cell %d (position %d, id %d): %g, oracle %g", c, c/k+1, id, got[c], rows[c/k][id])
			}
			require.InDelta(h.t, res.GetPromptLogprobs()[2], got[k], 1e-6, "a target equal to the prompt token has its prompt log-prob")
			h.note("target prompt logprobs abs", worst)
		}},
		{"sample/prompt_alt_tokens", func(h *harness) {
			// k draws per prompt position after the first, each with its log-prob at
			// temperature 1; the same seed gives the same draws
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(7)
			const k = 16
			req := func(seed uint64) *backendv1.SampleRequest {
				return &backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: params(1, 1.3, seed), PromptAltTokensK: k}
			}
			a, b, c := h.sample(req(7)), h.sample(req(7)), h.sample(req(8))
			alt := a.GetPromptAltTokens()
			require.NotNil(h.t, alt, "prompt_alt_tokens missing")
			require.Equal(h.t, int32(k), alt.GetK())
			require.Len(h.t, alt.GetTokenIds(), (len(prompt)-1)*k)
			require.Len(h.t, alt.GetLogprobs(), (len(prompt)-1)*k)
			rows := h.o.PromptRows(prompt, ad, 1)
			worst := 0.0
			for c, t := range alt.GetTokenIds() {
				require.True(h.t, t >= 0 && int(t) < h.o.Cfg.VocabSize, "draw %d = %d is outside the vocabulary", c, t)
				e := math.Abs(float64(alt.GetLogprobs()[c]) - rows[c/k][t])
				worst = math.Max(worst, e)
				require.LessOrEqual(h.t, e, h.opts.LogprobTolerance, "draw %d (position %d, token %d): %g, oracle %g", c, c/k+1, t, alt.GetLogprobs()[c], rows[c/k][t])
			}
			require.Equal(h.t, alt.GetTokenIds(), b.GetPromptAltTokens().GetTokenIds(), "seed 7 gives other draws the second time")
			require.NotEqual(h.t, alt.GetTokenIds(), c.GetPromptAltTokens().GetTokenIds(), "seeds 7 and 8 give the same draws")
			h.note("prompt alt tokens abs", worst)
		}},
		{"sample/prompt_alt_tokens/greedy", func(h *harness) {
			// at temperature 0 every draw is the argmax
			dir, ad := h.warm(loraConfig())
			prompt := h.tokens(6)
			const k = 3
			res := h.sample(&backendv1.SampleRequest{AdapterDir: dir, Prompt: toInt32(prompt), NumSamples: 1, Params: params(1, 0, 1), PromptAltTokensK: k})
			alt := res.GetPromptAltTokens()
			require.NotNil(h.t, alt, "prompt_alt_tokens missing")
			require.Len(h.t, alt.GetTokenIds(), (len(prompt)-1)*k)
			for r, row := range h.o.PromptRows(prompt, ad, 1) {
				top := oracle.TopK(row, 2)
				if top[0].LogProb-top[1].LogProb < 1e-4 {
					continue
				}
				for j := range k {
					require.Equal(h.t, int32(top[0].Token), alt.GetTokenIds()[r*k+j], "position %d draw %d is not the argmax", r+1, j)
					require.InDelta(h.t, top[0].LogProb, float64(alt.GetLogprobs()[r*k+j]), h.opts.LogprobTolerance)
				}
			}
		}},
		{"sample/snapshot_isolation", func(h *harness) {
			// a saved folder is a frozen snapshot: later training of the adapter does not
			// change what sampling from the folder gives
			lc := loraConfig()
			dir, _ := h.warm(lc)
			id := h.loadFresh(dir, lc)
			snap := h.save(id, false)
			prompt := toInt32(h.tokens(6))
			req := func(d string) *backendv1.SampleRequest {
				return &backendv1.SampleRequest{AdapterDir: d, Prompt: prompt, NumSamples: 2, Params: params(6, 1, 9), PromptLogprobs: true}
			}
			before := h.sample(req(snap))
			for i := 0; i < 2; i++ {
				h.fb(id, oracle.Loss{Name: "cross_entropy"}, []example{h.ceExample(8, nil)}, false)
				h.step(id, defaultAdam(0.05))
			}
			later := h.save(id, false)
			after := h.sample(req(snap))
			for i := range before.GetSequences() {
				require.Equal(h.t, before.GetSequences()[i].GetTokens(), after.GetSequences()[i].GetTokens(), "sample %d changed after training", i)
			}
			require.Equal(h.t, before.GetPromptLogprobs()[1:], after.GetPromptLogprobs()[1:], "prompt logprobs changed after training")
			trained := h.sample(req(later))
			require.NotEqual(h.t, before.GetPromptLogprobs()[1:], trained.GetPromptLogprobs()[1:], "the trained adapter's folder samples like the snapshot")
		}},
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func toBytes(v []int32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, x := range v {
		out = append(out, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	}
	return out
}

// printable reports whether s is non-empty printable ASCII without spaces at its ends.
func printable(s string) bool {
	if s == "" || strings.TrimSpace(s) != s {
		return false
	}
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return false
		}
	}
	return true
}
