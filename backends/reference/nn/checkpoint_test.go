package nn

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
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

// gradAdapter is a rank-4 adapter of the micro model with random weights and gradients.
func gradAdapter(t testing.TB) (*Model[float32], *Adapter[float32]) {
	m, err := NewRandom[float32](microConfig(false), RandomOptions{QKNorm: true, Std: 0.3, Seed: 7})
	require.NoError(t, err)
	a, err := NewAdapter(m, LoraConfig{Rank: 4, Seed: 3, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	randomizeAdapter(a, 5, 0.1)
	r := rand.New(rand.NewPCG(9, 1))
	for _, p := range a.Params {
		for i := range p.G {
			p.G[i] = float32(r.NormFloat64() * 1e-3)
		}
	}
	return m, a
}

func TestGradientsRoundTrip(t *testing.T) {
	m, a := gradAdapter(t)
	dir := t.TempDir()
	_, err := SaveAdapter(dir, a, "micro", true)
	require.NoError(t, err)
	n, err := SaveGradients(dir, a)
	require.NoError(t, err)
	st, err := os.Stat(filepath.Join(dir, GradientsFile))
	require.NoError(t, err)
	require.Equal(t, st.Size(), n)
	b, err := LoadAdapter(dir, m, true, 8)
	require.NoError(t, err)
	require.NoError(t, LoadGradients(dir, b))
	require.Len(t, b.Params, len(a.Params))
	for i, p := range a.Params {
		q := b.Params[i]
		require.Equal(t, p.Name, q.Name)
		require.Equal(t, p.W, q.W, p.Name)
		require.Equal(t, p.G, q.G, p.Name)
		require.Equal(t, p.M, q.M, p.Name)
		require.Equal(t, p.V, q.V, p.Name)
	}
}

func TestLoadGradientsRejects(t *testing.T) {
	m, a := gradAdapter(t)
	dir := t.TempDir()
	_, err := SaveAdapter(dir, a, "micro", false)
	require.NoError(t, err)
	b, err := LoadAdapter(dir, m, false, 8)
	require.NoError(t, err)
	require.ErrorContains(t, LoadGradients(dir, b), "gradients requested but gradients.safetensors could not be read")
	grads := func(edit func(name string, shape []int64, g []float32) (string, []int64, []float32)) {
		var ts []safetensors.Tensor
		for _, p := range a.Params {
			name, shape, g := edit(p.Name+".grad", []int64{int64(p.Shape[0]), int64(p.Shape[1])}, append([]float32(nil), p.G...))
			if name != "" {
				ts = append(ts, safetensors.Tensor{Name: name, Shape: shape, Data: g})
			}
		}
		_, err := safetensors.Write(filepath.Join(dir, GradientsFile), ts, nil)
		require.NoError(t, err)
	}
	first := a.Params[0].Name + ".grad"
	for _, tc := range []struct {
		want string
		edit func(name string, shape []int64, g []float32) (string, []int64, []float32)
	}{
		{"is not the gradient of a tensor", func(n string, s []int64, g []float32) (string, []int64, []float32) {
			if n == first {
				n = "base_model.model.nope.lora_A.weight.grad"
			}
			return n, s, g
		}},
		{"has shape", func(n string, s []int64, g []float32) (string, []int64, []float32) {
			if n == first {
				s = []int64{s[1], s[0]} // transposed
			}
			return n, s, g
		}},
		{"holds 1 tensors", func(n string, s []int64, g []float32) (string, []int64, []float32) {
			if n != first {
				n = ""
			}
			return n, s, g
		}},
		{"values must be finite", func(n string, s []int64, g []float32) (string, []int64, []float32) {
			if n == first {
				g[3] = float32(math.NaN())
			}
			return n, s, g
		}},
	} {
		grads(tc.edit)
		before := append([]float32(nil), b.Params[0].G...)
		require.ErrorContains(t, LoadGradients(dir, b), tc.want)
		require.Equal(t, before, b.Params[0].G, "a refused file leaves the gradients alone")
	}
}

// FuzzLoadGradients drives LoadGradients with arbitrary gradients.safetensors contents for
// an adapter of the micro model; it fails on any panic, and leaves the gradients alone
// unless it accepts the file.
func FuzzLoadGradients(f *testing.F) {
	_, a := gradAdapter(f)
	seed := f.TempDir()
	_, err := SaveGradients(seed, a)
	require.NoError(f, err)
	good, err := os.ReadFile(filepath.Join(seed, GradientsFile))
	require.NoError(f, err)
	f.Add(good)
	huge := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(huge, 1<<63)
	f.Add(huge)
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, GradientsFile), b, 0o644))
		before := append([]float32(nil), a.Params[0].G...)
		if err := LoadGradients(dir, a); err != nil {
			require.Equal(t, before, a.Params[0].G)
		}
	})
}
