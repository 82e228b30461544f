// Command prefixbench runs multi-turn tool-calling episodes on two reference engines, one
// with the prefix cache and one without (bench/prefix).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// firstToken is a stream sink that notes when the first token arrives.
type firstToken struct {
	at   time.Time
	gone chan struct{}
}

func (f *firstToken) Token(int, int32, float32, []tokenstream.Alt) {
	if f.at.IsZero() {
		f.at = time.Now()
	}
}
func (f *firstToken) Gone() <-chan struct{} { return f.gone }

// turn is one sample of an episode on one engine.
type turn struct {
	prompt, cached int
	ttft, total    time.Duration
	tokens         []int32
	logprobs       []float32
}

type side struct {
	Engine       string  `json:"engine"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	CachedShare  float64 `json:"cached_share"`
	// LaterShare is the cached share of the turns after each episode's first.
	LaterShare float64 `json:"cached_share_later_turns"`
	TTFTMillis float64 `json:"mean_ttft_ms"`
	LatMillis  float64 `json:"mean_latency_ms"`
}

const system = `<|im_start|>system
You are an agent that solves tasks with tools. Call a tool by writing a JSON object inside <tool_call></tool_call>; its result comes back inside <tool_response></tool_response>. Think step by step, check every result, and answer only when you are sure.
Tools:
{"name": "search", "description": "Search the document index and return the titles and first lines of the best matches.", "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}, "k": {"type": "integer", "description": "how many results"}}, "required": ["query"]}}
{"name": "read", "description": "Read a document by its id and return its text, at most 2000 characters.", "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}
{"name": "python", "description": "Run Python code in a sandbox and return what it printed and any error.", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}
{"name": "answer", "description": "Give the final answer and end the episode.", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}<|im_end|>
`

func main() {
	var (
		episodes = flag.Int("episodes", 4, "episodes (each with its own task; the system prompt is shared)")
		turns    = flag.Int("turns", 6, "turns per episode")
		maxTok   = flag.Int("max-tokens", 48, "max_tokens per turn")
		threads  = flag.Int("threads", runtime.NumCPU(), "kernel goroutines")
		jsonOut  = flag.Bool("json", false, "print JSON")
	)
	flag.Parse()
	dir, err := os.MkdirTemp("", "prefixbench")
	check(err)
	defer os.RemoveAll(dir)
	on, err := reference.New(reference.Options{DataDir: dir, Threads: *threads})
	check(err)
	off, err := reference.New(reference.Options{DataDir: dir, Threads: *threads, PrefixCacheBytes: -1})
	check(err)
	tok := tiny.Tokenizer()
	enc := func(s string) []int32 {
		var out []int32
		for _, t := range tok.Encode(s) {
			out = append(out, int32(t))
		}
		return out
	}
	var runs [2][]turn
	identical := true
	for ep := range *episodes {
		task := fmt.Sprintf("<|im_start|>user\nTask %d: find how many documents about topic %d mention the year %d, and compute the mean of their page counts.<|im_end|>\n<|im_start|>assistant\n", ep, ep*7+3, 1990+ep)
		prompt := append(enc(system), enc(task)...)
		for tn := range *turns {
			var got [2]turn
			for i, e := range []*reference.Engine{on, off} {
				got[i] = sample(e, prompt, *maxTok, uint64(ep*100+tn))
				runs[i] = append(runs[i], got[i])
			}
			if !slices.Equal(got[0].tokens, got[1].tokens) || !slices.Equal(got[0].logprobs, got[1].logprobs) {
				identical = false
			}
			// the next prompt: this one, the completion, and the tool's result
			result := fmt.Sprintf("<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"results\": [{\"id\": \"doc-%d-%d\", \"title\": \"Report %d\", \"pages\": %d, \"first_line\": \"In %d the committee reviewed topic %d.\"}]}\n</tool_response><|im_end|>\n<|im_start|>assistant\n", ep, tn, tn, 10+tn*3, 1990+ep, ep*7+3)
			prompt = append(append(slices.Clone(prompt), got[0].tokens...), enc(result)...)
		}
	}
	res := struct {
		Episodes  int     `json:"episodes"`
		Turns     int     `json:"turns"`
		Threads   int     `json:"threads"`
		Sides     [2]side `json:"sides"`
		TTFTRatio float64 `json:"ttft_on_over_off"`
		LatRatio  float64 `json:"latency_on_over_off"`
		Identical bool    `json:"tokens_and_logprobs_identical"`
	}{Episodes: *episodes, Turns: *turns, Threads: *threads, Identical: identical}
	for i, name := range []string{"cache on", "cache off"} {
		res.Sides[i] = summarize(name, runs[i], *turns)
	}
	res.TTFTRatio = res.Sides[0].TTFTMillis / res.Sides[1].TTFTMillis
	res.LatRatio = res.Sides[0].LatMillis / res.Sides[1].LatMillis
	if *jsonOut {
		b, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(b))
		return
	}
	fmt.Printf("%d episodes × %d turns, max_tokens %d, %d threads; tokens and log-probs identical: %v\n", res.Episodes, res.Turns, *maxTok, res.Threads, identical)
	fmt.Printf("%-10s %8s %8s %7s %12s %10s %12s\n", "engine", "prompt", "cached", "share", "share t>1", "TTFT ms", "latency ms")
	for _, s := range res.Sides {
		fmt.Printf("%-10s %8d %8d %6.1f%% %11.1f%% %10.1f %12.1f\n", s.Engine, s.PromptTokens, s.CachedTokens, 100*s.CachedShare, 100*s.LaterShare, s.TTFTMillis, s.LatMillis)
	}
	fmt.Printf("TTFT on/off %.2f, latency on/off %.2f\n", res.TTFTRatio, res.LatRatio)
}

func sample(e *reference.Engine, prompt []int32, maxTok int, seed uint64) turn {
	sink := &firstToken{gone: make(chan struct{})}
	t0 := time.Now()
	r, err := e.SampleStream(context.Background(), &backendv1.SampleRequest{BaseModel: tiny.Name, Workspace: "bench", Prompt: prompt, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: int32(maxTok), Temperature: 0.7, TopP: 1, Seed: &seed}}, sink)
	check(err)
	s := r.GetResult().GetSequences()[0]
	return turn{prompt: len(prompt), cached: int(r.GetResult().GetPromptCachedTokens()), ttft: sink.at.Sub(t0), total: time.Since(t0),
		tokens: s.GetTokens(), logprobs: s.GetLogprobs()}
}

func summarize(name string, ts []turn, turns int) side {
	s := side{Engine: name}
	var ttft, lat time.Duration
	var laterP, laterC int
	for i, t := range ts {
		s.PromptTokens += t.prompt
		s.CachedTokens += t.cached
		if i%turns != 0 {
			laterP += t.prompt
			laterC += t.cached
		}
		ttft += t.ttft
		lat += t.total
	}
	s.CachedShare = float64(s.CachedTokens) / float64(s.PromptTokens)
	s.LaterShare = float64(laterC) / float64(max(laterP, 1))
	s.TTFTMillis = float64(ttft.Microseconds()) / 1e3 / float64(len(ts))
	s.LatMillis = float64(lat.Microseconds()) / 1e3 / float64(len(ts))
	return s
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "prefixbench:", err)
		os.Exit(1)
	}
}
