package reference

import (
	"context"
	"fmt"
	"strconv"

	"github.com/loops-dev/loops/backends"
)

// Name is the name the engine registers under.
const Name = "reference"

func init() {
	backends.Register(Name, func(_ context.Context, cfg backends.Config) (backends.Backend, error) {
		opts := Options{DataDir: cfg.DataDir, Models: cfg.Models, MaxLoraRank: cfg.MaxLoraRank}
		for k := range cfg.Options {
			if k != "threads" && k != "max_adapters" && k != "prefix_cache_bytes" {
				return nil, fmt.Errorf("reference: unknown backend option %q (it takes threads, max_adapters and prefix_cache_bytes)", k)
			}
		}
		if v, ok := cfg.Options["threads"]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("reference: option threads=%q is not a positive integer", v)
			}
			opts.Threads = n
		}
		if v, ok := cfg.Options["max_adapters"]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("reference: option max_adapters=%q is not a positive integer", v)
			}
			opts.MaxAdapters = n
		}
		if v, ok := cfg.Options["prefix_cache_bytes"]; ok {
			n, err := ParsePrefixCacheBytes(v)
			if err != nil {
				return nil, fmt.Errorf("reference: option prefix_cache_bytes: %w", err)
			}
			opts.PrefixCacheBytes = n
		}
		return New(opts)
	})
}

// MaxPrefixCacheBytes bounds the prefix cache's budget (1 TiB).
const MaxPrefixCacheBytes = 1 << 40

// ParsePrefixCacheBytes reads a prefix cache budget in bytes: 0 turns the cache off
// (Options.PrefixCacheBytes -1).
func ParsePrefixCacheBytes(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > MaxPrefixCacheBytes {
		return 0, fmt.Errorf("%q is not a number of bytes from 0 (off) to %d (e.g. 268435456 for 256 MiB)", v, int64(MaxPrefixCacheBytes))
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}
