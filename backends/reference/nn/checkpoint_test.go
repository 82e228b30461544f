package nn

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
)

// microCheckpoint saves a rank-4 adapter (with optimizer state) of the micro model and
// returns the model and the three files' bytes.
func microCheckpoint(t testing.TB) (*Model[float32], [3][]byte) {
	m, err := NewRandom[float32](microConfig(false), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	a, err := NewAdapter(m, LoraConfig{Rank: 4, Seed: 3, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	randomizeAdapter(a, 5, 0.1)
	a.Step = 2
	dir := t.TempDir()
	_, err = SaveAdapter(dir, a, "micro", true)
	require.NoError(t, err)
	var files [3][]byte
	for i, name := range []string{peft.AdapterConfigFile, peft.AdapterWeightsFile, peft.OptimizerFile} {
		files[i], err = os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
	}
	return m, files
}

func writeFolder(t testing.TB, dir string, files [3][]byte) {
	for i, name := range []string{peft.AdapterConfigFile, peft.AdapterWeightsFile, peft.OptimizerFile} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), files[i], 0o644))
	}
}

func TestLoadAdapterRoundTrip(t *testing.T) {
	m, files := microCheckpoint(t)
	dir := t.TempDir()
	writeFolder(t, dir, files)
	a, err := LoadAdapter(dir, m, true, 8)
	require.NoError(t, err)
	require.Equal(t, 4, a.Cfg.Rank)
	require.Equal(t, 2, a.Step)
	require.Len(t, a.Params, 2*(2*int(NumLayerTargets)+1))
	// the rank limit applies to a valid checkpoint too
	_, err = LoadAdapter(dir, m, false, 3)
	require.ErrorContains(t, err, "rank limit 3")
}

// FuzzLoadAdapter drives LoadAdapter with arbitrary adapter_config.json,
// adapter_model.safetensors and optimizer.safetensors contents for the micro model; it
// fails on any panic, and an adapter it accepts must fit the model and the rank limit.
func FuzzLoadAdapter(f *testing.F) {
	m, files := microCheckpoint(f)
	f.Add(files[0], files[1], files[2])
	f.Add([]byte(`{"r": 99999999, "target_modules": ["q_proj"]}`), files[1], files[2])
	f.Add([]byte(strings.Replace(string(files[0]), `"r": 4`, `"r": 8`, 1)), files[1], files[2])
	f.Add([]byte(strings.Replace(string(files[0]), `"lm_head"`, `"wq"`, 1)), files[1], files[2])
	huge := append([]byte(nil), files[1]...)
	binary.LittleEndian.PutUint64(huge, 1<<63)
	f.Add(files[0], huge, files[2])
	f.Add(files[0], files[1], files[1])
	f.Add(files[0], files[1], []byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, cfg, weights, optim []byte) {
		writeFolder(t, dir, [3][]byte{cfg, weights, optim})
		a, err := LoadAdapter(dir, m, true, 8)
		if err != nil {
			return
		}
		require.True(t, a.Cfg.Rank >= 1 && a.Cfg.Rank <= 8, "rank %d", a.Cfg.Rank)
		require.NotEmpty(t, a.Params)
		for _, p := range a.Params {
			require.Len(t, p.W, p.Shape[0]*p.Shape[1], p.Name)
			require.Len(t, p.M, len(p.W), p.Name)
			require.Len(t, p.V, len(p.W), p.Name)
		}
	})
}
