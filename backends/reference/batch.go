package reference

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/loops-dev/loops/backends/reference/nn"
)

// Continuous batching. Each base model has one decoder: a goroutine, started when a Sample
// call arrives and ended when it has nothing left, that decodes the sequences of every
// sampling request on that model together. At each step boundary it
//
//  1. drops the requests whose caller has gone (context done);
//  2. prefills waiting requests, oldest first, up to nn.PrefillChunk prompt tokens in all
//     (at least one chunk; a long prompt takes several boundaries);
//  3. starts sequences of prefilled requests while the batch has room, one per request in
//     turn, so a request of many samples cannot keep a one-sample request out: at most
//     Options.MaxBatchSequences sequences decode at once, and the caches they may grow to
//     (prompt + max_tokens positions each) stay within Options.MaxBatchKVBytes (a request
//     whose next sequence does not fit holds back the requests after it until it does; a
//     sequence over the whole budget runs when the batch is otherwise empty);
//  4. runs one decoding step over all active sequences (nn.Model.Decode: one batched
//     forward, each adapter's LoRA terms on its rows, each sequence its own cache), then
//     answers the requests whose sequences have all ended.
//
// Every row of a step is computed independently of the others, so a request's tokens and
// log-probs are the same bits as when it decodes alone, whatever it is batched with.

// Defaults of the batching limits.
const (
	// DefaultMaxBatchSequences is the default of Options.MaxBatchSequences.
	DefaultMaxBatchSequences = 64
	// DefaultMaxBatchKVBytes is the default of Options.MaxBatchKVBytes (1 GiB).
	DefaultMaxBatchKVBytes = 1 << 30
)

// decodeJob is one Sample call in the decoder.
type decodeJob struct {
	ctx  context.Context
	g    *nn.Gen[float32]
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
}

// decoderStats count what the decoder did (tests and benchmarks).
type decoderStats struct {
	steps, rows, maxRows int
}

func newDecoder(m *nn.Model[float32], maxSeqs int, maxKV int64) *decoder {
	return &decoder{m: m, maxSeqs: maxSeqs, maxKV: maxKV}
}

// kvBytesPerPosition is the size of one position of a sequence's cache.
func kvBytesPerPosition(m *nn.Model[float32]) int64 {
	return int64(m.Cfg.Layers) * 2 * int64(m.KVDim()) * 4
}

// run decodes g in the batch and returns when it is done, or with ctx's error when the
// caller gives up first (the decoder drops it at the next step boundary).
func (d *decoder) run(ctx context.Context, g *nn.Gen[float32]) error {
	j := &decodeJob{ctx: ctx, g: g, kv: int64(g.Positions()) * kvBytesPerPosition(d.m), done: make(chan struct{})}
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
		st.jobs = append(st.jobs, d.incoming...)
		d.incoming = nil
		if len(st.jobs) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		d.boundary(&st)
	}
}

// decodeState is what the decoder holds between step boundaries.
type decodeState struct {
	jobs   []*decodeJob // in flight, oldest first
	active []*nn.GenSeq[float32]
	kv     int64 // cache bytes the active sequences may reach
	// prefill is scratch for the requests prefilled at a boundary
	prefill []*nn.Gen[float32]
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
	jobs, active, kv := st.jobs, st.active, st.kv
	defer func() {
		if v := recover(); v != nil {
			p := &decoderPanic{value: v, stack: debug.Stack()}
			for _, j := range jobs {
				j.panic = p
				close(j.done)
			}
			*st = decodeState{}
			return
		}
		st.jobs, st.active, st.kv = jobs, active, kv
	}()
	if d.beforeStep != nil {
		d.beforeStep()
	}
	// 1. Drop the requests whose caller has gone, and their sequences.
	var gone map[*nn.Gen[float32]]bool
	kept := jobs[:0]
	for _, j := range jobs {
		if j.ctx.Err() != nil {
			if gone == nil {
				gone = map[*nn.Gen[float32]]bool{}
			}
			gone[j.g] = true
			close(j.done)
			continue
		}
		kept = append(kept, j)
	}
	clear(jobs[len(kept):])
	jobs = kept
	if gone != nil {
		kept := active[:0]
		for _, s := range active {
			if gone[s.Gen()] {
				kv -= int64(s.Gen().Positions()) * kvBytesPerPosition(d.m)
				continue
			}
			kept = append(kept, s)
		}
		clear(active[len(kept):])
		active = kept
	}

	// 2. Prefill, oldest first, within the budget; only while sequences can start. The
	// short chunks run together in one step (nn.PrefillTogether: the weights are read once,
	// and each prompt gets the bits it would get alone).
	budget := nn.PrefillChunk
	prefill := st.prefill[:0]
	for _, j := range jobs {
		if budget <= 0 || len(active) >= d.maxSeqs {
			break
		}
		if n := j.g.NextChunk(); n > 0 {
			prefill = append(prefill, j.g)
			budget -= n
		}
	}
	nn.PrefillTogether(prefill)
	clear(prefill)
	st.prefill = prefill[:0]

	// 3. Start sequences, one per request in turn.
	for more := true; more && len(active) < d.maxSeqs; {
		more = false
		for _, j := range jobs {
			if len(active) >= d.maxSeqs {
				break
			}
			if !j.g.Prefilled() || j.g.Pending() == 0 {
				continue
			}
			if len(active) > 0 && kv+j.kv > d.maxKV {
				more = false // none after it either: the batch drains until it fits
				break
			}
			if s := j.g.Start(); !s.Done() {
				active = append(active, s)
				kv += j.kv
			}
			more = true
		}
	}

	// 4. One step for every active sequence.
	if len(active) > 0 {
		d.m.Decode(active)
		d.mu.Lock()
		d.stats.steps++
		d.stats.rows += len(active)
		d.stats.maxRows = max(d.stats.maxRows, len(active))
		d.mu.Unlock()
		kept := active[:0]
		for _, s := range active {
			if s.Done() {
				kv -= int64(s.Gen().Positions()) * kvBytesPerPosition(d.m)
				continue
			}
			kept = append(kept, s)
		}
		clear(active[len(kept):])
		active = kept
	}
	left := jobs[:0]
	for _, j := range jobs {
		if j.g.Done() {
			close(j.done)
			continue
		}
		left = append(left, j)
	}
	clear(jobs[len(left):])
	jobs = left
}
