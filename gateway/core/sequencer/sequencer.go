package sequencer

import (
	"errors"
	"fmt"
	"slices"
)

// Resync as a position means "take the next request's seq_id as the start".
const Resync int64 = -1

// MaxSeqID is the largest seq_id a client may send (2^62). The tinker SDK's sampling
// clients use large ones (a pickled sampling client starts near 2.6·10^17), so the range is
// wide; it stops short of int64's end, so "the next seq_id" can never overflow.
const MaxSeqID int64 = 1 << 62

// Keep is how many used seq_ids below the position the de-duplication table keeps once it
// holds twice as many: retries come within minutes, not thousands of steps later.
const Keep = 4096

// Used is what the sequencer remembers of a used seq_id.
type Used[K comparable] struct {
	// Op is the operation the request created; "" when the request was rejected.
	Op string
	// Kind is the kind of request that used the seq_id.
	Kind K
	// claimed: the seq_id is claimed (Claim) and neither recorded nor rejected yet.
	claimed bool
}

// Admission is what Admit decided for a request that may go on.
type Admission struct {
	// Seq is the request's seq_id (the next one when the request sent 0).
	Seq int64
	// Repeat is true when the request repeats one already accepted: answer it with Op and
	// record nothing.
	Repeat bool
	// Op is the first request's operation, for a repeat.
	Op string
	// Claimed is true when the seq_id is claimed by a request still being checked (Claim):
	// wait for it to be recorded or given up, then admit again.
	Claimed bool
}

// OutOfRangeError: a seq_id outside 0..MaxSeqID.
type OutOfRangeError struct{ Seq int64 }

func (e *OutOfRangeError) Error() string {
	return fmt.Sprintf("seq_id %d is out of range: use 0 to %d", e.Seq, MaxSeqID)
}

// Check range-checks a seq_id from the wire: an *OutOfRangeError outside 0..MaxSeqID.
func Check(seq int64) error {
	if seq < 0 || seq > MaxSeqID {
		return &OutOfRangeError{Seq: seq}
	}
	return nil
}

// ErrExhausted: the run has used every seq_id up to MaxSeqID, so "the next" does not exist.
var ErrExhausted = errors.New("every seq_id up to the maximum is used")

// ReusedError: a repeat of a used seq_id that cannot be answered with the first request's
// operation: it was of another kind, or it was rejected.
type ReusedError[K comparable] struct {
	Seq   int64
	First Used[K]
}

func (e *ReusedError[K]) Error() string {
	if e.First.Op == "" {
		return fmt.Sprintf("seq_id %d was used by a request that was rejected", e.Seq)
	}
	return fmt.Sprintf("seq_id %d was used by a %v request", e.Seq, e.First.Kind)
}

// LateError: a seq_id below the position that was never used.
type LateError struct{ Seq, Next int64 }

func (e *LateError) Error() string {
	return fmt.Sprintf("seq_id %d arrived after the run moved past it (next is %d)", e.Seq, e.Next)
}

// FullError: the run already has Limit requests queued.
type FullError struct{ Limit int }

func (e *FullError) Error() string { return fmt.Sprintf("%d requests are queued", e.Limit) }

// entry is a queued request: an item, a consumed seq_id (a rejected request), or a claimed
// one (a request being checked, which the run waits for as for an item).
type entry[T any] struct {
	item     T
	consumed bool
	claimed  bool
}

// Sequencer orders one run's requests, of item type T and request kind K. The zero value is
// not usable: use New.
type Sequencer[T any, K comparable] struct {
	next       int64 // the seq_id that runs next, or Resync
	maxSeen    int64 // the largest seq_id used
	pending    map[int64]entry[T]
	seen       map[int64]Used[K]
	maxPending int
}

// New returns a sequencer whose next request is next (Resync for a recovered run), with at
// most maxPending requests queued.
func New[T any, K comparable](next int64, maxPending int) *Sequencer[T, K] {
	return &Sequencer[T, K]{
		next: next, maxSeen: next - 1, maxPending: max(maxPending, 1),
		pending: map[int64]entry[T]{}, seen: map[int64]Used[K]{},
	}
}

// Next is the seq_id that runs next (Resync while the position is unknown).
func (s *Sequencer[T, K]) Next() int64 { return s.next }

// Len is the number of queued requests (consumed seq_ids above the position included).
func (s *Sequencer[T, K]) Len() int { return len(s.pending) }

// SeenLen is the size of the de-duplication table (tests).
func (s *Sequencer[T, K]) SeenLen() int { return len(s.seen) }

// Admit decides whether a request of kind at seq may be queued. It records nothing (but a
// recovered run's position): the caller then calls Record, or Reject if building the
// request's operation failed on the client's input. An error leaves the seq_id unused.
func (s *Sequencer[T, K]) Admit(seq int64, kind K) (Admission, error) {
	if err := Check(seq); err != nil {
		return Admission{}, err
	}
	if s.next == Resync {
		s.next = max(seq, 1)
		s.maxSeen = s.next - 1
	}
	if seq == 0 {
		seq = max(s.maxSeen, s.next-1) + 1
		if seq > MaxSeqID {
			return Admission{}, ErrExhausted
		}
	}
	if used, ok := s.seen[seq]; ok {
		if used.claimed {
			return Admission{Seq: seq, Claimed: true}, nil
		}
		if used.Kind != kind || used.Op == "" {
			return Admission{}, &ReusedError[K]{Seq: seq, First: used}
		}
		return Admission{Seq: seq, Repeat: true, Op: used.Op}, nil
	}
	if seq < s.next {
		return Admission{}, &LateError{Seq: seq, Next: s.next}
	}
	if len(s.pending) >= s.maxPending {
		return Admission{}, &FullError{Limit: s.maxPending}
	}
	return Admission{Seq: seq}, nil
}

// Claim holds an admitted seq_id for a request that is checked and built without the
// caller's lock (store reads, the operation's creation): the run waits for it as for a
// queued request, a repeat of it is answered Claimed, and later requests that send 0 get
// the seq_ids after it. The caller then calls Record, Reject or Unclaim. A claim counts
// against maxPending.
func (s *Sequencer[T, K]) Claim(seq int64, kind K) {
	s.pending[seq] = entry[T]{claimed: true}
	s.seen[seq] = Used[K]{Kind: kind, claimed: true}
	s.maxSeen = max(s.maxSeen, seq)
}

// Unclaim gives a claimed seq_id back unused, so a retry of it is accepted (the request
// failed for a reason that is not the client's input, such as a full queue).
func (s *Sequencer[T, K]) Unclaim(seq int64) {
	if e, ok := s.pending[seq]; !ok || !e.claimed {
		return
	}
	delete(s.pending, seq)
	delete(s.seen, seq)
	if seq == s.maxSeen {
		s.maxSeen = s.next - 1
		for q := range s.seen {
			s.maxSeen = max(s.maxSeen, q)
		}
		for q := range s.pending {
			s.maxSeen = max(s.maxSeen, q)
		}
	}
}

// Record queues an admitted request: item, which created operation op.
func (s *Sequencer[T, K]) Record(seq int64, kind K, op string, item T) {
	s.pending[seq] = entry[T]{item: item}
	s.use(seq, Used[K]{Op: op, Kind: kind})
}

// Reject consumes an admitted seq_id whose request was rejected, so the run does not wait
// for it; a repeat of it is refused.
func (s *Sequencer[T, K]) Reject(seq int64, kind K) {
	s.pending[seq] = entry[T]{consumed: true}
	s.use(seq, Used[K]{Kind: kind})
}

func (s *Sequencer[T, K]) use(seq int64, u Used[K]) {
	s.seen[seq] = u
	s.maxSeen = max(s.maxSeen, seq)
	s.advance()
	if len(s.seen) > 2*Keep {
		for q := range s.seen {
			if q < s.next-Keep {
				delete(s.seen, q)
			}
		}
	}
}

// Cancel removes the queued request at seq (it has not been taken) and consumes its seq_id,
// so the run moves past it without its effect; a repeat of it is answered with its
// operation as before. It returns the request's item, or false when seq holds no queued
// request (it was taken, is claimed, or was never queued).
func (s *Sequencer[T, K]) Cancel(seq int64) (T, bool) {
	e, ok := s.pending[seq]
	if !ok || e.consumed || e.claimed {
		var zero T
		return zero, false
	}
	s.pending[seq] = entry[T]{consumed: true}
	s.advance()
	return e.item, true
}

// advance moves the position past consumed seq_ids.
func (s *Sequencer[T, K]) advance() {
	for {
		e, ok := s.pending[s.next]
		if !ok || !e.consumed {
			return
		}
		delete(s.pending, s.next)
		s.next++
	}
}

// Head returns the request that runs next, if it has arrived, without taking it.
func (s *Sequencer[T, K]) Head() (T, bool) {
	e, ok := s.pending[s.next]
	return e.item, ok && !e.claimed
}

// Take removes the request that runs next and moves the position past it.
func (s *Sequencer[T, K]) Take() (T, bool) {
	e, ok := s.pending[s.next]
	if !ok || e.claimed {
		var zero T
		return zero, false
	}
	delete(s.pending, s.next)
	s.next++
	s.advance()
	return e.item, true
}

// Ahead is how many requests (queued or claimed) are before seq in the run's order.
func (s *Sequencer[T, K]) Ahead(seq int64) int {
	n := 0
	for q, e := range s.pending {
		if q < seq && !e.consumed {
			n++
		}
	}
	return n
}

// Waiting reports a gap: requests are queued but the next one has not arrived (a claimed
// next one is arriving: no gap).
func (s *Sequencer[T, K]) Waiting() bool {
	_, ok := s.pending[s.next]
	return !ok && len(s.pending) > 0
}

// SkipGap gives up on the missing seq_ids from expected up to the first queued one, if the
// position is still expected and the gap is still there. It returns the skipped range.
func (s *Sequencer[T, K]) SkipGap(expected int64) (from, to int64, ok bool) {
	if s.next != expected || !s.Waiting() {
		return 0, 0, false
	}
	first := int64(-1)
	for q := range s.pending {
		if first < 0 || q < first {
			first = q
		}
	}
	from, s.next = s.next, first
	s.advance()
	return from, first - 1, true
}

// Drain removes every queued request and returns the items (consumed and claimed seq_ids
// have none), in seq_id order. A claim drained this way is rejected by its caller later.
func (s *Sequencer[T, K]) Drain() []T {
	seqs := make([]int64, 0, len(s.pending))
	for q, e := range s.pending {
		if !e.consumed && !e.claimed {
			seqs = append(seqs, q)
		}
	}
	slices.Sort(seqs)
	items := make([]T, len(seqs))
	for i, q := range seqs {
		items[i] = s.pending[q].item
	}
	clear(s.pending)
	return items
}
