package ckfiles

import (
	"testing"

	"github.com/loops-dev/loops/gateway/core/validate"
	"github.com/stretchr/testify/require"
)

// FuzzParseKey: the start-up sweep parses every key it lists in the checkpoint store, which
// other processes may have written. ParseKey never panics, accepts only keys this package
// writes, and what it accepts is exactly the key it was built from.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"ws-a/run-1/weights/c@1796267361372581251", "ws/run/sampler_weights/ephemeral-000001-ab@1",
		"ws/run/external_weights/x@-5", "ws/run/other/c@1", "ws/run/weights/c", "a/b/c/d/e", "", "////",
		"ws/run/weights/@1", "ws/run/weights/c@1@trash", "ws/run/weights/c@99999999999999999999",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		ws, runID, kind, name, gen, ok := ParseKey(key)
		if !ok {
			return
		}
		if validate.CheckpointName(name) != nil || gen < 0 {
			return // never written by this package: the sweep finds no record for it and skips it
		}
		again, err := Key(ws, runID, kind, name, gen)
		if err != nil {
			return // a workspace or run id the core would refuse
		}
		require.Equal(t, key, again)
	})
}
