package sequencer

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

type seqr = Sequencer[string, string]

// submit admits and records a request, as the core does.
func submit(t *testing.T, s *seqr, seq int64, kind, op string) int64 {
	t.Helper()
	a, err := s.Admit(seq, kind)
	require.NoError(t, err)
	require.False(t, a.Repeat)
	s.Record(a.Seq, kind, op, op)
	return a.Seq
}

func takeAll(s *seqr) []string {
	var out []string
	for {
		it, ok := s.Take()
		if !ok {
			return out
		}
		out = append(out, it)
	}
}

func TestOrderAndNextSeqID(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 3, "fb", "c")
	submit(t, s, 2, "fb", "b")
	_, ok := s.Head()
	require.False(t, ok, "seq_id 1 has not arrived")
	require.True(t, s.Waiting())
	submit(t, s, 1, "fb", "a")
	require.Equal(t, int64(4), submit(t, s, 0, "optim", "d"), "0 takes the next after everything submitted")
	require.Equal(t, []string{"a", "b", "c", "d"}, takeAll(s))
	require.False(t, s.Waiting())
	require.Equal(t, int64(5), s.Next())
}

func TestRepeats(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 1, "fb", "op1")
	a, err := s.Admit(1, "fb")
	require.NoError(t, err)
	require.Equal(t, Admission{Seq: 1, Repeat: true, Op: "op1"}, a)

	_, err = s.Admit(1, "optim")
	var reused *ReusedError[string]
	require.ErrorAs(t, err, &reused)
	require.Equal(t, Used[string]{Op: "op1", Kind: "fb"}, reused.First)

	a, err = s.Admit(2, "fb")
	require.NoError(t, err)
	s.Reject(a.Seq, "fb")
	_, err = s.Admit(2, "fb")
	require.ErrorAs(t, err, &reused)
	require.Empty(t, reused.First.Op, "a rejected request's seq_id is not answered with an operation")

	// Repeats are answered after the request ran, too.
	require.Equal(t, []string{"op1"}, takeAll(s))
	a, err = s.Admit(1, "fb")
	require.NoError(t, err)
	require.True(t, a.Repeat)
}

func TestRejectedSeqIDDoesNotHoldTheRunUp(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 2, "fb", "b")
	a, err := s.Admit(1, "fb")
	require.NoError(t, err)
	s.Reject(a.Seq, "fb")
	require.Equal(t, []string{"b"}, takeAll(s))
}

func TestLateAndOutOfRange(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 5, "fb", "e")
	_, _, ok := s.SkipGap(1)
	require.True(t, ok)
	require.Equal(t, []string{"e"}, takeAll(s))
	_, err := s.Admit(3, "fb")
	var late *LateError
	require.ErrorAs(t, err, &late)
	require.Equal(t, LateError{Seq: 3, Next: 6}, *late)

	for _, seq := range []int64{-1, math.MinInt64, MaxSeqID + 1, math.MaxInt64} {
		_, err := s.Admit(seq, "fb")
		var oor *OutOfRangeError
		require.ErrorAs(t, err, &oor, "seq_id %d", seq)
	}
	// The largest seq_id is usable, and then "the next one" does not exist.
	submit(t, s, MaxSeqID, "fb", "last")
	_, err = s.Admit(0, "fb")
	require.ErrorIs(t, err, ErrExhausted)
}

func TestSkipGap(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 4, "fb", "d")
	submit(t, s, 7, "fb", "g")
	_, _, ok := s.SkipGap(2)
	require.False(t, ok, "a stale timer (position moved) skips nothing")
	from, to, ok := s.SkipGap(1)
	require.True(t, ok)
	require.Equal(t, [2]int64{1, 3}, [2]int64{from, to})
	_, _, ok = s.SkipGap(4)
	require.False(t, ok, "no gap: the head is there")
	require.Equal(t, []string{"d"}, takeAll(s))
	require.True(t, s.Waiting())
	from, to, ok = s.SkipGap(5)
	require.True(t, ok)
	require.Equal(t, [2]int64{5, 6}, [2]int64{from, to})
	require.Equal(t, []string{"g"}, takeAll(s))
}

func TestResync(t *testing.T) {
	s := New[string, string](Resync, 16)
	require.Equal(t, int64(41), submit(t, s, 41, "fb", "x"), "a recovered run starts where the client is")
	require.Equal(t, int64(42), submit(t, s, 0, "fb", "y"))
	require.Equal(t, []string{"x", "y"}, takeAll(s))

	s = New[string, string](Resync, 16)
	require.Equal(t, int64(1), submit(t, s, 0, "fb", "x"), "with no position, 0 starts at 1")
}

func TestFullLeavesTheSeqIDFree(t *testing.T) {
	s := New[string, string](1, 2)
	submit(t, s, 1, "fb", "a")
	submit(t, s, 2, "fb", "b")
	_, err := s.Admit(3, "fb")
	var full *FullError
	require.ErrorAs(t, err, &full)
	require.Equal(t, 2, full.Limit)
	s.Take()
	require.Equal(t, int64(3), submit(t, s, 3, "fb", "c"), "the refused seq_id is accepted once there is room")
}

func TestDrain(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 3, "fb", "c")
	submit(t, s, 2, "fb", "b")
	a, _ := s.Admit(4, "fb")
	s.Reject(a.Seq, "fb")
	require.Equal(t, []string{"b", "c"}, s.Drain())
	require.Zero(t, s.Len())
	require.False(t, s.Waiting())
}

func TestSeenTableStaysBounded(t *testing.T) {
	s := New[string, string](1, 8)
	for i := range 100_000 {
		seq := submit(t, s, 0, "fb", "x")
		if i%3 == 0 { // sparse seq_ids too
			_, _, _ = s.SkipGap(s.Next())
		}
		s.Take()
		_ = seq
		require.LessOrEqual(t, s.SeenLen(), 2*Keep+1)
	}
	// Recent ones are still de-duplicated.
	a, err := s.Admit(s.Next()-1, "fb")
	require.NoError(t, err)
	require.True(t, a.Repeat)
}

// FuzzSequencer drives a sequencer with arbitrary requests, takes and gap skips, and checks
// it against the rules: items come out in increasing seq_id order, each at most once, never
// one below a seq_id already taken; repeats of the same kind return the first operation;
// every queue and table stays within its bound.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 2, 0, 1, 3, 2, 0, 0, 0})
	f.Add([]byte{0, 5, 1, 0, 3, 0, 3, 0, 0, 2, 9, 9, 1, 0, 0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		const maxPending = 4
		start := int64(1)
		if len(prog) > 0 && prog[0]%5 == 0 {
			start = Resync
		}
		s := New[int64, byte](start, maxPending)
		ops := map[int64]used{}
		taken := int64(-1)
		var nextOp int64
		for len(prog) >= 3 {
			cmd, a, b := prog[0]%6, prog[1], prog[2]
			prog = prog[3:]
			switch cmd {
			case 0, 1, 2: // submit seq (0: the next), kind b%2; cmd 2 rejects it
				seq := int64(a % 24)
				if a == 255 {
					seq = MaxSeqID - int64(b%3)
				}
				kind := b % 2
				adm, err := s.Admit(seq, kind)
				if err != nil {
					var full *FullError
					if errors.As(err, &full) {
						require.Equal(t, maxPending, s.Len())
					}
					continue
				}
				if prev, ok := ops[adm.Seq]; ok || adm.Repeat {
					require.True(t, ok && adm.Repeat && prev.ok && prev.kind == kind, "repeat of seq_id %d", adm.Seq)
					require.Equal(t, prev.op, mustAtoi(adm.Op))
					continue
				}
				require.Greater(t, adm.Seq, taken, "a seq_id at or below one already run is admitted")
				if cmd == 2 {
					s.Reject(adm.Seq, kind)
					ops[adm.Seq] = used{kind, 0, false}
					continue
				}
				nextOp++
				s.Record(adm.Seq, kind, itoa(nextOp), adm.Seq)
				ops[adm.Seq] = used{kind, nextOp, true}
			case 3, 4:
				it, ok := s.Take()
				if ok {
					require.Greater(t, it, taken)
					require.True(t, ops[it].ok, "a rejected seq_id came out")
					taken = it
				}
			case 5:
				_, _, _ = s.SkipGap(s.Next())
			}
			require.LessOrEqual(t, s.Len(), maxPending)
			require.LessOrEqual(t, s.SeenLen(), max(2*Keep, Keep+maxPending)+1)
			if s.Next() != Resync {
				_, headOK := s.Head()
				require.Equal(t, s.Len() > 0 && !headOK, s.Waiting())
			}
		}
		for _, it := range s.Drain() {
			require.Greater(t, it, taken)
		}
	})
}

// used is the fuzz test's own record of a seq_id: its kind, operation and whether it was
// accepted.
type used struct {
	kind byte
	op   int64
	ok   bool
}

func itoa(n int64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	return string(b[:])
}

func mustAtoi(s string) int64 { return int64(binary.BigEndian.Uint64([]byte(s))) }

// TestClaim: a claimed seq_id holds the run up as a queued request does (no gap, no head),
// answers a repeat with Claimed, gives later requests that send 0 the next seq_ids, and ends
// recorded, rejected or given back.
func TestClaim(t *testing.T) {
	s := New[string, string](1, 4)
	a, err := s.Admit(0, "fb")
	require.NoError(t, err)
	require.Equal(t, int64(1), a.Seq)
	s.Claim(a.Seq, "fb")
	_, ok := s.Head()
	require.False(t, ok, "a claimed head is not runnable")
	require.False(t, s.Waiting(), "a claimed head is not a gap")
	rep, err := s.Admit(1, "fb")
	require.NoError(t, err)
	require.True(t, rep.Claimed, "a repeat of a claim waits for it")
	require.Equal(t, int64(2), submit(t, s, 0, "fb", "b"), "0 gets the seq_id after the claim")
	_, ok = s.Take()
	require.False(t, ok, "the claim holds the run up")
	s.Record(1, "fb", "op-a", "a")
	require.Equal(t, []string{"a", "b"}, takeAll(s))

	// Given back: a retry of the same seq_id is accepted, and 0 counts from before it.
	c, err := s.Admit(3, "fb")
	require.NoError(t, err)
	s.Claim(c.Seq, "fb")
	s.Unclaim(c.Seq)
	require.Zero(t, s.Len())
	require.Equal(t, int64(3), submit(t, s, 0, "fb", "c"))
	// Rejected: consumed, the run goes on.
	d, err := s.Admit(0, "fb")
	require.NoError(t, err)
	s.Claim(d.Seq, "fb")
	require.Equal(t, int64(5), submit(t, s, 0, "fb", "e"))
	s.Reject(d.Seq, "fb")
	require.Equal(t, []string{"c", "e"}, takeAll(s))
	// Drained while claimed: nothing is returned for it.
	f, err := s.Admit(0, "fb")
	require.NoError(t, err)
	s.Claim(f.Seq, "fb")
	require.Empty(t, s.Drain())
}

// TestCancelConsumesTheSeqIDWithoutItsEffect: a cancelled queued request is removed, its
// seq_id is consumed so the run does not wait for it (at the head or in the middle), a
// repeat of it still answers its operation, and a taken or unknown one is not cancelled.
func TestCancelConsumesTheSeqIDWithoutItsEffect(t *testing.T) {
	s := New[string, string](1, 16)
	submit(t, s, 1, "fb", "a")
	submit(t, s, 2, "fb", "b")
	submit(t, s, 3, "fb", "c")
	got, ok := s.Cancel(2)
	require.True(t, ok)
	require.Equal(t, "b", got)
	_, ok = s.Cancel(2)
	require.False(t, ok, "cancelled once")
	require.Equal(t, []string{"a", "c"}, takeAll(s))
	require.Equal(t, int64(4), s.Next())
	require.Zero(t, s.Len())

	a, err := s.Admit(2, "fb")
	require.NoError(t, err)
	require.True(t, a.Repeat)
	require.Equal(t, "b", a.Op)

	submit(t, s, 4, "fb", "d")
	got, ok = s.Cancel(4)
	require.True(t, ok, "the head is cancelled")
	require.Equal(t, "d", got)
	require.Equal(t, int64(5), s.Next(), "the position moves past a cancelled head")
	_, ok = s.Head()
	require.False(t, ok)
	_, ok = s.Cancel(1)
	require.False(t, ok, "taken already")
	_, ok = s.Cancel(99)
	require.False(t, ok, "never queued")

	// A gap before a cancelled request: the run still waits for the gap, then moves past both.
	submit(t, s, 7, "fb", "g")
	_, ok = s.Cancel(7)
	require.True(t, ok)
	submit(t, s, 6, "fb", "f")
	submit(t, s, 5, "fb", "e")
	require.Equal(t, []string{"e", "f"}, takeAll(s))
	require.Equal(t, int64(8), s.Next())
}
