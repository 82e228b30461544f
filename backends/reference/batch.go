package reference

import (
	"context"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/loops-dev/loops/backends/reference/nn"
)

// Continuous batching, shared fairly between workspaces. Each base model has one decoder:
// a goroutine, started when a Sample call arrives and ended when it has nothing left, that
// decodes the sequences of every sampling request on that model together. Requests are
// grouped by workspace (SampleRequest.workspace, which the gateway sets; a request without
// one is a workspace of its own), and each workspace's service is the engine time spent on
// it: the time of its prefill pieces, and of each decoding step a share in proportion to
// its rows. A workspace that arrives starts level with the least served one present (no
// credit is banked while away). At each step boundary the decoder
//
//  1. drops the requests whose caller has gone (context done);
//  2. prefills the prompts of the least served workspace that has prompt tokens waiting
//     (ties: one that has not run since it arrived, then the one with the fewest tokens
//     left in its oldest prompt), unless it is prefillSlice or more ahead of another
//     workspace with work: oldest prompt first, a piece of each up to the end of its chunk
//     (nn.PrefillChunk: prompts are cut at fixed positions, and a chunk run in pieces of
//     any size gives the bits of the whole chunk: nn.PrefillPieces), within a token
//     budget. With other workspaces decoding, the budget is what takes the workspace to
//     about prefillSlice ahead of the least served of them, at least minPiece tokens; with
//     none, what takes about aloneSlice (or prefillSlice for leftGrace after a workspace
//     left: a client that samples in a loop is back within a round trip). Budgets in time
//     become tokens through a cost per token of a + b·position fitted to the pieces run
//     (prefillCost). So a decoding step waits for at most one piece, and a workspace that
//     prefills long prompts takes the engine in turn with those decoding, not before them;
//  3. shares the batch's rows (Options.MaxBatchSequences) between the workspaces with
//     sequences to decode, max-min fairly (the rows left over go to the least served), and
//     fills each workspace's share with its started sequences, oldest first, then starts
//     new ones of its prefilled requests, one per request in turn, so a request of many
//     samples cannot keep a one-sample request out. A started sequence left out of a step
//     keeps its cache and decodes at a later one: a workspace that fills the batch gives a
//     row to a newly arrived one at the next step. The caches the started sequences may
//     grow to (prompt + max_tokens positions each) stay within Options.MaxBatchKVBytes: a
//     sequence that does not fit holds back every start until it does (the batch drains;
//     the least served workspace starts first; the rows it leaves go to started sequences
//     left out), and one over the whole budget starts when nothing else is started;
//  4. runs one decoding step over the sequences given rows (nn.Model.Decode: one batched
//     forward, each adapter's LoRA terms on its rows, each sequence its own cache), then
//     answers the requests whose sequences have all ended.
//
// So a light workspace's sample that arrives while others prefill long prompts or fill the
// batch is prefilled at the next boundary (after the step and the piece running when it
// came) and decodes from that boundary's step; while it decodes, the others get about as
// much of the engine's time as it does (bench/fairness/README.md). Every row of a step is computed independently of
// the others, and a prompt's pieces give the bits of its whole chunks, so a request's
// tokens and log-probs are the same bits as when it decodes alone, whatever it is batched
// with and however its prompt was cut.

// Defaults of the batching limits.
const (
	// DefaultMaxBatchSequences is the default of Options.MaxBatchSequences.
	DefaultMaxBatchSequences = 64
	// DefaultMaxBatchKVBytes is the default of Options.MaxBatchKVBytes (1 GiB).
	DefaultMaxBatchKVBytes = 1 << 30
)

const (
	// prefillSlice is how far ahead (in engine time) of the least served other workspace
	// a prefill piece may take its workspace while others decode: about the longest a
	// decoding step waits for another workspace's prompt.
	prefillSlice = 3 * time.Millisecond
	// aloneSlice is about how long a prefill piece runs when no other workspace decodes:
	// long enough that a prompt's pieces cost little more than its whole chunks, short
	// enough that a workspace that arrives waits little for the piece running then.
	aloneSlice = 25 * time.Millisecond
	// leftGrace is how long after a workspace's last request ends prefill pieces stay as
	// short as when it decodes: a client that samples in a loop sends its next request
	// within a round trip, and finds no long piece in its way.
	leftGrace = 50 * time.Millisecond
	// minPiece is the fewest prompt tokens a prefill piece runs (fewer only at the end of a
	// chunk): smaller pieces read the weights for too few rows. On loops/tiny a 512-token
	// prompt costs about 1.7× as much in pieces of 16 as in one, 1.3× in pieces of 32, 2-4×
	// in pieces of 4 to 8; pieces this small run only while another workspace decodes, and
	// smaller ones keep its steps closer together (bench/fairness: 16 against 32, its
	// latency 15% lower, the prompts' workspace's tokens/s the same).
	minPiece = 16
	// minAlonePiece is the fewest prompt tokens a prefill piece runs when no other
	// workspace decodes (fewer only at the end of a chunk). aloneSlice alone gives a few
	// tokens a piece on a large model (about 4 at the Qwen3-0.6B shape on 2 cores, so
	// minPiece), and pieces that small run through the row kernels and read every weight
	// for each: a 700-token prompt at that shape took 42–45 CPU-seconds through the
	// OpenAI route against 8.5 for the engine's own prefill (bench/llamacpp). Pieces of 128
	// go through the packed SGEMM and read the weights once per 128 rows; a workspace that
	// arrives meanwhile waits for at most one such piece.
	minAlonePiece = 128
)

// decodeJob is one Sample call in the decoder.
type decodeJob struct {
	ctx  context.Context
	g    *nn.Gen[float32]
	ws   string        // the workspace ("" for one of its own)
	kv   int64         // cache bytes one of its sequences may reach
	done chan struct{} // closed when g is done (or dropped: ctx done; or the decoder panicked)
	// panic is set, before done is closed, when the decoder panicked with this job in flight.
	panic *decoderPanic
}

// decoder batches the sampling requests of one base model.
type decoder struct {
	m       *nn.Model[float32]
	maxSeqs int
	maxKV   int64

	mu       sync.Mutex
	incoming []*decodeJob
	running  bool // the loop goroutine is alive
	stats    decoderStats
	// beforeStep, when set (tests), runs at the start of every step boundary.
	beforeStep func()
	// maxPiece, when > 0 (tests), caps every prefill piece at that many tokens.
	maxPiece int
}

// decoderStats count what the decoder did (tests and benchmarks).
type decoderStats struct {
	steps, rows, maxRows int
	// pieces and prefilled count the prefill steps and the prompt tokens they ran; paused
	// the rows of started sequences left out of a step for another workspace's.
	pieces, prefilled, paused int
}

func newDecoder(m *nn.Model[float32], maxSeqs int, maxKV int64) *decoder {
	return &decoder{m: m, maxSeqs: maxSeqs, maxKV: maxKV}
}

// kvBytesPerPosition is the size of one position of a sequence's cache.
func kvBytesPerPosition(m *nn.Model[float32]) int64 {
	return int64(m.Cfg.Layers) * 2 * int64(m.KVDim()) * 4
}

// run decodes g, a request of workspace ws, in the batch and returns when it is done, or
// with ctx's error when the caller gives up first (the decoder drops it at the next step
// boundary).
func (d *decoder) run(ctx context.Context, ws string, g *nn.Gen[float32]) error {
	j := &decodeJob{ctx: ctx, g: g, ws: ws, kv: int64(g.Positions()) * kvBytesPerPosition(d.m), done: make(chan struct{})}
	d.mu.Lock()
	d.incoming = append(d.incoming, j)
	if !d.running {
		d.running = true
		go d.loop()
	}
	d.mu.Unlock()
	select {
	case <-j.done:
		if j.panic != nil {
			panic(j.panic)
		}
		if !g.Done() {
			return ctx.Err()
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loop is the decoder goroutine (see the top of the file).
func (d *decoder) loop() {
	var st decodeState
	for {
		d.mu.Lock()
		for _, j := range d.incoming {
			st.add(j)
		}
		clear(d.incoming)
		d.incoming = d.incoming[:0]
		if len(st.flows) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		d.boundary(&st)
	}
}

// flow is one workspace's requests in the decoder.
type flow struct {
	ws     string
	jobs   []*decodeJob          // in flight, oldest first
	seqs   []*nn.GenSeq[float32] // started and not ended, oldest first
	served time.Duration         // engine time spent on it (see the top of the file)
	order  uint64                // arrival order, the last tie-break
	fresh  bool                  // it has not run a prefill piece since it arrived
	// want, share and rows are scratch of a boundary's admission: its sequences that could
	// decode (started, or ready to start), the rows it is given, and those it fills.
	want, share, rows int
}

// waiting is how many prompt tokens its oldest request being prefilled has left (0: none).
func (f *flow) waiting() int {
	for _, j := range f.jobs {
		if n := j.g.Left(); n > 0 {
			return n
		}
	}
	return 0
}

// ready is how many sequences of its prefilled requests are still to start.
func (f *flow) ready() int {
	n := 0
	for _, j := range f.jobs {
		if j.g.Prefilled() {
			n += j.g.Pending()
		}
	}
	return n
}

// nextPosition is the prompt position its next prefill piece starts at (that of its
// oldest request being prefilled).
func (f *flow) nextPosition() int {
	for _, j := range f.jobs {
		if n := j.g.Left(); n > 0 {
			return j.g.Prompt() - n
		}
	}
	return 0
}

// before orders flows for prefill and rows: least served first, then one that has not run
// since it arrived, then the fewest prompt tokens left in its oldest prompt, then the first
// to arrive.
func (f *flow) before(o *flow) bool {
	if f.served != o.served {
		return f.served < o.served
	}
	if f.fresh != o.fresh {
		return f.fresh
	}
	if a, b := f.waiting(), o.waiting(); a != b {
		return a < b
	}
	return f.order < o.order
}

// decodeState is what the decoder holds between step boundaries.
type decodeState struct {
	flows []*flow // with requests in flight, in arrival order
	kv    int64   // cache bytes the started sequences may reach
	// vclock is the least service among the flows (kept when none is left): where a new
	// flow starts.
	vclock time.Duration
	orders uint64
	// cost estimates what a prefill piece takes.
	cost prefillCost
	// left is when a workspace's flow last left (its requests all answered).
	left time.Time
	// scratch
	pieces []nn.Piece[float32]
	rows   []*nn.GenSeq[float32]
	sorted []*flow
}

// add puts a new request in its workspace's flow.
func (st *decodeState) add(j *decodeJob) {
	if j.ws != "" {
		for _, f := range st.flows {
			if f.ws == j.ws {
				f.jobs = append(f.jobs, j)
				return
			}
		}
	}
	v := st.vclock
	for i, f := range st.flows {
		if i == 0 || f.served < v {
			v = f.served
		}
	}
	st.orders++
	st.flows = append(st.flows, &flow{ws: j.ws, jobs: []*decodeJob{j}, served: v, order: st.orders, fresh: true})
}

// decoderPanic is a panic of the decoder goroutine, handed to every request in flight at
// the time, each of which raises it again on its caller's goroutine (where
// backends.Guard turns it into an error).
type decoderPanic struct {
	value any
	stack []byte
}

func (p *decoderPanic) String() string {
	return fmt.Sprintf("%v\n[decoder goroutine]\n%s", p.value, p.stack)
}

// boundary runs one step boundary (see the top of the file). A panic fails the requests
// in flight (with the panic) and leaves the decoder empty.
func (d *decoder) boundary(st *decodeState) {
	defer func() {
		if v := recover(); v != nil {
			p := &decoderPanic{value: v, stack: debug.Stack()}
			for _, f := range st.flows {
				for _, j := range f.jobs {
					j.panic = p
					close(j.done)
				}
			}
			*st = decodeState{vclock: st.vclock, orders: st.orders}
		}
	}()
	if d.beforeStep != nil {
		d.beforeStep()
	}
	d.dropGone(st)
	d.prefill(st)
	rows := d.admit(st)
	d.decode(st, rows)
	st.finish()
}

// dropGone drops the requests whose caller has gone, and their sequences (1.).
func (d *decoder) dropGone(st *decodeState) {
	for _, f := range st.flows {
		var gone map[*nn.Gen[float32]]bool
		f.jobs = slices.DeleteFunc(f.jobs, func(j *decodeJob) bool {
			if j.ctx.Err() == nil {
				return false
			}
			if gone == nil {
				gone = map[*nn.Gen[float32]]bool{}
			}
			gone[j.g] = true
			close(j.done)
			return true
		})
		if gone != nil {
			f.seqs = slices.DeleteFunc(f.seqs, func(s *nn.GenSeq[float32]) bool {
				if gone[s.Gen()] {
					st.kv -= int64(s.Gen().Positions()) * kvBytesPerPosition(d.m)
					return true
				}
				return false
			})
		}
	}
}

// prefill runs a piece of the prompts of the least served workspace with prompt tokens
// waiting, unless it is ahead of another workspace with work (2.).
func (d *decoder) prefill(st *decodeState) {
	var f *flow
	for _, c := range st.flows {
		if len(c.seqs) < d.maxSeqs && c.waiting() > 0 && (f == nil || c.before(f)) {
			f = c
		}
	}
	if f == nil {
		return
	}
	other, othersDecode := time.Duration(math.MaxInt64), false
	for _, c := range st.flows {
		decoding := len(c.seqs) > 0 || c.ready() > 0
		if c == f || !decoding && c.waiting() == 0 {
			continue
		}
		other = min(other, c.served)
		othersDecode = othersDecode || decoding
	}
	lead := f.served - other // how far ahead of the least served other workspace with work
	if other == math.MaxInt64 {
		lead = 0
	}
	if lead >= prefillSlice {
		return // its turn comes when the others have caught up
	}
	// the time it may take: up to a slice ahead of the others that decode (or of one that
	// has just left: a client that samples in a loop is back within a round trip), else a
	// longer slice
	slice, floor := aloneSlice, minAlonePiece
	if othersDecode || time.Since(st.left) < leftGrace {
		slice, floor = prefillSlice-lead, minPiece
	}
	budget := max(st.cost.tokens(slice, f.nextPosition()), floor)
	if d.maxPiece > 0 {
		budget = min(budget, d.maxPiece)
	}
	pieces := st.pieces[:0]
	for _, j := range f.jobs {
		if budget <= 0 {
			break
		}
		if n := min(j.g.NextChunk(), budget); n > 0 {
			pieces = append(pieces, nn.Piece[float32]{Gen: j.g, N: n})
			budget -= n
		}
	}
	var sumPos int
	for _, p := range pieces {
		q := p.Gen.Prompt() - p.Gen.Left()
		sumPos += p.N*q + p.N*(p.N-1)/2
	}
	start := time.Now()
	n := nn.PrefillPieces(pieces)
	took := time.Since(start)
	clear(pieces)
	st.pieces = pieces[:0]
	f.served += took
	f.fresh = false
	st.cost.observe(n, sumPos, took)

	d.mu.Lock()
	d.stats.pieces++
	d.stats.prefilled += n
	d.mu.Unlock()
}

// admit shares the batch's rows between the workspaces and returns the sequences to decode
// in this step, starting new ones where a workspace's share allows (3.).
func (d *decoder) admit(st *decodeState) []*nn.GenSeq[float32] {
	sorted := append(st.sorted[:0], st.flows...)
	slices.SortStableFunc(sorted, func(a, b *flow) int {
		if a.before(b) {
			return -1
		}
		if b.before(a) {
			return 1
		}
		return 0
	})
	started := 0
	for _, f := range sorted {
		f.want, f.share, f.rows = len(f.seqs)+f.ready(), 0, 0
		started += len(f.seqs)
	}
	shareRows(sorted, d.maxSeqs)
	rows := st.rows[:0]
	paused, blocked := 0, false
	for _, f := range sorted {
		take := min(f.share, len(f.seqs))
		rows = append(rows, f.seqs[:take]...)
		paused += len(f.seqs) - take
		for more := true; more && take < f.share && !blocked; {
			more = false
			for _, j := range f.jobs {
				if take >= f.share {
					break
				}
				if !j.g.Prefilled() || j.g.Pending() == 0 {
					continue
				}
				if started > 0 && st.kv+j.kv > d.maxKV {
					blocked = true // no start after it either: the batch drains until it fits
					break
				}
				if s := j.g.Start(); !s.Done() {
					f.seqs = append(f.seqs, s)
					rows = append(rows, s)
					st.kv += j.kv
					started++
					take++
				}
				more = true
			}
		}
		f.rows = take
	}
	// rows left over (a start held back by the cache budget) go to started sequences left
	// out, so the batch never stands still while a start waits for room
	for _, f := range sorted {
		for f.rows < len(f.seqs) && len(rows) < d.maxSeqs {
			rows = append(rows, f.seqs[f.rows])
			f.rows++
			paused--
		}
	}
	clear(sorted)
	st.sorted = sorted[:0]
	if paused > 0 {
		d.mu.Lock()
		d.stats.paused += paused
		d.mu.Unlock()
	}
	return rows
}

// shareRows sets each flow's share of n rows: max-min fair over what each wants (each gets
// what it wants or an equal part of what is left, whichever is less), the rows that do not
// divide evenly going to the flows first in order.
func shareRows(flows []*flow, n int) {
	for n > 0 {
		short := 0
		for _, f := range flows {
			if f.share < f.want {
				short++
			}
		}
		if short == 0 {
			return
		}
		each := max(n/short, 1)
		for _, f := range flows {
			if give := min(each, f.want-f.share, n); give > 0 {
				f.share += give
				n -= give
			}
		}
	}
}

// decode runs one step for rows and charges its time to the workspaces by their rows (4.).
func (d *decoder) decode(st *decodeState, rows []*nn.GenSeq[float32]) {
	if len(rows) > 0 {
		start := time.Now()
		d.m.Decode(rows)
		took := time.Since(start)
		for _, f := range st.flows {
			f.served += took * time.Duration(f.rows) / time.Duration(len(rows))
		}

		d.mu.Lock()
		d.stats.steps++
		d.stats.rows += len(rows)
		d.stats.maxRows = max(d.stats.maxRows, len(rows))
		d.mu.Unlock()
	}
	clear(rows)
	st.rows = rows[:0]
	for _, f := range st.flows {
		f.seqs = slices.DeleteFunc(f.seqs, func(s *nn.GenSeq[float32]) bool {
			if s.Done() {
				st.kv -= int64(s.Gen().Positions()) * kvBytesPerPosition(d.m)
				return true
			}
			return false
		})
	}
}

// finish answers the requests that are done and drops the flows left without any.
func (st *decodeState) finish() {
	st.flows = slices.DeleteFunc(st.flows, func(f *flow) bool {
		f.jobs = slices.DeleteFunc(f.jobs, func(j *decodeJob) bool {
			if j.g.Done() {
				close(j.done)
				return true
			}
			return false
		})
		if len(f.jobs) == 0 {
			if f.ws != "" { // a request of its own does not come back
				st.left = time.Now()
			}
			return true
		}
		return false
	})
	for i, f := range st.flows {
		if i == 0 || f.served < st.vclock {
			st.vclock = f.served
		}
	}
}

// prefillCost estimates the engine time of a prefill piece from those run: a prompt token
// costs a + b·position (the products, and the attention over the positions before it),
// fitted by least squares over the pieces run, the older ones weighing less.
type prefillCost struct {
	// decayed sums over pieces of x1 = tokens, x2 = Σ positions, y = seconds
	s11, s12, s22, s1y, s2y float64
}

// costMemory is the weight a piece's observation keeps after each later one.
const costMemory = 0.95

// observe records a piece of tokens prompt tokens at positions summing to sumPos that
// took took.
func (c *prefillCost) observe(tokens, sumPos int, took time.Duration) {
	if tokens <= 0 {
		return
	}
	x1, x2, y := float64(tokens), float64(sumPos), took.Seconds()
	c.s11 = costMemory*c.s11 + x1*x1
	c.s12 = costMemory*c.s12 + x1*x2
	c.s22 = costMemory*c.s22 + x2*x2
	c.s1y = costMemory*c.s1y + x1*y
	c.s2y = costMemory*c.s2y + x2*y
}

// perToken returns a and b (seconds; see prefillCost), b = 0 when the pieces seen do not
// tell them apart or give no positive fit.
func (c *prefillCost) perToken() (a, b float64) {
	if c.s11 == 0 {
		return 0, 0
	}
	if det := c.s11*c.s22 - c.s12*c.s12; det > 1e-9*c.s11*c.s22 {
		a, b = (c.s22*c.s1y-c.s12*c.s2y)/det, (c.s11*c.s2y-c.s12*c.s1y)/det
		if a > 0 && b >= 0 {
			return a, b
		}
	}
	return c.s1y / c.s11, 0
}

// tokens is how many prompt tokens from position pos a piece may run to take about d, at
// most nn.PrefillChunk (0 before any piece has run).
func (c *prefillCost) tokens(d time.Duration, pos int) int {
	a, b := c.perToken()
	t := d.Seconds()
	var n float64
	switch {
	case a <= 0 || t <= 0:
		return 0
	case b == 0:
		n = t / a
	default: // a·n + b·(n·pos + n(n-1)/2) = t
		B := a + b*(float64(pos)-0.5)
		n = (-B + math.Sqrt(B*B+2*b*t)) / b
	}
	return int(min(n, float64(nn.PrefillChunk)))
}
