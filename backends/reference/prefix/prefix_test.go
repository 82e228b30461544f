package prefix

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func block(h [32]byte) *Block {
	return NewBlock(h, [][]float32{make([]float32, 8)}, [][]float32{make([]float32, 8)}) // 64 bytes
}

func TestHashesChain(t *testing.T) {
	toks := make([]int, 3*BlockTokens)
	for i := range toks {
		toks[i] = i
	}
	zero := func(int) byte { return 0 }
	a := Hashes("s", toks, 3, zero)
	require.Equal(t, a[:2], Hashes("s", toks[:2*BlockTokens], 2, zero), "a prefix's hashes are the start of its extension's")
	require.NotEqual(t, a[0], Hashes("t", toks, 1, zero)[0], "another scope")
	require.NotEqual(t, a[1], Hashes("s", toks, 2, func(b int) byte { return byte(b) })[1], "another mode")
	other := append([]int{99}, toks[1:]...)
	b := Hashes("s", other, 3, zero)
	for i := range b {
		require.NotEqual(t, a[i], b[i], "a changed first token changes every later block")
	}
}

func TestLRUWithinBudget(t *testing.T) {
	c := New(3 * 64)
	h := Hashes("s", make([]int, 5*BlockTokens), 5, func(int) byte { return 0 })
	c.Insert([]*Block{block(h[0]), block(h[1]), block(h[2])})
	require.Len(t, c.Lookup(h, 5*BlockTokens), 3)
	c.Insert([]*Block{block(h[3])}) // evicts the least recent: the chain's last block
	st := c.Stats()
	require.Equal(t, Stats{LookupTokens: 5 * BlockTokens, HitTokens: 3 * BlockTokens, Bytes: 3 * 64, Blocks: 3}, st)
	require.Len(t, c.Lookup(h, 0), 2, "block 2 was evicted; the run stops there")
	require.Equal(t, []bool{true, true, false, true, false}, c.Has(h))
	big := NewBlock(h[4], [][]float32{make([]float32, 100)}, [][]float32{make([]float32, 100)})
	c.Insert([]*Block{big}) // larger than the budget: never stored
	require.False(t, c.Has(h[4:])[0])
	require.LessOrEqual(t, c.Stats().Bytes, int64(3*64))
}

// FuzzCache: any sequence of inserts and lookups keeps the cache within its budget, its
// counters consistent, and a lookup's blocks the stored run from the chain's start.
func FuzzCache(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{9, 9, 9, 0, 0, 0, 200, 17, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 256 {
			return
		}
		c := New(5 * 64)
		toks := make([]int, 8*BlockTokens)
		for i := range toks {
			toks[i] = i % 7
		}
		for i, op := range ops {
			toks[int(op)%len(toks)] = int(op) // vary the prompt
			h := Hashes("s", toks, 8, func(b int) byte { return byte(b) & op })
			n := int(op>>4) % 9
			if i%2 == 0 {
				var bs []*Block
				for _, x := range h[:n] {
					bs = append(bs, block(x))
				}
				c.Insert(bs)
			} else {
				got := c.Lookup(h, len(toks))
				has := c.Has(h)
				for j := range got {
					require.Equal(t, h[j], got[j].hash)
					require.True(t, has[j])
				}
			}
			st := c.Stats()
			require.LessOrEqual(t, st.Bytes, int64(5*64))
			require.Equal(t, int64(st.Blocks)*64, st.Bytes)
			require.LessOrEqual(t, st.HitTokens, st.LookupTokens)
		}
	})
}
