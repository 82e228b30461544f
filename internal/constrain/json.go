package constrain

// JSON's lexical pieces as automaton fragments. The text is compact JSON (no whitespace
// between tokens), so that a model cannot spend its tokens on blanks; number and integer
// literals are bounded in length (maxIntDigits, maxFracDigits, maxExpDigits) so that each
// value fits a float64 and int64 in every JSON reader.

const (
	maxIntDigits  = 15 // an integer literal's digits: below 2^53
	maxFracDigits = 15
	maxExpDigits  = 2 // exponents up to ±99 keep every number finite in float64
)

// jsonString accepts a JSON string: UTF-8 text without control characters, with the
// escapes \" \\ \/ \b \f \n \r \t and \uXXXX.
func (n *nfa) jsonString() frag {
	open := n.add()
	body := n.add()
	end := n.add()
	n.edge(open, '"', '"', body)
	n.edge(body, '"', '"', end)
	// one character, back to body
	n.edge(body, 0x20, 0x21, body)
	n.edge(body, 0x23, 0x5B, body)
	n.edge(body, 0x5D, 0x7F, body)
	cont := func(from int32, k int) int32 { // k continuation bytes from from, then body
		cur := from
		for i := range k {
			nx := body
			if i < k-1 {
				nx = n.add()
			}
			n.edge(cur, 0x80, 0xBF, nx)
			cur = nx
		}
		return cur
	}
	// two-byte sequences
	c2 := n.add()
	n.edge(body, 0xC2, 0xDF, c2)
	cont(c2, 1)
	// three-byte: E0 A0-BF 80-BF; E1-EC 80-BF x2; ED 80-9F 80-BF; EE-EF 80-BF x2
	e0 := n.add()
	n.edge(body, 0xE0, 0xE0, e0)
	e0b := n.add()
	n.edge(e0, 0xA0, 0xBF, e0b)
	cont(e0b, 1)
	e1 := n.add()
	n.edge(body, 0xE1, 0xEC, e1)
	n.edge(body, 0xEE, 0xEF, e1)
	cont(e1, 2)
	ed := n.add()
	n.edge(body, 0xED, 0xED, ed)
	edb := n.add()
	n.edge(ed, 0x80, 0x9F, edb)
	cont(edb, 1)
	// four-byte: F0 90-BF x x; F1-F3 80-BF x x x; F4 80-8F x x
	f0 := n.add()
	n.edge(body, 0xF0, 0xF0, f0)
	f0b := n.add()
	n.edge(f0, 0x90, 0xBF, f0b)
	cont(f0b, 2)
	f1 := n.add()
	n.edge(body, 0xF1, 0xF3, f1)
	cont(f1, 3)
	f4 := n.add()
	n.edge(body, 0xF4, 0xF4, f4)
	f4b := n.add()
	n.edge(f4, 0x80, 0x8F, f4b)
	cont(f4b, 2)
	// escapes
	esc := n.add()
	n.edge(body, '\\', '\\', esc)
	for _, c := range []byte{'"', '\\', '/', 'b', 'f', 'n', 'r', 't'} {
		n.edge(esc, c, c, body)
	}
	u := n.add()
	n.edge(esc, 'u', 'u', u)
	cur := u
	for i := range 4 {
		nx := body
		if i < 3 {
			nx = n.add()
		}
		n.edge(cur, '0', '9', nx)
		n.edge(cur, 'a', 'f', nx)
		n.edge(cur, 'A', 'F', nx)
		cur = nx
	}
	return frag{open, end}
}

// digits accepts lo to hi decimal digits.
func (n *nfa) digits(lo, hi int) frag {
	return n.upTo(lo, hi, func() frag { return n.ranges('0', '9') })
}

// jsonInteger accepts -?(0|[1-9][0-9]{0,14}).
func (n *nfa) jsonInteger() frag {
	return n.seq(n.opt(n.lit("-")), n.alt(n.lit("0"), n.seq(n.ranges('1', '9'), n.digits(0, maxIntDigits-1))))
}

// jsonNumber accepts an integer with an optional fraction and exponent.
func (n *nfa) jsonNumber() frag {
	frac := n.opt(n.seq(n.lit("."), n.digits(1, maxFracDigits)))
	exp := n.opt(n.seq(n.ranges('e', 'e', 'E', 'E'), n.opt(n.ranges('+', '+', '-', '-')), n.digits(1, maxExpDigits)))
	return n.seq(n.jsonInteger(), frac, exp)
}

// jsonAny accepts any JSON value nested at most depth deep (depth 1: scalars and empty
// containers only... depth 0: scalars only).
func (n *nfa) jsonAny(depth int) frag {
	alts := []frag{n.jsonString(), n.jsonNumber(), n.lit("true"), n.lit("false"), n.lit("null")}
	if depth > 0 {
		alts = append(alts, n.jsonAnyObject(depth), n.jsonAnyArray(depth))
	}
	return n.alt(alts...)
}

// jsonAnyObject accepts any JSON object whose values are nested at most depth - 1 deep.
func (n *nfa) jsonAnyObject(depth int) frag {
	member := func() frag { return n.seq(n.jsonString(), n.lit(":"), n.jsonAny(depth-1)) }
	return n.list("{", "}", member)
}

// jsonAnyArray accepts any JSON array whose items are nested at most depth - 1 deep.
func (n *nfa) jsonAnyArray(depth int) frag {
	return n.list("[", "]", func() frag { return n.jsonAny(depth - 1) })
}

// list accepts open, then zero or more items separated by commas, then close. The item is
// built once: the automaton loops back through the comma.
func (n *nfa) list(open, close string, item func() frag) frag {
	o, c := n.lit(open), n.lit(close)
	it := item()
	n.eps(o.end, it.start)
	n.eps(o.end, c.start)
	comma := n.lit(",")
	n.eps(it.end, comma.start)
	n.eps(comma.end, it.start)
	n.eps(it.end, c.start)
	return frag{o.start, c.end}
}
