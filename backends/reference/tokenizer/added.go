package tokenizer

// addedMatcher finds added tokens (Specials) in a text as Hugging Face tokenizers do: the
// leftmost occurrence of any of them, and of those that start there the longest. It is a
// trie of their contents walked from each position of the text in turn, so a search costs
// at most the text's length times the longest added token, and at most a table look-up
// at a position where no added token starts. Added tokens with empty content are never
// matched.
type addedMatcher struct {
	root  [256]int32 // the root's children: node index + 1 (0: none)
	nodes []addedNode
}

type addedNode struct {
	next    map[byte]int32 // child node indices
	special int            // index in Specials of the token ending here, -1: none
}

// newAddedMatcher builds the trie of specials, which are sorted longest first; of added
// tokens with the same content, the first is matched.
func newAddedMatcher(specials []Special) addedMatcher {
	var m addedMatcher
	for i, sp := range specials {
		c := sp.Content
		if c == "" {
			continue
		}
		n := m.child(-1, c[0])
		for j := 1; j < len(c); j++ {
			n = m.child(n, c[j])
		}
		if m.nodes[n].special < 0 {
			m.nodes[n].special = i
		}
	}
	return m
}

// child returns node n's child for byte b (n = -1: the root's), adding it if needed.
func (m *addedMatcher) child(n int32, b byte) int32 {
	if n < 0 {
		if m.root[b] == 0 {
			m.nodes = append(m.nodes, addedNode{special: -1})
			m.root[b] = int32(len(m.nodes))
		}
		return m.root[b] - 1
	}
	if c, ok := m.nodes[n].next[b]; ok {
		return c
	}
	m.nodes = append(m.nodes, addedNode{special: -1})
	c := int32(len(m.nodes) - 1)
	if m.nodes[n].next == nil {
		m.nodes[n].next = map[byte]int32{}
	}
	m.nodes[n].next[b] = c
	return c
}

// find returns the first added token in s at or after byte from: its start and end in s
// and its index in Specials, or start -1 when there is none.
// Each byte looked at counts one step in n when n is not nil.
func (m *addedMatcher) find(s string, from int, n *steps) (start, end, special int) {
	if len(m.nodes) == 0 {
		return -1, -1, -1
	}
	for i := from; i < len(s); i++ {
		n.add(1)
		c := m.root[s[i]]
		if c == 0 {
			continue
		}
		node, best, bestEnd := c-1, -1, -1
		for j := i + 1; ; j++ {
			if sp := m.nodes[node].special; sp >= 0 {
				best, bestEnd = sp, j
			}
			if j == len(s) {
				break
			}
			n.add(1)
			next, ok := m.nodes[node].next[s[j]]
			if !ok {
				break
			}
			node = next
		}
		if best >= 0 {
			return i, bestEnd, best
		}
	}
	return -1, -1, -1
}

// steps counts the work of an encoding (tests check that it is linear in the text).
type steps struct{ n int }

func (s *steps) add(k int) {
	if s != nil {
		s.n += k
	}
}
