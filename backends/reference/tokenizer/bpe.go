package tokenizer

import (
	"container/heap"
	"slices"
	"unicode/utf8"
)

// bpe appends the tokens of one pre-tokenized word, w in byte-level characters, to ids.
//
// It merges as GPT-2's bpe does: while some adjacent pair of symbols has a merge rank, take
// the pair of the lowest rank and merge every occurrence of it, left to right, without
// overlaps (so "aaa" with the merge a+a is "aa a"). It does so in O(n log n) for a word of
// n characters, where doing each round over the whole word is O(n²): the symbols are a
// linked list over w (a symbol is always a run of w's characters), and the ranked pairs
// wait in a heap ordered by (rank, position). A round pops every pair of the lowest rank,
// which come out left to right, and merges those still present; each merge changes only
// the pairs on its two sides, which are pushed anew. Entries made stale by a merge stay in
// the heap and are skipped when popped: a pair is merged only if the two symbols it names
// are still neighbours and still form the pair of that rank.
//
// A merge's new pairs never have the rank of the round (x+y never equals x or y), so
// pushing them during the round cannot make the round merge a pair that was not there
// when it began, as GPT-2's one pass over the word cannot.
func (t *Tokenizer) bpe(sc *bpeScratch, ids []int, w string) []int {
	if len(w) == 0 {
		return ids
	}
	if _, size := utf8.DecodeRuneInString(w); size == len(w) {
		return append(ids, t.Vocab[w])
	}
	sc.reset(w)
	for i := 0; i+1 < len(sc.start); i++ {
		if r, ok := t.pairRank(sc, int32(i), int32(i+1)); ok {
			sc.pairs = append(sc.pairs, pair{rank: r, pos: int32(i)})
		}
	}
	heap.Init(&sc.pairs)
	sc.steps.add(len(sc.pairs))
	var round []pair
	for len(sc.pairs) > 0 {
		r := sc.pairs[0].rank
		round = round[:0]
		for len(sc.pairs) > 0 && sc.pairs[0].rank == r {
			round = append(round, heap.Pop(&sc.pairs).(pair))
			sc.steps.add(1)
		}
		for _, p := range round {
			left := p.pos
			right := sc.next[left]
			if !sc.alive[left] || right < 0 {
				continue
			}
			if cur, ok := t.pairRank(sc, left, right); !ok || cur != r {
				continue // stale: a merge changed one of its symbols
			}
			// left absorbs right.
			after := sc.next[right]
			sc.next[left] = after
			if after >= 0 {
				sc.prev[after] = left
			}
			sc.alive[right] = false
			if before := sc.prev[left]; before >= 0 {
				if nr, ok := t.pairRank(sc, before, left); ok {
					heap.Push(&sc.pairs, pair{rank: nr, pos: before})
					sc.steps.add(1)
				}
			}
			if after >= 0 {
				if nr, ok := t.pairRank(sc, left, after); ok {
					heap.Push(&sc.pairs, pair{rank: nr, pos: left})
					sc.steps.add(1)
				}
			}
		}
	}
	for i := int32(0); i >= 0; i = sc.next[i] {
		ids = append(ids, t.Vocab[sc.symbol(i)])
	}
	return ids
}

// Words up to cachedWordBytes long have their tokens remembered during one encoding, up
// to cachedWords of them (text repeats its words; the cache lives as long as the call).
const (
	cachedWordBytes = 64
	cachedWords     = 4096
)

// word appends the tokens of one pre-tokenized word w (raw text) to ids.
func (sc *bpeScratch) word(t *Tokenizer, ids []int, w string) []int {
	if len(w) > cachedWordBytes {
		return t.bpe(sc, ids, ByteLevel(w))
	}
	if toks, ok := sc.cache[w]; ok {
		return append(ids, toks...)
	}
	n := len(ids)
	ids = t.bpe(sc, ids, ByteLevel(w))
	if len(sc.cache) < cachedWords {
		if sc.cache == nil {
			sc.cache = map[string][]int{}
		}
		sc.cache[w] = slices.Clone(ids[n:])
	}
	return ids
}

// pairRank is the merge rank of symbols a and b, neighbours in sc.
func (t *Tokenizer) pairRank(sc *bpeScratch, a, b int32) (int32, bool) {
	r, ok := t.rank[[2]string{sc.symbol(a), sc.symbol(b)}]
	return int32(r), ok
}

// pair is a ranked pair of neighbouring symbols: the symbol at pos and the next one.
type pair struct {
	rank, pos int32
}

// pairHeap orders pairs by rank, then position.
type pairHeap []pair

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	return h[i].rank < h[j].rank || (h[i].rank == h[j].rank && h[i].pos < h[j].pos)
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pair)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// bpeScratch is one word's symbols, reused from word to word: symbol i is w[start[i]:end]
// where end is the start of its next live symbol (or len(w)).
type bpeScratch struct {
	w          string
	start      []int32
	prev, next []int32 // -1: none
	alive      []bool
	pairs      pairHeap
	steps      *steps // counts heap operations (tests); nil: none
	cache      map[string][]int
}

func (sc *bpeScratch) reset(w string) {
	sc.w = w
	sc.start, sc.prev, sc.next, sc.alive = sc.start[:0], sc.prev[:0], sc.next[:0], sc.alive[:0]
	sc.pairs = sc.pairs[:0]
	for i := range w {
		n := int32(len(sc.start))
		sc.start = append(sc.start, int32(i))
		sc.prev = append(sc.prev, n-1)
		sc.next = append(sc.next, n+1)
		sc.alive = append(sc.alive, true)
	}
	sc.next[len(sc.next)-1] = -1
}

// symbol is the text of live symbol i.
func (sc *bpeScratch) symbol(i int32) string {
	end := int32(len(sc.w))
	if n := sc.next[i]; n >= 0 {
		end = sc.start[n]
	}
	return sc.w[sc.start[i]:end]
}
