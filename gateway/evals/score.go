package evals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Model is the checkpoint being scored, as Score uses it.
type Model interface {
	// Logprobs returns the log-probs of the last n tokens of tokens, each given every token
	// before it (temperature 1), in order.
	Logprobs(ctx context.Context, tokens []int32, n int) ([]float64, error)
	// Generate continues prompt greedily (temperature 0) by at most maxTokens tokens and
	// returns the tokens generated.
	Generate(ctx context.Context, prompt []int32, maxTokens int) ([]int32, error)
}

// Tokenizer turns a row's text into the base model's tokens and generated tokens back
// into text.
type Tokenizer interface {
	Encode(text string) []int32
	Decode(tokens []int32) string
}

// Result is a checkpoint's score on an eval.
type Result struct {
	Score   float64
	N       int64
	Metrics map[string]float64
}

// RewardInput is one reward row as the reward function gets it.
type RewardInput struct {
	Prompt     string          `json:"prompt"`
	Completion string          `json:"completion"`
	Info       json.RawMessage `json:"info,omitempty"`
}

// Rewarder runs a reward eval's function on its rows' completions, one reward each.
type Rewarder func(ctx context.Context, inputs []RewardInput) ([]float64, error)

// Options bound a Score.
type Options struct {
	// Reward scores reward evals' completions (nil: reward evals fail).
	Reward Rewarder
	// Parallel is how many rows are scored at once (at least 1).
	Parallel int
	// MaxSeqLen is the longest sequence the model takes (0: no bound checked here); a row
	// longer than it fails the eval, naming the row.
	MaxSeqLen int
}

// HigherIsBetter reports whether a higher score of kind is better.
func HigherIsBetter(kind loopsv1.EvalKind) bool { return kind != loopsv1.EvalKind_EVAL_KIND_NLL }

// GenerateTokens is a generation eval's max_tokens (DefaultGenerateTokens for 0).
func GenerateTokens(e *loopsv1.Eval) int {
	if e.GetMaxTokens() == 0 {
		return DefaultGenerateTokens
	}
	return int(e.GetMaxTokens())
}

// rowOutcome is what one row contributes.
type rowOutcome struct {
	nll       float64 // NLL: summed over the completion's tokens
	tokens    int     // NLL: completion tokens; generation: tokens generated
	correct   bool    // multiple choice, generation
	generated string
	prompt    string // reward: the prompt's text
}

// Score scores model m on rows (decoded for e) and returns the eval's result: for NLL the
// mean negative log-prob per completion token (metrics nll, perplexity, tokens); for
// multiple choice the accuracy (the choice with the highest summed log-prob wins, the
// first on a tie); for generation the fraction of rows whose greedy continuation (cut
// before the first of e's stop strings) matches the target. Rows run opts.Parallel at a
// time; the first error ends the score.
func Score(ctx context.Context, e *loopsv1.Eval, rows []Row, tok Tokenizer, m Model, opts Options) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	outs := make([]rowOutcome, len(rows))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	next := make(chan int)
	for range max(opts.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				o, err := scoreRow(ctx, e, &rows[i], tok, m, opts)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("row %d: %w", i+1, err)
						cancel()
					}
					mu.Unlock()
					continue
				}
				outs[i] = o
			}
		}()
	}
feed:
	for i := range rows {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return Result{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if e.GetKind() == loopsv1.EvalKind_EVAL_KIND_REWARD {
		return reward(ctx, rows, outs, opts.Reward)
	}
	return aggregate(e, outs), nil
}

// reward runs the reward function on the rows' completions: the score is the mean reward.
func reward(ctx context.Context, rows []Row, outs []rowOutcome, fn Rewarder) (Result, error) {
	if fn == nil {
		return Result{}, errors.New("this gateway runs no reward functions")
	}
	in := make([]RewardInput, len(outs))
	generated := 0
	for i, o := range outs {
		in[i] = RewardInput{Prompt: o.prompt, Completion: o.generated, Info: rows[i].Info}
		generated += o.tokens
	}
	rs, err := fn(ctx, in)
	if err != nil {
		return Result{}, err
	}
	if len(rs) != len(in) {
		return Result{}, fmt.Errorf("the reward function returned %d rewards for %d rows", len(rs), len(in))
	}
	var sum float64
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, r := range rs {
		if math.IsNaN(r) || math.IsInf(r, 0) {
			return Result{}, fmt.Errorf("row %d: the reward is not a finite number", i+1)
		}
		sum += r
		lo, hi = min(lo, r), max(hi, r)
	}
	n := float64(len(rs))
	return Result{Score: sum / n, N: int64(len(rs)), Metrics: map[string]float64{
		"mean_reward": sum / n, "min_reward": lo, "max_reward": hi, "mean_generated_tokens": float64(generated) / n,
	}}, nil
}

// aggregate sums the rows' outcomes into the eval's result.
func aggregate(e *loopsv1.Eval, outs []rowOutcome) Result {
	n := int64(len(outs))
	r := Result{N: n, Metrics: map[string]float64{}}
	switch e.GetKind() {
	case loopsv1.EvalKind_EVAL_KIND_NLL:
		var sum float64
		var tokens int
		for _, o := range outs {
			sum += o.nll
			tokens += o.tokens
		}
		r.Score = sum / float64(tokens)
		r.Metrics["nll"] = r.Score
		r.Metrics["perplexity"] = math.Exp(r.Score)
		r.Metrics["tokens"] = float64(tokens)
	default:
		correct, generated := 0, 0
		for _, o := range outs {
			if o.correct {
				correct++
			}
			generated += o.tokens
		}
		r.Score = float64(correct) / float64(n)
		if e.GetKind() == loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE {
			r.Metrics["accuracy"] = r.Score
		} else {
			r.Metrics["match_rate"] = r.Score
			r.Metrics["mean_generated_tokens"] = float64(generated) / float64(n)
		}
	}
	return r
}

// tokens returns a field's tokens.
func tokens(t Text, tok Tokenizer) ([]int32, error) {
	if t.IsTokens {
		return t.Tokens, nil
	}
	if tok == nil {
		return nil, errors.New("the base model has no tokenizer this server can read: give the row's fields as token ids")
	}
	ids := tok.Encode(t.S)
	if len(ids) == 0 {
		return nil, errors.New("a text field tokenizes to no tokens")
	}
	return ids, nil
}

// sumLogprobs is the summed log-prob of cont after prompt.
func sumLogprobs(ctx context.Context, m Model, prompt, cont []int32, opts Options) (float64, error) {
	seq := append(append(make([]int32, 0, len(prompt)+len(cont)), prompt...), cont...)
	if opts.MaxSeqLen > 0 && len(seq) > opts.MaxSeqLen {
		return 0, fmt.Errorf("prompt and continuation are %d tokens, more than the model's %d", len(seq), opts.MaxSeqLen)
	}
	lps, err := m.Logprobs(ctx, seq, len(cont))
	if err != nil {
		return 0, err
	}
	if len(lps) != len(cont) {
		return 0, fmt.Errorf("the model returned %d log-probs for %d tokens", len(lps), len(cont))
	}
	var s float64
	for _, lp := range lps {
		if math.IsNaN(lp) {
			return 0, errors.New("the model returned no log-prob for a continuation token")
		}
		s += lp
	}
	return s, nil
}

func scoreRow(ctx context.Context, e *loopsv1.Eval, r *Row, tok Tokenizer, m Model, opts Options) (rowOutcome, error) {
	prompt, err := tokens(r.Prompt, tok)
	if err != nil {
		return rowOutcome{}, err
	}
	switch e.GetKind() {
	case loopsv1.EvalKind_EVAL_KIND_NLL:
		comp, err := tokens(*r.Completion, tok)
		if err != nil {
			return rowOutcome{}, err
		}
		s, err := sumLogprobs(ctx, m, prompt, comp, opts)
		return rowOutcome{nll: -s, tokens: len(comp)}, err
	case loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE:
		best, bestAt := math.Inf(-1), -1
		for i, c := range r.Choices {
			ct, err := tokens(c, tok)
			if err != nil {
				return rowOutcome{}, err
			}
			s, err := sumLogprobs(ctx, m, prompt, ct, opts)
			if err != nil {
				return rowOutcome{}, err
			}
			if bestAt < 0 || s > best {
				best, bestAt = s, i
			}
		}
		return rowOutcome{correct: bestAt == *r.Answer}, nil
	case loopsv1.EvalKind_EVAL_KIND_GENERATION, loopsv1.EvalKind_EVAL_KIND_REWARD:
		if tok == nil {
			return rowOutcome{}, errors.New("the base model has no tokenizer this server can read, and a generation eval decodes its output")
		}
		maxTokens := GenerateTokens(e)
		if opts.MaxSeqLen > 0 && len(prompt)+maxTokens > opts.MaxSeqLen {
			return rowOutcome{}, fmt.Errorf("the prompt (%d tokens) and max_tokens (%d) are more than the model's %d", len(prompt), maxTokens, opts.MaxSeqLen)
		}
		out, err := m.Generate(ctx, prompt, maxTokens)
		if err != nil {
			return rowOutcome{}, err
		}
		text := CutAtStop(tok.Decode(out), e.GetStop())
		if e.GetKind() == loopsv1.EvalKind_EVAL_KIND_REWARD {
			p := r.Prompt.S
			if r.Prompt.IsTokens {
				p = tok.Decode(prompt)
			}
			return rowOutcome{tokens: len(out), generated: text, prompt: p}, nil
		}
		return rowOutcome{correct: Matches(e.GetMatch(), r, text), tokens: len(out), generated: text}, nil
	}
	return rowOutcome{}, fmt.Errorf("eval kind %v is not one this server scores", e.GetKind())
}

// CutAtStop cuts text before the first occurrence of any stop string.
func CutAtStop(text string, stops []string) string {
	cut := len(text)
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && i < cut {
			cut = i
		}
	}
	return text[:cut]
}

// Matches reports whether generated text matches a generation row's target.
func Matches(match loopsv1.EvalMatch, r *Row, text string) bool {
	target := r.Target.S
	switch match {
	case loopsv1.EvalMatch_EVAL_MATCH_CONTAINS:
		return strings.Contains(text, target)
	case loopsv1.EvalMatch_EVAL_MATCH_REGEX:
		return r.re != nil && r.re.MatchString(text)
	default:
		return strings.TrimSpace(text) == strings.TrimSpace(target)
	}
}
