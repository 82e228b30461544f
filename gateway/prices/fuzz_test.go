package prices_test

import (
	"testing"

	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
)

// FuzzParse: any bytes either parse into a sheet whose costs never panic, or are refused
// with an error.
func FuzzParse(f *testing.F) {
	f.Add([]byte(sheetYAML))
	f.Add([]byte(`{"models": {"m": {"sample": 0.5}}, "gpu_hour": {"*": "1"}}`))
	f.Add([]byte("models: {m: {train: 1e3}}"))
	f.Add([]byte("workspaces: {a: {models: {\"*\": {prefill: \"0.000001\"}}}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := prices.Parse(data, loaded)
		if err != nil {
			return
		}
		for _, kind := range []string{store.UsageTraining, store.UsageSamplingPrefill, store.UsageSamplingSample, prices.UsageCachedPrefill, store.UsageDedicatedGPUSeconds} {
			for _, ws := range []string{"a", "x"} {
				c, ok, err := s.Cost(ws, "m", kind, "H100", 12345)
				if err == nil && ok && c < 0 {
					t.Fatalf("negative cost %s", c)
				}
			}
		}
	})
}
