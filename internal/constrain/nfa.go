package constrain

// nfa is a Thompson automaton over bytes: states with byte-range edges and epsilon edges.
// Fragments built from it are wired together by their start and end states; a fragment
// whose end is unreachable (never) is the empty language.
type nfa struct {
	states []nstate
	limit  int // most states; past it add fails the compile (errTooLarge)
	err    error
}

type nstate struct {
	eps   []int32
	edges []edge
}

// edge leaves a state on any byte in [lo, hi].
type edge struct {
	lo, hi byte
	to     int32
}

// frag is a piece of automaton from start to end.
type frag struct{ start, end int32 }

func (n *nfa) add() int32 {
	if len(n.states) >= n.limit {
		if n.err == nil {
			n.err = errTooLarge
		}
		// keep building into state 0 so the caller's loop ends; the error wins
		return 0
	}
	n.states = append(n.states, nstate{})
	return int32(len(n.states) - 1)
}

func (n *nfa) eps(from, to int32) {
	if n.err == nil {
		n.states[from].eps = append(n.states[from].eps, to)
	}
}

func (n *nfa) edge(from int32, lo, hi byte, to int32) {
	if n.err == nil {
		n.states[from].edges = append(n.states[from].edges, edge{lo, hi, to})
	}
}

// empty is the fragment that accepts nothing.
func (n *nfa) empty() frag { return frag{n.add(), n.add()} }

// epsilon is the fragment that accepts the empty string.
func (n *nfa) epsilon() frag {
	s := n.add()
	return frag{s, s}
}

// lit accepts exactly s.
func (n *nfa) lit(s string) frag {
	start := n.add()
	cur := start
	for i := 0; i < len(s); i++ {
		nx := n.add()
		n.edge(cur, s[i], s[i], nx)
		cur = nx
	}
	return frag{start, cur}
}

// ranges accepts one byte in any of the ranges (pairs lo, hi).
func (n *nfa) ranges(r ...byte) frag {
	s, e := n.add(), n.add()
	for i := 0; i+1 < len(r); i += 2 {
		n.edge(s, r[i], r[i+1], e)
	}
	return frag{s, e}
}

// seq accepts the fragments one after another.
func (n *nfa) seq(fs ...frag) frag {
	if len(fs) == 0 {
		return n.epsilon()
	}
	for i := 1; i < len(fs); i++ {
		n.eps(fs[i-1].end, fs[i].start)
	}
	return frag{fs[0].start, fs[len(fs)-1].end}
}

// alt accepts any of the fragments.
func (n *nfa) alt(fs ...frag) frag {
	s, e := n.add(), n.add()
	for _, f := range fs {
		n.eps(s, f.start)
		n.eps(f.end, e)
	}
	return frag{s, e}
}

// opt accepts f or nothing.
func (n *nfa) opt(f frag) frag {
	s, e := n.add(), n.add()
	n.eps(s, f.start)
	n.eps(s, e)
	n.eps(f.end, e)
	return frag{s, e}
}

// star accepts f any number of times.
func (n *nfa) star(f frag) frag {
	s, e := n.add(), n.add()
	n.eps(s, f.start)
	n.eps(s, e)
	n.eps(f.end, f.start)
	n.eps(f.end, e)
	return frag{s, e}
}

// upTo accepts between lo and hi copies of what mk builds (hi < 0: no upper bound).
func (n *nfa) upTo(lo, hi int, mk func() frag) frag {
	var parts []frag
	for range lo {
		parts = append(parts, mk())
	}
	switch {
	case hi < 0:
		parts = append(parts, n.star(mk()))
	default:
		// nested options: (x (x (x)?)?)?
		if hi > lo {
			var tail frag
			for i := hi - lo; i > 0; i-- {
				f := mk()
				if i < hi-lo {
					f = n.seq(f, tail)
				}
				tail = n.opt(f)
			}
			parts = append(parts, tail)
		}
	}
	return n.seq(parts...)
}
