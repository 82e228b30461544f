package reference

import (
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/prefix"
)

// DefaultPrefixCacheBytes is the prefix cache's default budget (Options.PrefixCacheBytes).
const DefaultPrefixCacheBytes = 256 << 20

// PrefixStats returns the prefix cache's counters (zero when it is off).
func (e *Engine) PrefixStats() prefix.Stats {
	if e.prefix == nil {
		return prefix.Stats{}
	}
	return e.prefix.Stats()
}

// prefixScope is what a prompt's keys and values depend on besides its tokens, and who may
// reuse them: the base model, the adapter's weights (samplerAdapter's key: the folder and
// its weights file's identity, so a rewritten file is a new scope; "" for the base model)
// and the workspace. Every entry is the workspace's own, the base model's included: a hit
// shows in the sample's cached token count and its latency, so a cache shared between
// workspaces would tell one whether another had sent a prompt it guesses
// (docs/semantics.md).
func prefixScope(bm *baseModel, workspace, adapterKey string) string {
	return bm.name + "\x00" + workspace + "\x00" + adapterKey
}

// prefixUse is one request's use of the prefix cache.
type prefixUse struct {
	hashes [][32]byte // the prompt's whole blocks
	cached int        // prompt tokens reused
}

// blockModes is the product mode of each block of a prompt of n tokens (nn.ChunkRows).
func blockModes(n int) func(int) byte {
	return func(b int) byte {
		if nn.ChunkRows(b*prefix.BlockTokens, n) {
			return 1
		}
		return 0
	}
}

// reusePrefix starts g from the longest cached run of prompt's blocks under scope (at
// most up to the prompt's last token, which always runs) and asks g to keep its prompt's
// keys and values for storePrefix. It does nothing when the cache is off or g wants
// prompt scores (they need every position's logits).
func (e *Engine) reusePrefix(bm *baseModel, g *nn.Gen[float32], scope string, prompt []int) prefixUse {
	if e.prefix == nil || g.Scores != nil || len(prompt) < prefix.BlockTokens {
		return prefixUse{}
	}
	n := len(prompt) / prefix.BlockTokens
	pu := prefixUse{hashes: prefix.Hashes(scope, prompt, n, blockModes(len(prompt)))}
	usable := (len(prompt) - 1) / prefix.BlockTokens
	blocks := e.prefix.Lookup(pu.hashes[:usable], len(prompt))
	g.KeepPrompt(n * prefix.BlockTokens)
	if len(blocks) == 0 {
		return pu
	}
	kv := bm.m.NewCache()
	w := bm.m.KVDim()
	pos := len(blocks) * prefix.BlockTokens
	for l := range kv.K {
		kv.K[l] = make([]float32, 0, len(prompt)*w)
		kv.V[l] = make([]float32, 0, len(prompt)*w)
		for _, b := range blocks {
			kv.K[l] = append(kv.K[l], b.K[l]...)
			kv.V[l] = append(kv.V[l], b.V[l]...)
		}
	}
	kv.N = pos
	if g.Reuse(kv) {
		pu.cached = pos
	}
	return pu
}

// storePrefix stores the blocks of g's prompt the cache lacks (copied from g's kept keys
// and values, outside the cache's lock).
func (e *Engine) storePrefix(bm *baseModel, g *nn.Gen[float32], pu prefixUse) {
	kept := g.Kept()
	if e.prefix == nil || kept == nil || len(pu.hashes) == 0 {
		return
	}
	w := bm.m.KVDim()
	have := e.prefix.Has(pu.hashes)
	var add []*prefix.Block
	for b, h := range pu.hashes {
		if have[b] {
			continue
		}
		k, v := make([][]float32, len(kept.K)), make([][]float32, len(kept.V))
		lo, hi := b*prefix.BlockTokens*w, (b+1)*prefix.BlockTokens*w
		for l := range kept.K {
			k[l] = append([]float32(nil), kept.K[l][lo:hi]...)
			v[l] = append([]float32(nil), kept.V[l][lo:hi]...)
		}
		add = append(add, prefix.NewBlock(h, k, v))
	}
	e.prefix.Insert(add)
}
