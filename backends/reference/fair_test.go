package reference

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// boundaryClock counts a decoder's step boundaries (through its beforeStep hook).
type boundaryClock struct{ n atomic.Int64 }

func countBoundaries(t *testing.T, o Options) (*Engine, *boundaryClock) {
	t.Helper()
	o.DataDir, o.MaxLoraRank = engineDir(t), 32
	e, err := New(o)
	require.NoError(t, err)
	c := &boundaryClock{}
	e.models[tiny.Name].dec.beforeStep = func() { c.n.Add(1) }
	return e, c
}

// waitFor polls until cond holds (or fails the test after a minute).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out")
		time.Sleep(time.Millisecond)
	}
}

// timedSink records the step boundary at which a sample's first and last tokens came.
type timedSink struct {
	*tokenstream.Buffer
	clock       *boundaryClock
	first, last atomic.Int64
}

func (s *timedSink) Token(seq int, id int32, lp float32, top []tokenstream.Alt) {
	s.Buffer.Token(seq, id, lp, top)
	b := s.clock.n.Load()
	s.first.CompareAndSwap(0, b)
	s.last.Store(b)
}

// sampleTimed samples r, streaming, and returns the boundaries of its first and last
// tokens.
func sampleTimed(t *testing.T, e *Engine, c *boundaryClock, r *backendv1.SampleRequest) (first, last int64) {
	t.Helper()
	s := &timedSink{Buffer: tokenstream.NewBuffer(1 << 20), clock: c}
	_, err := e.SampleStream(ctx, r, s)
	require.NoError(t, err)
	return s.first.Load(), s.last.Load()
}

func longPrompt(n, salt int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*31 + salt*7 + 3) % tiny.VocabLen)
	}
	return p
}

func sampleReq(ws string, prompt []int32, n, maxTokens int) *backendv1.SampleRequest {
	return &backendv1.SampleRequest{BaseModel: tiny.Name, Workspace: ws, Prompt: prompt, NumSamples: int32(n),
		Params: &loopsv1.SamplingParams{MaxTokens: int32(maxTokens), Temperature: 1, TopP: 1, Seed: seedp(uint64(n + maxTokens))}}
}

// background samples reqs until each ends or ctx is cancelled; wait waits for all.
func background(ctx context.Context, e *Engine, reqs ...*backendv1.SampleRequest) (wait func()) {
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = e.Sample(ctx, r)
		}()
	}
	return wg.Wait
}

// TestFairPrefillLightTenant: a light workspace's sample that arrives while other
// workspaces' long prompts are prefilling (six chunks of nn.PrefillChunk tokens waiting)
// is prefilled at the next step boundary and has its first token there, rather than after
// every prompt that came before it.
func TestFairPrefillLightTenant(t *testing.T) {
	e, clock := countBoundaries(t, Options{})
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var heavy []*backendv1.SampleRequest
	for i := range 3 {
		heavy = append(heavy, sampleReq([]string{"heavy-a", "heavy-b"}[i%2], longPrompt(1024, i), 1, 4))
	}
	wait := background(hctx, e, heavy...)
	waitFor(t, func() bool { return clock.n.Load() >= 2 })
	arrived := clock.n.Load()
	first, _ := sampleTimed(t, e, clock, sampleReq("light", longPrompt(8, 9), 1, 4))
	require.LessOrEqual(t, first-arrived, int64(2), "arrived during boundary %d, first token at boundary %d", arrived, first)
	cancel()
	wait()
}

// TestFairPrefillBetweenTenants: the prefill of a workspace's one long prompt does not wait
// for the prompts another workspace sent before it: the two share the prefill, so it has its
// first token before the other's third prompt has its.
func TestFairPrefillBetweenTenants(t *testing.T) {
	e, clock := countBoundaries(t, Options{})
	var firsts [3]atomic.Int64
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, _ := sampleTimed(t, e, clock, sampleReq("flood", longPrompt(1024, i), 1, 2))
			firsts[i].Store(f)
		}()
		time.Sleep(2 * time.Millisecond) // in order
	}
	waitFor(t, func() bool { return clock.n.Load() >= 2 })
	other, _ := sampleTimed(t, e, clock, sampleReq("other", longPrompt(1024, 7), 1, 2))
	wg.Wait()
	last := max(firsts[0].Load(), firsts[1].Load(), firsts[2].Load())
	require.Less(t, other, last, "the other workspace's first token (boundary %d) came after the flood's last prompt's (%d)", other, last)
}

// TestFairDecodeAdmission: when one workspace's sequences fill the batch
// (MaxBatchSequences) and more of its samples wait, another workspace's sample still
// decodes from the next step boundary, taking one row of the batch from the full workspace,
// and ends long before it.
func TestFairDecodeAdmission(t *testing.T) {
	e, clock := countBoundaries(t, Options{MaxBatchSequences: 4})
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var heavy []*backendv1.SampleRequest // 64 sequences: hundreds of steps of a full batch
	for i := range 16 {
		heavy = append(heavy, sampleReq("flood", longPrompt(4, i), 4, 400))
	}
	var heavyDone atomic.Bool
	wait := background(hctx, e, heavy...)
	go func() {
		wait()
		heavyDone.Store(true)
	}()
	waitFor(t, func() bool { return decoderStatsOf(e).maxRows == 4 })
	arrived := clock.n.Load()
	first, last := sampleTimed(t, e, clock, sampleReq("light", longPrompt(6, 0), 1, 5)) // 5 tokens, no end-of-sequence
	require.LessOrEqual(t, first-arrived, int64(2), "arrived during boundary %d, first token at boundary %d", arrived, first)
	require.Equal(t, int64(3), last-first, "5 tokens: at its first boundary one from its start and one from the step, then one per step")
	require.False(t, heavyDone.Load(), "the full workspace's samples are still decoding")
	st := decoderStatsOf(e)
	require.LessOrEqual(t, st.maxRows, 4)
	require.Positive(t, st.paused, "a flood's sequences were left out of steps for the light one")
	cancel()
	wait()
}

// TestShareRows: the batch's rows are shared max-min fairly, the rows that do not divide
// evenly going to the flows first in order.
func TestShareRows(t *testing.T) {
	for _, tc := range []struct {
		n          int
		want, give []int
	}{
		{64, []int{64, 1}, []int{63, 1}},
		{4, []int{4, 4, 4}, []int{2, 1, 1}},
		{4, []int{1, 10, 10}, []int{1, 2, 1}},
		{10, []int{3, 2, 1}, []int{3, 2, 1}},
		{2, []int{5, 5, 5}, []int{1, 1, 0}},
		{5, []int{0, 7, 0, 7}, []int{0, 3, 0, 2}},
		{3, nil, nil},
	} {
		flows := make([]*flow, len(tc.want))
		for i, w := range tc.want {
			flows[i] = &flow{want: w}
		}
		shareRows(flows, tc.n)
		var got []int
		for _, f := range flows {
			got = append(got, f.share)
		}
		require.Equal(t, tc.give, got, "%d rows for %v", tc.n, tc.want)
	}
}

// TestPrefillCost: the cost model recovers a + b·position from pieces' times, and sizes a
// piece to a time budget.
func TestPrefillCost(t *testing.T) {
	var c prefillCost
	require.Zero(t, c.tokens(time.Second, 0), "no estimate before a piece has run")
	const a, b = 100e-6, 0.2e-6 // seconds per token, and per token and position
	piece := func(pos, n int) (int, time.Duration) {
		sum := n*pos + n*(n-1)/2
		return sum, time.Duration((a*float64(n) + b*float64(sum)) * 1e9)
	}
	for _, p := range [][2]int{{0, 32}, {32, 100}, {132, 200}, {332, 180}, {0, 16}, {16, 300}} {
		sum, took := piece(p[0], p[1])
		c.observe(p[1], sum, took)
	}
	ga, gb := c.perToken()
	require.InEpsilon(t, a, ga, 1e-3)
	require.InEpsilon(t, b, gb, 1e-3)
	for _, pos := range []int{0, 100, 400} {
		n := c.tokens(10*time.Millisecond, pos)
		_, took := piece(pos, n)
		_, over := piece(pos, n+1)
		require.LessOrEqual(t, took, 10*time.Millisecond+time.Microsecond, "at %d", pos)
		require.Greater(t, over, 10*time.Millisecond-time.Microsecond, "at %d", pos)
	}
	require.Equal(t, nn.PrefillChunk, c.tokens(time.Hour, 0))
}

// FuzzDecoderSchedule drives a decoder on a small model with requests from a few
// workspaces arriving at chosen step boundaries, under chosen batch limits and prefill
// piece sizes: every request ends, with the tokens and log-probs it gets sampled alone, no
// step decodes more than the row limit, and the cache budget returns to zero.
func FuzzDecoderSchedule(f *testing.F) {
	m, err := nn.NewRandom[float32](nn.Config{Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3",
		Vocab: 64, Hidden: 32, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 16, Inter: 64, MaxPos: 256,
		RopeTheta: 1e4, Eps: 1e-6, Tied: true, HiddenAct: "silu"}, nn.RandomOptions{Seed: 3, QKNorm: true})
	require.NoError(f, err)
	f.Add([]byte{3, 5, 0, 0, 10, 2, 4, 1, 1, 90, 1, 6, 2, 0, 3, 3, 2})
	f.Add([]byte{1, 2, 1, 2, 40, 3, 9, 0, 0, 70, 1, 3, 1, 1, 5, 2, 7, 2, 3, 120, 2, 2})
	f.Add([]byte{2, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		next := func() int {
			if len(in) == 0 {
				return 0
			}
			b := in[0]
			in = in[1:]
			return int(b)
		}
		maxSeqs := 1 + next()%4
		maxKV := int64(1+next()%8) * 40 * kvBytesPerPosition(m)
		d := newDecoder(m, maxSeqs, maxKV)
		d.maxPiece = next() % 9
		type req struct {
			at   int
			ws   string
			g    *nn.Gen[float32]
			want []nn.Sampled
			j    *decodeJob
		}
		var reqs []*req
		for len(in) > 0 && len(reqs) < 12 {
			at, ws, plen, n, maxTok := next()%20, next()%4, 1+next()%150, 1+next()%3, 1+next()%6
			prompt := make([]int, plen)
			for i := range prompt {
				prompt[i] = (i*7 + ws*13 + len(reqs)) % 64
			}
			seed := uint64(len(reqs))
			p := nn.SampleParams{MaxTokens: maxTok, Temperature: 1, Seed: &seed, EOS: []int{5}}
			want, _ := m.Sample(prompt, nil, n, p, false, 0)
			name := ""
			if ws > 0 {
				name = string(rune('a' + ws))
			}
			reqs = append(reqs, &req{at: at, ws: name, g: m.NewGen(prompt, nil, n, p, false, 0), want: want})
		}
		var st decodeState
		for b := 0; ; b++ {
			for _, r := range reqs {
				if r.at == b {
					r.j = &decodeJob{ctx: context.Background(), g: r.g, ws: r.ws, kv: int64(r.g.Positions()) * kvBytesPerPosition(m), done: make(chan struct{})}
					st.add(r.j)
				}
			}
			if len(st.flows) == 0 && b >= 20 {
				break
			}
			require.Less(t, b, 5000, "the requests did not end")
			if len(st.flows) > 0 {
				d.boundary(&st)
			}
		}
		for i, r := range reqs {
			require.True(t, r.g.Done(), "request %d", i)
			require.Equal(t, r.want, r.g.Out, "request %d differs from its result alone", i)
		}
		require.Zero(t, st.kv)
		require.LessOrEqual(t, d.stats.maxRows, maxSeqs)
	})
}

// TestAlonePromptRunsInLargePieces: a workspace whose prompt is the only work prefills it in
// pieces of at least minAlonePiece tokens (fewer only at the end of a chunk), however slow
// the cost model says a token is; pieces that small would read every weight for a few rows
// (bench/llamacpp: a 700-token prompt took 5× the engine's own prefill in 4-token pieces).
func TestAlonePromptRunsInLargePieces(t *testing.T) {
	m, err := nn.NewRandom[float32](nn.Config{Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3",
		Vocab: 64, Hidden: 32, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 16, Inter: 64, MaxPos: 1024,
		RopeTheta: 1e4, Eps: 1e-6, Tied: true, HiddenAct: "silu"}, nn.RandomOptions{Seed: 3, QKNorm: true})
	require.NoError(t, err)
	const plen = 300
	prompt := make([]int, plen)
	for i := range prompt {
		prompt[i] = (i * 7) % 64
	}
	seed := uint64(1)
	p := nn.SampleParams{MaxTokens: 2, Temperature: 1, Seed: &seed, EOS: []int{5}}
	want, _ := m.Sample(prompt, nil, 1, p, false, 0)

	d := newDecoder(m, 4, 1<<30)
	var st decodeState
	st.cost.observe(1, 0, time.Second) // a token takes a second: the time slice alone gives none
	g := m.NewGen(prompt, nil, 1, p, false, 0)
	st.add(&decodeJob{ctx: context.Background(), g: g, ws: "a", kv: int64(g.Positions()) * kvBytesPerPosition(m), done: make(chan struct{})})
	for b := 0; len(st.flows) > 0; b++ {
		require.Less(t, b, 100, "the request did not end")
		d.boundary(&st)
	}
	require.Equal(t, want, g.Out, "the tokens it gets sampled alone")
	require.Equal(t, plen, d.stats.prefilled)
	// the first piece is minAlonePiece tokens; once it is timed the model may size the next
	// ones larger, never smaller
	require.LessOrEqual(t, d.stats.pieces, (plen+127)/128, "pieces of at least 128 tokens")
}
