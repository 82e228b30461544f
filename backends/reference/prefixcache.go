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
	cached int             // prompt tokens reused
	add    []*prefix.Block // the prompt's blocks the cache lacked, copied once it has run
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
// most up to the prompt's last token, which always runs), and has g copy the prompt's
// blocks the cache lacks once the prompt has run (at most as many as the budget holds:
// the memory a request adds is bounded by it), for storePrefix. It does nothing when the
// cache is off or g wants prompt scores (they need every position's logits).
func (e *Engine) reusePrefix(bm *baseModel, g *nn.Gen[float32], scope string, prompt []int) *prefixUse {
	pu := &prefixUse{}
	if e.prefix == nil || g.Scores != nil || len(prompt) < prefix.BlockTokens {
		return pu
	}
	n := len(prompt) / prefix.BlockTokens
	hashes := prefix.Hashes(scope, prompt, n, blockModes(len(prompt)))
	usable := (len(prompt) - 1) / prefix.BlockTokens
	blocks := e.prefix.Lookup(hashes[:usable], len(prompt))
	w, layers := bm.m.KVDim(), len(bm.m.Layers)
	if len(blocks) > 0 {
		kv := bm.m.NewCache()
		for l := range kv.K {
			kv.K[l] = make([]float32, 0, len(prompt)*w)
			kv.V[l] = make([]float32, 0, len(prompt)*w)
			for _, b := range blocks {
				kv.K[l] = append(kv.K[l], b.K[l]...)
				kv.V[l] = append(kv.V[l], b.V[l]...)
			}
		}
		kv.N = len(blocks) * prefix.BlockTokens
		if g.Reuse(kv) {
			pu.cached = kv.N
		}
	}
	blockBytes := int64(2 * layers * prefix.BlockTokens * w * 4)
	var missing []int
	for b, have := range e.prefix.Has(hashes) {
		if !have && int64(len(missing)+1)*blockBytes <= e.opts.PrefixCacheBytes {
			missing = append(missing, b)
		}
	}
	if len(missing) == 0 {
		return pu
	}
	g.OnPrefilled = func(kv *nn.KVCache[float32]) {
		for _, b := range missing {
			k, v := make([][]float32, layers), make([][]float32, layers)
			lo, hi := b*prefix.BlockTokens*w, (b+1)*prefix.BlockTokens*w
			for l := range layers {
				k[l] = append([]float32(nil), kv.K[l][lo:hi]...)
				v[l] = append([]float32(nil), kv.V[l][lo:hi]...)
			}
			pu.add = append(pu.add, prefix.NewBlock(hashes[b], k, v))
		}
	}
	return pu
}

// storePrefix stores the blocks reusePrefix had copied (none when the prompt did not run
// to its end).
func (e *Engine) storePrefix(pu *prefixUse) {
	if len(pu.add) > 0 {
		e.prefix.Insert(pu.add)
	}
}
