package infer

import (
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// StreamBacklog is how many decoded tokens a streamed request may have waiting for its
// client; a client that falls further behind is treated as gone and its samples are
// stopped (tokenstream.NewBuffer), so a stalled reader costs the batch nothing.
const StreamBacklog = 8192

// errDone ends Next once every choice has finished.
var errDone = errors.New("infer: every choice has finished")

// IsDone reports whether err is Next's end of the run.
func IsDone(err error) bool { return errors.Is(err, errDone) }

// Chunk is what one choice produced since the last Next.
type Chunk struct {
	// Choice is the choice's index: N per prompt, in the prompts' order.
	Choice int
	// Text is the new text (possibly empty: text that may turn out to be part of a stop
	// sequence, or an incomplete UTF-8 character, is held back until it is known).
	Text string
	// Tokens are the new tokens with their log-probs (their text is Text, and text
	// held back from earlier chunks).
	Tokens []tokenstream.Token
	// Done is set on the choice's last chunk; Stopped then says whether it ended on a stop
	// (a stop sequence or token, or the end of sequence) rather than at max_tokens.
	Done, Stopped bool
}

// Run is a request queued on the core, read with Next until it returns an error (IsDone
// once every choice has finished), then Close.
type Run struct {
	c   *Completion
	n   int
	buf *tokenstream.Buffer // nil: not streamed
	// watch is the sink of a request that is not streamed (nil: streamed, or a core that
	// cannot stop a sample): Close closes it, which stops the samples.
	watch   *tokenstream.Watch
	results chan opResult
	pending int // operations not answered yet
	// score: the prompts' log-probs were asked for (Request.ScorePrompts), with topk
	// alternatives per prompt token.
	score bool
	topk  int32
	// scoreOnly: the choices' tokens are dropped (Request.ScoreOnly).
	scoreOnly bool
	choices   []choiceState
}

type opResult struct {
	prompt int
	op     *loopsv1.Operation
	err    error
}

// choiceState is a choice's streamed text so far. Its text grows by the decoding of each
// new batch of tokens alone (a token decodes to the same bytes wherever it stands), and
// only the part not returned yet is searched for stop sequences, so a stream of n tokens
// costs O(n), not a decoding of all the tokens so far at every batch.
type choiceState struct {
	streamed int    // tokens streamed so far
	text     []byte // their text
	sent     int    // bytes of text already returned
	stopped  bool   // text has reached a stop sequence: nothing more of it is returned
	done     bool
	pending  []tokenstream.Token // tokens not returned in a chunk yet
}

// offsetSink is the request's buffer as one prompt's sink: its sequence i is choice off+i.
type offsetSink struct {
	buf *tokenstream.Buffer
	off int
}

func (s offsetSink) Token(seq int, id int32, lp float32, top []tokenstream.Alt) {
	s.buf.Token(s.off+seq, id, lp, top)
}
func (s offsetSink) Gone() <-chan struct{} { return s.buf.Gone() }

// start resolves the sampler, checks the request's bounds, tokenizes the prompts and
// queues one sample per prompt on the core (all of them first, so that they run together),
// then waits for each in the background.
//
// Every sample is given a sink whose Gone stops it (tokenstream.Streamer): the stream's
// buffer, or a Watch when the answer is not streamed; Close closes it and waits for the
// samples to end. So a client that leaves stops its samples, streamed or not, and its
// request lasts, and counts against its key, until they have really stopped.
func (e *Engine) start(ctx context.Context, req *Request, stream bool) (*Run, error) {
	if err := e.allowImages(ctx, req); err != nil {
		return nil, err
	}
	sm, key, err := e.samplerFor(ctx, req.Model)
	if err != nil {
		return nil, err
	}
	t, info, err := e.modelInfo(ctx, sm.baseModel)
	if err != nil {
		return nil, err
	}
	limit := int(max(info.GetMaxSequenceLength(), 0))
	if err := checkTopLogprobs(req, limit, 0); err != nil {
		return nil, err
	}
	ps, images, err := prompts(t, info, req)
	if err != nil {
		return nil, err
	}
	for i, p := range ps {
		if req.ScoreOnly && limit > 0 && len(p) >= limit {
			return nil, tooLong(promptParam(req, i), "%s has %d tokens; %s takes at most %d (max_sequence_length), and max_tokens 0 needs room for one token after the prompt (sampled and dropped): shorten it by one token at least",
				promptParam(req, i), len(p), sm.baseModel, limit)
		}
	}
	topk := int32(0)
	if req.ScorePrompts {
		scored := 0
		for _, p := range ps {
			scored += len(p)
		}
		if err := checkTopLogprobs(req, limit, scored); err != nil {
			return nil, err
		}
		topk = req.Params.GetTopLogprobs()
	}
	n := max(int(req.N), 1)
	r := &Run{c: &Completion{Text: t, Stop: req.Params.GetStopStrings(), Forced: forcedPrefix(t, req), N: n, Prompts: ps}, n: n,
		score: req.ScorePrompts, scoreOnly: req.ScoreOnly, topk: topk, results: make(chan opResult, len(ps)), choices: make([]choiceState, len(ps)*n)}
	if r.score {
		r.c.PromptLogprobs, r.c.PromptTop = make([][]float32, len(ps)), make([]*loopsv1.TopKLogprobs, len(ps))
	}
	streamer, canStream := e.svc.Sampling.(tokenstream.Streamer)
	switch {
	case canStream && stream:
		r.buf = tokenstream.NewBuffer(StreamBacklog)
	case canStream:
		r.watch = tokenstream.NewWatch()
	}
	queue := func(in *loopsv1.SampleRequest, i int) (*loopsv1.Operation, error) {
		switch {
		case r.buf != nil:
			return streamer.SampleStream(ctx, in, offsetSink{r.buf, i * n})
		case r.watch != nil:
			return streamer.SampleStream(ctx, in, r.watch)
		}
		return e.svc.Sampling.Sample(ctx, in)
	}
	// The waits outlive ctx: a sample runs until the core says it ended, stopped by Close.
	wctx := context.WithoutCancel(ctx)
	for i, p := range ps {
		in := &loopsv1.SampleRequest{SamplerId: sm.id, Prompt: p, NumSamples: int32(n), Params: req.Params,
			PromptLogprobs: req.ScorePrompts, TopkPromptLogprobs: topk}
		if i == 0 {
			in.PromptImages = images // the messages' prompt: the only one that holds images
		}
		op, err := queue(in, i)
		if connect.CodeOf(err) == connect.CodeNotFound && i == 0 {
			// The remembered sampler is gone (its record was deleted): create a new one once.
			// A checkpoint that is gone fails the creation with its own NotFound.
			e.samplers.drop(key, sm.id)
			if sm, _, err = e.samplerFor(ctx, req.Model); err != nil {
				return nil, err
			}
			in.SamplerId = sm.id
			op, err = queue(in, i)
		}
		if err != nil {
			r.Close() // stops and waits for the prompts queued before
			return nil, err
		}
		if i == 0 {
			r.c.ID = op.GetId()
		}
		r.c.PromptTokens += len(p)
		r.pending++
		go func() {
			op, err := e.wait(wctx, op)
			r.results <- opResult{prompt: i, op: op, err: err}
		}()
	}
	return r, nil
}

// Completion is the whole completion, complete once Next has returned IsDone.
func (r *Run) Completion() *Completion { return r.c }

// Close stops the samples that still run (their client went away, or one of them failed)
// and waits until the core says each has ended, so that the request is counted against its
// key (the gateway's requests in flight per key) for as long as its samples use the
// server. It returns at once when every sample has already ended.
func (r *Run) Close() {
	if r.buf != nil {
		r.buf.Close()
	}
	if r.watch != nil {
		r.watch.Close()
	}
	for ; r.pending > 0; r.pending-- {
		<-r.results
	}
}

// Next waits for new tokens or finished choices and returns what each choice produced.
// It returns an error when a sample failed or ctx ended, and IsDone once every choice has
// finished.
func (r *Run) Next(ctx context.Context) ([]Chunk, error) {
	for {
		if r.pending == 0 {
			return nil, errDone
		}
		var ready <-chan struct{}
		if r.buf != nil {
			ready = r.buf.Ready()
		}
		// A finished sample first: its last chunks take the tokens still buffered too.
		select {
		case res := <-r.results:
			return r.answer(res)
		default:
		}
		select {
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		case res := <-r.results:
			return r.answer(res)
		case <-ready:
			if out := r.streamed(); len(out) > 0 {
				return out, nil
			}
		}
	}
}

// answer takes a finished sample: its error, or its last chunks.
func (r *Run) answer(res opResult) ([]Chunk, error) {
	r.pending--
	if res.err != nil {
		return nil, res.err
	}
	if r.score {
		if err := r.keepScores(res); err != nil {
			return nil, err
		}
	}
	r.c.CachedTokens += min(max(int(res.op.GetSample().GetPromptCachedTokens()), 0), len(r.c.Prompts[res.prompt]))
	return r.finish(res), nil
}

// keepScores keeps a finished sample's prompt log-probs (Request.ScorePrompts), after
// checking that the backend returned them for every prompt token: one that did not fails
// the request rather than answer without them.
func (r *Run) keepScores(res opResult) error {
	s, n := res.op.GetSample(), len(r.c.Prompts[res.prompt])
	lp, tk := s.GetPromptLogprobs(), s.GetTopkPromptLogprobs()
	if len(lp) != n || (r.topk > 0 && (tk.GetK() != r.topk || int(tk.GetLength()) != n ||
		len(tk.GetTokenIds()) != n*int(r.topk) || len(tk.GetLogprobs()) != n*int(r.topk))) {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New(
			"the backend serving this model did not return the prompt's log-probs (echo with logprobs; the reference engine and the torch worker's transformers sampler do): ask without logprobs"))
	}
	r.c.PromptLogprobs[res.prompt] = lp
	if r.topk > 0 {
		r.c.PromptTop[res.prompt] = tk
	}
	return nil
}

// streamed turns the tokens the buffer holds into chunks.
func (r *Run) streamed() []Chunk {
	var touched []int
	for _, t := range r.buf.Take() {
		if t.Seq < 0 || t.Seq >= len(r.choices) {
			continue
		}
		cs := &r.choices[t.Seq]
		if cs.done {
			continue
		}
		if len(cs.pending) == 0 {
			touched = append(touched, t.Seq)
		}
		cs.pending = append(cs.pending, t)
	}
	out := make([]Chunk, 0, len(touched))
	for _, i := range touched {
		cs := &r.choices[i]
		ch := Chunk{Choice: i, Tokens: cs.pending}
		cs.streamed += len(cs.pending)
		if !cs.stopped {
			ids := make([]int32, len(cs.pending))
			for k, t := range cs.pending {
				ids[k] = t.ID
			}
			cs.text = append(cs.text, r.c.Text.Decode(ids)...)
			// A stop sequence never starts in the text returned already: safeLen holds
			// back any end of the text that may start one.
			unsent := string(cs.text[cs.sent:])
			safe := safeLen(unsent, r.c.Stop)
			ch.Text = unsent[:safe]
			cs.sent += safe
			cs.stopped = len(cutStop(unsent, r.c.Stop)) < len(unsent)
		}
		cs.pending = nil
		out = append(out, ch)
	}
	return out
}

// finish turns a finished operation into the last chunk of each of its choices: the tokens
// and text not streamed yet (all of them when the backend did not stream).
func (r *Run) finish(res opResult) []Chunk {
	seqs := res.op.GetSample().GetSequences()
	var out []Chunk
	if r.buf != nil {
		out = r.streamed() // tokens still buffered come before the end
	}
	for j, seq := range seqs {
		i := res.prompt*r.n + j
		if i >= len(r.choices) {
			break
		}
		for len(r.c.Seqs) <= i {
			r.c.Seqs = append(r.c.Seqs, nil)
		}
		if r.scoreOnly {
			seq = &loopsv1.SampledSequence{StopReason: loopsv1.StopReason_STOP_REASON_LENGTH}
		}
		r.c.Seqs[i] = seq
		cs := &r.choices[i]
		ch := Chunk{Choice: i, Done: true, Stopped: r.c.Stopped(i)}
		for k := cs.streamed; k < len(seq.GetTokens()); k++ {
			var lp float32
			if k < len(seq.GetLogprobs()) {
				lp = seq.GetLogprobs()[k]
			}
			ch.Tokens = append(ch.Tokens, tokenstream.Token{Seq: i, ID: seq.GetTokens()[k], Logprob: lp, Top: topRow(seq.GetTopLogprobs(), k)})
		}
		final := r.c.ChoiceText(i)
		if cs.sent <= len(final) {
			ch.Text = final[cs.sent:]
		}
		cs.done, cs.text, cs.pending = true, nil, nil
		out = append(out, ch)
	}
	return out
}

// safeLen is how much of a choice's decoded text so far can be sent: up to its first stop
// sequence, short of a suffix that may be the start of one, and short of an incomplete
// UTF-8 character at its end (at most 3 bytes: the start of a character whose last bytes
// have not come yet). Anything else is sent, invalid UTF-8 included (each invalid byte
// reads as U+FFFD now and in the final text alike), so a sample that produces bytes that
// never form a character cannot hold the stream back until it ends.
func safeLen(s string, stop []string) int {
	n := len(cutStop(s, stop))
	if n < len(s) {
		return n
	}
	// Hold back the longest start of any stop sequence that the text ends with; each stop
	// is matched against the whole text, not against what another stop left.
	held := 0
	for _, st := range stop {
		for k := min(len(st)-1, n); k > held; k-- {
			if strings.HasSuffix(s, st[:k]) {
				held = k
				break
			}
		}
	}
	n -= held
	return n - incompleteSuffix(s[:n])
}

// incompleteSuffix is the length of the incomplete UTF-8 character that s ends with: the
// last 1 to 3 bytes when they are the valid start of a character still missing bytes, and
// 0 otherwise.
func incompleteSuffix(s string) int {
	for k := 1; k < utf8.UTFMax && k <= len(s); k++ {
		if c := s[len(s)-k]; utf8.RuneStart(c) {
			if c >= utf8.RuneSelf && !utf8.FullRuneInString(s[len(s)-k:]) {
				return k
			}
			return 0
		}
	}
	return 0
}

func indexOf(s, sub string) int { return strings.Index(s, sub) }
