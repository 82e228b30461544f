package prefix

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// BlockTokens is the tokens per block: a divisor of the engine's prompt chunks (512) and
// of its row-kernel chunk bound (64), so a block never straddles a chunk.
const BlockTokens = 16

// Block holds the keys and values of BlockTokens positions: per layer,
// BlockTokens × the model's key/value width.
type Block struct {
	K, V [][]float32
	hash [32]byte
	size int64
}

// Stats are the cache's counters since it was made.
type Stats struct {
	// LookupTokens counts the prompt tokens of lookups; HitTokens those found.
	LookupTokens, HitTokens int64
	// Bytes is the keys and values held; Blocks how many blocks.
	Bytes  int64
	Blocks int
}

// Cache is a bounded, shared prefix cache. The zero value is not usable; see New.
type Cache struct {
	budget int64

	mu     sync.Mutex
	used   int64
	blocks map[[32]byte]*list.Element // of *Block
	lru    *list.List                 // front: most recently used

	lookup, hit atomic.Int64
}

// New returns a cache holding at most budget bytes of keys and values (budget > 0).
func New(budget int64) *Cache {
	return &Cache{budget: budget, blocks: map[[32]byte]*list.Element{}, lru: list.New()}
}

// Hashes is the hash chain of the first n blocks of tokens under scope: hash i covers
// the scope, blocks 0..i's tokens and modes (mode(b) is block b's product mode).
func Hashes(scope string, tokens []int, n int, mode func(block int) byte) [][32]byte {
	out := make([][32]byte, n)
	h := sha256.Sum256([]byte(scope))
	var buf [32 + 1 + 4*BlockTokens]byte
	for b := range n {
		copy(buf[:32], h[:])
		buf[32] = mode(b)
		for i, t := range tokens[b*BlockTokens : (b+1)*BlockTokens] {
			binary.LittleEndian.PutUint32(buf[33+4*i:], uint32(t))
		}
		h = sha256.Sum256(buf[:])
		out[b] = h
	}
	return out
}

// Lookup returns the longest run of stored blocks from the start of hashes and counts
// tokens prompt tokens looked up (the blocks found count as hits). The blocks found become
// the most recently used, the first of them most of all (a prefix outlives its
// extensions).
func (c *Cache) Lookup(hashes [][32]byte, tokens int) []*Block {
	var out []*Block
	c.mu.Lock()
	for _, h := range hashes {
		e, ok := c.blocks[h]
		if !ok {
			break
		}
		out = append(out, e.Value.(*Block))
	}
	for i := len(out) - 1; i >= 0; i-- {
		c.lru.MoveToFront(c.blocks[out[i].hash])
	}
	c.mu.Unlock()
	c.lookup.Add(int64(tokens))
	c.hit.Add(int64(len(out) * BlockTokens))
	return out
}

// Has reports which of hashes are stored (the rest need their blocks made for Insert).
func (c *Cache) Has(hashes [][32]byte) []bool {
	out := make([]bool, len(hashes))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range hashes {
		_, out[i] = c.blocks[h]
	}
	return out
}

// NewBlock makes block hash from its per-layer keys and values (copied by the caller,
// never changed afterwards).
func NewBlock(hash [32]byte, k, v [][]float32) *Block {
	b := &Block{K: k, V: v, hash: hash}
	for l := range k {
		b.size += int64(len(k[l])+len(v[l])) * 4
	}
	return b
}

// Insert stores blocks (those already stored are kept as they are) and evicts the least
// recently used until the cache is within its budget. Blocks are inserted last first, so
// that a prompt's first block is the most recently used.
func (c *Cache) Insert(blocks []*Block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if b.size > c.budget {
			continue
		}
		if e, ok := c.blocks[b.hash]; ok {
			c.lru.MoveToFront(e)
			continue
		}
		c.blocks[b.hash] = c.lru.PushFront(b)
		c.used += b.size
	}
	for c.used > c.budget {
		e := c.lru.Back()
		b := e.Value.(*Block)
		c.lru.Remove(e)
		delete(c.blocks, b.hash)
		c.used -= b.size
	}
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{LookupTokens: c.lookup.Load(), HitTokens: c.hit.Load(), Bytes: c.used, Blocks: len(c.blocks)}
}
