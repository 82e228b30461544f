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
			if k != "threads" && k != "max_adapters" {
				return nil, fmt.Errorf("reference: unknown backend option %q (it takes threads and max_adapters)", k)
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
		return New(opts)
	})
}
