package infer

import (
	"container/list"
	"strings"
	"sync"
)

// sampler is a core sampler the adapter reuses for one (workspace, model).
type sampler struct {
	id        string
	baseModel string
}

// samplerCache remembers one sampler per (workspace, model string), at most max of them;
// past it the least recently used is forgotten. Forgetting costs nothing but a new sampler
// on the next request: the core holds samplers in memory under its own bounds
// (Limits.MaxSamplersInMemory, SamplerIdleTTL) and reloads an evicted one when named.
type samplerCache struct {
	max   int
	mu    sync.Mutex
	lru   *list.List // of *samplerEntry, most recent first
	byKey map[string]*list.Element
}

type samplerEntry struct {
	key string
	s   sampler
}

func newSamplerCache(max int) *samplerCache {
	return &samplerCache{max: max, lru: list.New(), byKey: map[string]*list.Element{}}
}

func (c *samplerCache) get(key string) (sampler, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[key]
	if !ok {
		return sampler{}, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*samplerEntry).s, true
}

func (c *samplerCache) put(key string, s sampler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[key]; ok {
		e.Value.(*samplerEntry).s = s
		c.lru.MoveToFront(e)
		return
	}
	c.byKey[key] = c.lru.PushFront(&samplerEntry{key: key, s: s})
	for c.lru.Len() > c.max {
		last := c.lru.Back()
		c.lru.Remove(last)
		delete(c.byKey, last.Value.(*samplerEntry).key)
	}
}

// drop forgets key's sampler if it is still id.
func (c *samplerCache) drop(key, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[key]; ok && e.Value.(*samplerEntry).s.id == id {
		c.lru.Remove(e)
		delete(c.byKey, key)
	}
}

// len is the number of samplers remembered (tests).
func (c *samplerCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// ParseModel splits a request's model into the CreateSampler fields: "<base>",
// "tinker://…" (a checkpoint path) or "<base>;<checkpoint path>".
func ParseModel(model string) (baseModel, modelPath string, err error) {
	model = strings.TrimSpace(model)
	if base, path, ok := strings.Cut(model, ";"); ok {
		base, path = strings.TrimSpace(base), strings.TrimSpace(path)
		if base == "" || !strings.HasPrefix(path, "tinker://") {
			return "", "", BadField("model", "model %q: write \"<base model>;tinker://<run>/sampler_weights/<name>\"", Truncate(model))
		}
		return base, path, nil
	}
	if strings.HasPrefix(model, "tinker://") {
		return "", model, nil
	}
	return model, "", nil
}
