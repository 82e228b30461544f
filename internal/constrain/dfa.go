package constrain

import (
	"encoding/binary"
	"slices"
	"time"
)

// MaxStates bounds a compiled automaton's states (past it the schema is refused as too
// large).
const MaxStates = 1 << 15

// Automaton is a deterministic automaton over bytes whose every state can still reach an
// accepting one: a text is a prefix of the language exactly while Step never returns
// Dead, and is in it when it ends in an accepting state. It is immutable.
type Automaton struct {
	class  [256]uint8 // byte → its class (bytes no edge tells apart share one)
	nclass int
	trans  []int32 // state*nclass + class → next state, or Dead
	accept []bool
}

// Dead is the state after a byte that leaves the language.
const Dead int32 = -1

// Start is the initial state.
func (a *Automaton) Start() int32 { return 0 }

// Step is the state after byte b from state s (Dead when s is Dead or b leaves the
// language).
func (a *Automaton) Step(s int32, b byte) int32 {
	if s < 0 {
		return Dead
	}
	return a.trans[int(s)*a.nclass+int(a.class[b])]
}

// Accepts reports whether a text ending in state s is in the language.
func (a *Automaton) Accepts(s int32) bool { return s >= 0 && a.accept[s] }

// States is the number of states.
func (a *Automaton) States() int { return len(a.accept) }

// Size is about how many bytes the automaton holds.
func (a *Automaton) Size() int { return 4*len(a.trans) + len(a.accept) + 256 }

// determinize turns the NFA from start to accept into an Automaton by subset construction,
// within MaxStates and deadline, and drops the states that cannot reach acceptance. It
// returns nil when the start state cannot (the language is empty).
func determinize(n *nfa, start, accept int32, deadline time.Time) (*Automaton, error) {
	a := &Automaton{}
	var bound [257]bool
	for _, st := range n.states {
		for _, e := range st.edges {
			bound[e.lo] = true
			bound[int(e.hi)+1] = true
		}
	}
	var rep []byte // a byte of each class
	for b := range 256 {
		if b == 0 || bound[b] {
			rep = append(rep, byte(b))
		}
		a.class[b] = uint8(len(rep) - 1)
	}
	a.nclass = len(rep)

	mark := make([]uint32, len(n.states))
	gen := uint32(0)
	var stack []int32
	closure := func(seed []int32) []int32 {
		gen++
		var out []int32
		stack = append(stack[:0], seed...)
		for _, s := range seed {
			mark[s] = gen
		}
		for len(stack) > 0 {
			s := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if len(n.states[s].edges) > 0 || s == accept {
				out = append(out, s)
			}
			for _, t := range n.states[s].eps {
				if mark[t] != gen {
					mark[t] = gen
					stack = append(stack, t)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	key := func(set []int32) string {
		b := make([]byte, 4*len(set))
		for i, s := range set {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(s))
		}
		return string(b)
	}
	ids := map[string]int32{}
	var sets [][]int32
	addSet := func(set []int32) (int32, error) {
		k := key(set)
		if id, ok := ids[k]; ok {
			return id, nil
		}
		if len(sets) >= MaxStates {
			return 0, errTooLarge
		}
		id := int32(len(sets))
		ids[k] = id
		sets = append(sets, set)
		a.accept = append(a.accept, slices.Contains(set, accept))
		a.trans = append(a.trans, make([]int32, a.nclass)...)
		return id, nil
	}
	if _, err := addSet(closure([]int32{start})); err != nil {
		return nil, err
	}
	var next []int32
	for i := 0; i < len(sets); i++ {
		if i%256 == 255 && time.Now().After(deadline) {
			return nil, errTooLarge
		}
		for c, b := range rep {
			next = next[:0]
			for _, s := range sets[i] {
				for _, e := range n.states[s].edges {
					if e.lo <= b && b <= e.hi {
						next = append(next, e.to)
					}
				}
			}
			if len(next) == 0 {
				a.trans[i*a.nclass+c] = Dead
				continue
			}
			id, err := addSet(closure(next))
			if err != nil {
				return nil, err
			}
			a.trans[i*a.nclass+c] = id
		}
	}
	return a.prune(), nil
}

// prune drops the states that cannot reach an accepting state, renumbering the rest (the
// start stays 0); nil when the start is one of them.
func (a *Automaton) prune() *Automaton {
	N := len(a.accept)
	rev := make([][]int32, N)
	for s := range N {
		for c := range a.nclass {
			if t := a.trans[s*a.nclass+c]; t >= 0 {
				rev[t] = append(rev[t], int32(s))
			}
		}
	}
	live := make([]bool, N)
	var queue []int32
	for s, ok := range a.accept {
		if ok {
			live[s] = true
			queue = append(queue, int32(s))
		}
	}
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		for _, s := range rev[t] {
			if !live[s] {
				live[s] = true
				queue = append(queue, s)
			}
		}
	}
	if !live[0] {
		return nil
	}
	id := make([]int32, N)
	k := int32(0)
	for s := range N {
		id[s] = Dead
		if live[s] {
			id[s] = k
			k++
		}
	}
	out := &Automaton{class: a.class, nclass: a.nclass, trans: make([]int32, 0, int(k)*a.nclass), accept: make([]bool, 0, k)}
	for s := range N {
		if !live[s] {
			continue
		}
		out.accept = append(out.accept, a.accept[s])
		for c := range a.nclass {
			t := a.trans[s*a.nclass+c]
			if t >= 0 {
				t = id[t]
			}
			out.trans = append(out.trans, t)
		}
	}
	return out
}
