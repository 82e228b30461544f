package reference

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// batchRequests are sampling requests that differ in everything a batch can mix: adapter
// (none, two of different ranks), prompt length (one over nn.PrefillChunk), sampling
// parameters, num_samples, max_tokens, stop tokens and prompt scoring.
func batchRequests(t *testing.T) []*backendv1.SampleRequest {
	e := engine(t)
	var dirs []string
	for i, rank := range []int{4, 16} {
		id := []string{"batch-a", "batch-b"}[i]
		createAdapter(t, e, id, rank, uint64(7+i))
		fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
		_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: &loopsv1.AdamParams{LearningRate: 1e-2}})
		require.NoError(t, err)
		dir := t.TempDir()
		_, err = e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: dir})
		require.NoError(t, err)
		dirs = append(dirs, dir)
	}
	long := make([]int, nn.PrefillChunk+37)
	for i := range long {
		long[i] = (i*31 + 7) % 509
	}
	p := func(maxTok int, temp float32, topK int32, topP float32, seed uint64, stops ...int32) *loopsv1.SamplingParams {
		return &loopsv1.SamplingParams{MaxTokens: int32(maxTok), Temperature: temp, TopK: topK, TopP: topP, Seed: &seed, StopTokens: stops}
	}
	req := func(dir string, prompt []int, n int, sp *loopsv1.SamplingParams) *backendv1.SampleRequest {
		return &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: dir, Prompt: toks32(prompt), NumSamples: int32(n), Params: sp}
	}
	reqs := []*backendv1.SampleRequest{
		req("", seqA[:4], 1, p(24, 1, 0, 1, 1)),
		req(dirs[0], seqA[:9], 3, p(17, 0.7, 40, 0.9, 2)),
		req(dirs[1], seqA, 6, p(9, 1.3, 0, 0.8, 3)),
		req("", long, 2, p(12, 0, 0, 1, 4)),
		req(dirs[0], seqA[:2], 1, p(30, 1, 5, 1, 5, 101, 108)),
		req(dirs[1], seqA[3:7], 4, p(5, 1, 0, 1, 6)),
		req("", seqA[:12], 1, p(1, 1, 0, 1, 7)),
	}
	reqs[1].PromptLogprobs = true
	reqs[2].TopkPromptLogprobs = 5
	reqs[3].PromptLogprobs, reqs[3].TopkPromptLogprobs = true, 3
	return reqs
}

// sampleAll runs reqs on e at once and returns each marshalled result.
func sampleAll(t *testing.T, e *Engine, reqs []*backendv1.SampleRequest) [][]byte {
	out := make([][]byte, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.Sample(ctx, r)
			if !assertNoErr(t, err) {
				return
			}
			out[i], err = proto.MarshalOptions{Deterministic: true}.Marshal(resp.Result)
			assertNoErr(t, err)
		}()
	}
	wg.Wait()
	return out
}

func assertNoErr(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("sample: %v", err)
		return false
	}
	return true
}

// holdDecoder makes the decoder look busy, so Sample calls queue in it without a loop.
// wait returns once n have arrived; start starts the loop, so all join at the first step.
func holdDecoder(e *Engine) (wait func(n int), start func()) {
	d := e.models[tiny.Name].dec
	d.mu.Lock()
	d.running = true
	d.mu.Unlock()
	wait = func(n int) {
		for {
			d.mu.Lock()
			k := len(d.incoming)
			d.mu.Unlock()
			if k >= n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	return wait, func() { go d.loop() }
}

func decoderStatsOf(e *Engine) decoderStats {
	d := e.models[tiny.Name].dec
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// TestBatchedSamplingIsBitIdentical checks that requests decoded together (continuous
// batching: all joining at once, then joining a running batch one by one, under tight
// batch limits, from one workspace each or shared between workspaces, their prompts
// prefilled in pieces) give exactly the tokens and log-probs of each decoded alone, with
// any number of threads.
func TestBatchedSamplingIsBitIdentical(t *testing.T) {
	reqs := batchRequests(t)
	defer nn.SetThreads(runtime.NumCPU())
	newEngine := func(o Options) *Engine {
		o.DataDir, o.MaxLoraRank = engDir, 32
		e, err := New(o)
		require.NoError(t, err)
		return e
	}

	alone := newEngine(Options{Threads: 2})
	want := make([][]byte, len(reqs))
	for i, r := range reqs {
		want[i] = sampleAll(t, alone, []*backendv1.SampleRequest{r})[0]
	}

	// the same requests from three workspaces (the decoder shares prefill and rows between
	// them: prompts in pieces, sequences left out of steps)
	tenants := make([]*backendv1.SampleRequest, len(reqs))
	for i, r := range reqs {
		tenants[i] = proto.CloneOf(r)
		tenants[i].Workspace = []string{"ws-a", "ws-b", "ws-c"}[i%3]
	}
	for _, tc := range []struct {
		name     string
		opts     Options
		hold     bool
		tenants  bool
		maxPiece int
	}{
		{"all at once, 1 thread", Options{Threads: 1}, true, false, 0},
		{"all at once, 3 threads", Options{Threads: 3}, true, false, 0},
		{"joining a running batch", Options{Threads: 2}, false, false, 0},
		{"at most 3 sequences", Options{Threads: 2, MaxBatchSequences: 3}, true, false, 0},
		{"small cache budget", Options{Threads: 2, MaxBatchKVBytes: 3 << 20}, true, false, 0},
		{"workspaces, all at once", Options{Threads: 2}, true, true, 0},
		{"workspaces, prompts in pieces of at most 7 tokens", Options{Threads: 2}, true, true, 7},
		{"workspaces joining a running batch, pieces of at most 5 tokens", Options{Threads: 2}, false, true, 5},
		{"workspaces, at most 3 sequences, pieces of at most 11 tokens", Options{Threads: 2, MaxBatchSequences: 3}, true, true, 11},
		{"requests of their own, pieces of at most 3 tokens, at most 2 sequences", Options{Threads: 2, MaxBatchSequences: 2}, false, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(tc.opts)
			e.models[tiny.Name].dec.maxPiece = tc.maxPiece
			reqs := reqs
			if tc.tenants {
				reqs = tenants
			}
			var got [][]byte
			if tc.hold {
				wait, start := holdDecoder(e)
				done := make(chan struct{})
				go func() { got = sampleAll(t, e, reqs); close(done) }()
				wait(len(reqs))
				start()
				<-done
			} else {
				got = make([][]byte, len(reqs))
				var wg sync.WaitGroup
				for i := range reqs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						got[i] = sampleAll(t, e, reqs[i:i+1])[0]
					}()
					time.Sleep(3 * time.Millisecond) // stagger: later ones join a running batch
				}
				wg.Wait()
			}
			for i := range reqs {
				require.Equal(t, want[i], got[i], "request %d differs from its result alone", i)
			}
			st := decoderStatsOf(e)
			if tc.hold {
				require.Greater(t, st.maxRows, 1, "the requests did not decode together")
			}
			if tc.opts.MaxBatchSequences > 0 {
				require.LessOrEqual(t, st.maxRows, tc.opts.MaxBatchSequences)
			}
			if tc.maxPiece > 0 {
				require.Greater(t, st.pieces, nn.PrefillChunk/tc.maxPiece, "the long prompt ran in pieces")
			}
		})
	}
}

// TestBatchedSamplingCancel checks that a request whose caller gives up leaves the batch
// with Canceled while the others finish with their results alone.
func TestBatchedSamplingCancel(t *testing.T) {
	e := engine(t)
	r := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(seqA[:5]), NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 20, Temperature: 1, TopP: 1, Seed: seedp(9)}}
	want := sampleAll(t, e, []*backendv1.SampleRequest{r})[0]

	wait, start := holdDecoder(e)
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := e.Sample(cctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(seqA), NumSamples: 4,
			Params: &loopsv1.SamplingParams{MaxTokens: 200, Temperature: 1, TopP: 1}})
		errc <- err
	}()
	done := make(chan [][]byte)
	go func() { done <- sampleAll(t, e, []*backendv1.SampleRequest{r}) }()
	wait(2)
	cancel()
	start()
	err := <-errc
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(err))
	require.Equal(t, want, (<-done)[0])
}

// TestBatchedSamplingPanic checks that a panic on the decoder goroutine is raised again on
// the goroutine of each request in flight (where backends.Guard turns it into an error),
// and that the decoder serves the next request.
func TestBatchedSamplingPanic(t *testing.T) {
	e, err := New(Options{DataDir: engineDir(t), MaxLoraRank: 32})
	require.NoError(t, err)
	var boom atomic.Bool
	boom.Store(true)
	e.models[tiny.Name].dec.beforeStep = func() {
		if boom.Swap(false) {
			panic("boom")
		}
	}
	r := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(seqA[:5]),
		Params: &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 1, TopP: 1, Seed: seedp(1)}}
	require.Panics(t, func() { _, _ = e.Sample(ctx, r) })
	resp, err := e.Sample(ctx, r)
	require.NoError(t, err)
	require.Len(t, resp.Result.Sequences[0].Tokens, 4)
}

// engineDir is the data folder of the shared test engine (the built-in model is there).
func engineDir(t *testing.T) string {
	engine(t)
	return engDir
}
