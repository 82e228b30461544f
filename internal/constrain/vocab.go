package constrain

import (
	"slices"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Vocab is a model's vocabulary as byte strings, in a trie, for computing token masks.
// It is immutable; build it once per tokenizer.
type Vocab struct {
	size  int      // token ids are [0, size)
	bytes [][]byte // a token's text; nil for tokens that stand for no text (special tokens)
	eos   []int
	// the trie: node i's children are edges[nodes[i].e0:nodes[i].e1], the tokens that
	// end at it toks[nodes[i].t0:nodes[i].t1]
	nodes []trieNode
	edges []trieEdge
	toks  []int32
}

type trieNode struct{ e0, e1, t0, t1 int32 }

type trieEdge struct {
	b    byte
	node int32
}

// NewVocab builds the vocabulary of size token ids: text(id) is a token's bytes, or nil
// (or empty) for a token that stands for no text, which a constraint never allows. eos are
// the end-of-sequence ids, allowed once the text is complete.
func NewVocab(size int, text func(id int) []byte, eos []int) *Vocab {
	v := &Vocab{size: size, bytes: make([][]byte, size), eos: slices.Clone(eos)}
	order := make([]int32, 0, size)
	for id := range size {
		if b := text(id); len(b) > 0 {
			v.bytes[id] = b
			order = append(order, int32(id))
		}
	}
	slices.SortStableFunc(order, func(a, b int32) int { return slices.Compare(v.bytes[a], v.bytes[b]) })
	// Build the trie from the sorted strings: each node's children are contiguous once the
	// nodes are laid out breadth first, so build a pointer trie first, then flatten.
	type pnode struct {
		kids []*pnode
		keys []byte
		toks []int32
	}
	root := &pnode{}
	for _, id := range order {
		cur := root
		for _, b := range v.bytes[id] {
			k := len(cur.keys) - 1
			if k < 0 || cur.keys[k] != b { // sorted input: a new child is always last
				cur.keys = append(cur.keys, b)
				cur.kids = append(cur.kids, &pnode{})
				k++
			}
			cur = cur.kids[k]
		}
		cur.toks = append(cur.toks, id)
	}
	queue := []*pnode{root}
	v.nodes = append(v.nodes, trieNode{})
	for i := 0; i < len(queue); i++ {
		p := queue[i]
		nd := &v.nodes[i]
		nd.t0 = int32(len(v.toks))
		v.toks = append(v.toks, p.toks...)
		nd.t1 = int32(len(v.toks))
		nd.e0 = int32(len(v.edges))
		for k, kid := range p.kids {
			v.edges = append(v.edges, trieEdge{b: p.keys[k], node: int32(len(queue))})
			queue = append(queue, kid)
			v.nodes = append(v.nodes, trieNode{})
			nd = &v.nodes[i] // the append may move it
		}
		nd.e1 = int32(len(v.edges))
		queue[i] = nil
	}
	return v
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return v.size }

// maxMaskBytes bounds the masks one Tokens keeps; past it they are dropped and recomputed
// as needed.
const maxMaskBytes = 8 << 20

// tokensCacheSize bounds the (automaton, vocabulary) pairs kept with their masks.
const tokensCacheSize = 32

type tokensKey struct {
	a *Automaton
	v *Vocab
}

var tokensCache, _ = lru.New[tokensKey, *Tokens](tokensCacheSize)

// Tokens is an Automaton lifted to a vocabulary's tokens: a state is the byte automaton's
// state after the tokens so far, and Mask says which tokens may come next. It is safe for
// concurrent use.
type Tokens struct {
	a *Automaton
	v *Vocab

	mu     sync.Mutex
	masks  map[int32][]uint64
	cached int // bytes in masks
}

// ForVocab returns a's Tokens over v, from a bounded LRU.
func ForVocab(a *Automaton, v *Vocab) *Tokens {
	k := tokensKey{a, v}
	if t, ok := tokensCache.Get(k); ok {
		return t
	}
	t := &Tokens{a: a, v: v, masks: map[int32][]uint64{}}
	tokensCache.Add(k, t)
	return t
}

// Start is the state before any token.
func (t *Tokens) Start() int32 { return t.a.Start() }

// Next is the state after token tok from state s: Dead when tok is not allowed there. An
// end-of-sequence token keeps the state.
func (t *Tokens) Next(s int32, tok int) int32 {
	if tok < 0 || tok >= t.v.size {
		return Dead
	}
	b := t.v.bytes[tok]
	if len(b) == 0 {
		if slices.Contains(t.v.eos, tok) && t.a.Accepts(s) {
			return s
		}
		return Dead
	}
	for _, c := range b {
		if s = t.a.Step(s, c); s == Dead {
			return Dead
		}
	}
	return s
}

// Accepts reports whether the text so far is complete (an end-of-sequence token is
// allowed).
func (t *Tokens) Accepts(s int32) bool { return t.a.Accepts(s) }

// Mask returns the tokens allowed in state s as a bitset over the vocabulary (bit id%64 of
// word id/64): those whose bytes keep the text a prefix of the language, and the
// end-of-sequence tokens when the text is complete. It is computed by walking the
// vocabulary's trie with the automaton, pruning every branch at its first dead byte, and
// kept per state (within maxMaskBytes). The caller must not modify it.
func (t *Tokens) Mask(s int32) []uint64 {
	t.mu.Lock()
	m, ok := t.masks[s]
	t.mu.Unlock()
	if ok {
		return m
	}
	m = t.compute(s)
	t.mu.Lock()
	if t.cached+8*len(m) > maxMaskBytes {
		clear(t.masks)
		t.cached = 0
	}
	if _, ok := t.masks[s]; !ok {
		t.masks[s] = m
		t.cached += 8 * len(m)
	}
	t.mu.Unlock()
	return m
}

func (t *Tokens) compute(s int32) []uint64 {
	v := t.v
	m := make([]uint64, (v.size+63)/64)
	if s < 0 {
		return m
	}
	if t.a.Accepts(s) {
		for _, id := range v.eos {
			if id >= 0 && id < v.size {
				m[id/64] |= 1 << (id % 64)
			}
		}
	}
	type item struct {
		node  int32
		state int32
	}
	stack := []item{{0, s}}
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		nd := v.nodes[it.node]
		for _, e := range v.edges[nd.e0:nd.e1] {
			ns := t.a.Step(it.state, e.b)
			if ns == Dead {
				continue
			}
			kid := v.nodes[e.node]
			for _, id := range v.toks[kid.t0:kid.t1] {
				m[id/64] |= 1 << (id % 64)
			}
			if kid.e1 > kid.e0 {
				stack = append(stack, item{e.node, ns})
			}
		}
	}
	return m
}
