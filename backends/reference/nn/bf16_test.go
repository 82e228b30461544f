package nn

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loops-dev/loops/backends/reference/safetensors"

	"github.com/stretchr/testify/require"
)

// roundBF16 rounds every decoder linear weight of m to bfloat16 (as a BF16 checkpoint
// holds them), to nearest even.
func roundBF16(m *Model[float32]) {
	for l := range m.Layers {
		for t := range m.Layers[l].Lin {
			w := m.Layers[l].Lin[t].W
			for i, v := range w {
				b := math.Float32bits(v)
				b += 0x7fff + (b>>16)&1
				w[i] = math.Float32frombits(b &^ 0xffff)
			}
		}
	}
}

func bits64(x []float64) []uint64 {
	o := make([]uint64, len(x))
	for i, v := range x {
		o[i] = math.Float64bits(v)
	}
	return o
}

// TestBF16HeldIsBitIdentical: a model whose linear weights are bfloat16, held as bf16
// (HoldBF16) and held as the same values in float32, gives bit-identical prompt log-probs
// (prefill of one and of several chunks), sampled tokens and their log-probs (batched
// decoding), and forward_backward log-probs, losses and LoRA gradients, with every kernel,
// packed weights or not, and dimensions that leave k tails (Hidden 200).
func TestBF16HeldIsBitIdentical(t *testing.T) {
	shapes := map[string]Config{"k8": benchDecodeConfig, "ktail": benchDecodeConfig}
	c := shapes["k8"]
	c.Layers = 2
	shapes["k8"] = c
	c.Hidden, c.Inter, c.Layers = 200, 332, 1
	shapes["ktail"] = c
	for _, kn := range availableKernels {
		for name, cfg := range shapes {
			for _, packed := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/packed=%v", kn.name, name, packed), func(t *testing.T) {
					withKernel(kn, func() {
						f32, err := NewRandom[float32](cfg, RandomOptions{Seed: 11, QKNorm: true, AttnBias: name == "ktail"})
						require.NoError(t, err)
						roundBF16(f32)
						held := Convert[float32](f32)
						require.Equal(t, int(NumLayerTargets)*cfg.Layers, HoldBF16(held))
						for _, li := range held.Layers[0].Lin {
							require.True(t, li.Held16())
							require.Nil(t, li.W)
						}
						if !packed {
							f32.packs, held.packs = nil, nil
						}
						r := rand.New(rand.NewPCG(5, 6))
						ad32 := testAdapters(t, f32, r, 4)[0]
						adH := ad32.Clone()
						for _, n := range []int{40, 600} {
							prompt := make([]int, n)
							for i := range prompt {
								prompt[i] = r.IntN(cfg.Vocab)
							}
							seed := uint64(n)
							p := SampleParams{MaxTokens: 12, Temperature: 1, Seed: &seed}
							s32, ps32 := f32.Sample(prompt, ad32, 2, p, true, 0)
							sH, psH := held.Sample(prompt, adH, 2, p, true, 0)
							require.Equal(t, bits64(ps32.LogProbs), bits64(psH.LogProbs), "prompt log-probs, %d tokens", n)
							require.Len(t, sH, len(s32))
							for i := range s32 {
								require.Equal(t, s32[i].Tokens, sH[i].Tokens)
								require.Equal(t, bits64(s32[i].LogProbs), bits64(sH[i].LogProbs))
							}
						}
						toks, tg := randSeq(r, 70, cfg.Vocab, 1)
						o32 := f32.ForwardBackward([]Seq[float32]{{Tokens: toks, Targets: tg, K: 1, Adapter: ad32}}, testLoss, true)
						oH := held.ForwardBackward([]Seq[float32]{{Tokens: toks, Targets: tg, K: 1, Adapter: adH}}, testLoss, true)
						require.Equal(t, bits64(o32[0].LogProbs), bits64(oH[0].LogProbs))
						require.Equal(t, bits64(o32[0].Loss), bits64(oH[0].Loss))
						for i := range ad32.Params {
							require.Equal(t, ad32.Params[i].G, adH.Params[i].G, ad32.Params[i].Name)
						}
					})
				})
			}
		}
	}
}

// TestWidenBF16: the widening kernel gives bits<<16 for every length (its 32- and 8-lane
// blocks and the Go tail).
func TestWidenBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 8, 9, 31, 32, 33, 64, 100, 1027} {
		src := make([]uint16, n)
		for i := range src {
			src[i] = uint16(r.Uint32())
		}
		dst := make([]float32, n)
		widenBF16(dst, src)
		for i, h := range src {
			require.Equal(t, uint32(h)<<16, math.Float32bits(dst[i]), "n=%d i=%d", n, i)
		}
	}
}

// writeBF16Checkpoint writes m (config and weights) to dir in one safetensors file, the
// decoder's projection weights in BF16 (their values must be bfloat16) and the rest in F32.
func writeBF16Checkpoint(t *testing.T, m *Model[float32], dir string) {
	require.NoError(t, WriteConfig(dir, m.Cfg, nil))
	infos := map[string]safetensors.Info{}
	var data []byte
	for _, ts := range m.Tensors() {
		dtype, size := "F32", 4
		if strings.HasSuffix(ts.Name, "_proj.weight") {
			dtype, size = "BF16", 2
		}
		off := int64(len(data))
		for _, v := range ts.Data {
			b := math.Float32bits(v)
			if size == 2 {
				require.Zero(t, b&0xffff)
				data = binary.LittleEndian.AppendUint16(data, uint16(b>>16))
			} else {
				data = binary.LittleEndian.AppendUint32(data, b)
			}
		}
		infos[ts.Name] = safetensors.Info{DType: dtype, Shape: ts.Shape, Offsets: [2]int64{off, int64(len(data))}}
	}
	hdr, err := safetensors.EncodeHeader(infos, nil)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors"), append(hdr, data...), 0o644))
}

// TestLoadHoldsBF16: Load holds a BF16 checkpoint's projection weights as bfloat16 (not
// with LoadBF16 off, nor in a float64 model), and the model held so gives the
// forward_backward bits of the same checkpoint loaded as float32.
func TestLoadHoldsBF16(t *testing.T) {
	cfg := microConfig(true)
	cfg.Architectures, cfg.ModelType, cfg.HiddenAct = []string{"Qwen3ForCausalLM"}, "qwen3", "silu"
	m, err := NewRandom[float32](cfg, RandomOptions{Seed: 3, QKNorm: true, Std: 0.3})
	require.NoError(t, err)
	roundBF16(m)
	dir := t.TempDir()
	writeBF16Checkpoint(t, m, dir)
	held, err := Load[float32](dir)
	require.NoError(t, err)
	for _, L := range held.Layers {
		for _, li := range L.Lin {
			require.True(t, li.Held16())
		}
	}
	LoadBF16 = false
	wide, err := Load[float32](dir)
	LoadBF16 = true
	require.NoError(t, err)
	require.False(t, wide.Layers[0].Lin[TQ].Held16())
	m64, err := Load[float64](dir)
	require.NoError(t, err)
	require.False(t, m64.Layers[0].Lin[TQ].Held16())
	require.Equal(t, held.ParamCount(), wide.ParamCount())
	r := rand.New(rand.NewPCG(1, 1))
	toks, tg := randSeq(r, 30, cfg.Vocab, 1)
	oH := held.ForwardBackward([]Seq[float32]{{Tokens: toks, Targets: tg, K: 1}}, testLoss, false)
	oW := wide.ForwardBackward([]Seq[float32]{{Tokens: toks, Targets: tg, K: 1}}, testLoss, false)
	require.Equal(t, bits64(oW[0].LogProbs), bits64(oH[0].LogProbs))
	// merged with an adapter, and written back, the held model gives the float32 model's
	// values
	a, err := NewAdapter(wide, LoraConfig{Rank: 2, Seed: 4, Attn: true, MLP: true})
	require.NoError(t, err)
	randomizeAdapter(a, 4, 0.1)
	mH, mW := Merged(held, a), Merged(wide, a)
	require.False(t, mH.Layers[0].Lin[TQ].Held16())
	require.Equal(t, mW.Tensors(), mH.Tensors())
	require.Equal(t, MergedBytes(wide, a), MergedBytes(held, a))
	for i, ts := range held.Tensors() {
		require.Equal(t, wide.Tensors()[i].Data, ts.Data, ts.Name)
	}
}

// TestRowsBF16Bits: sgemmNTRows on bf16 rows of B gives the bits of sgemmNTRows on the
// same rows widened to float32, for every row-kernel width this CPU has (AVX2's 3, and 0:
// no tile), row counts across the tile and pair paths, column counts with and without
// groups of eight and four, and k with and without a tail.
func TestRowsBF16Bits(t *testing.T) {
	kn := activeKernel
	if kn.fn == nil || kn.dot == nil {
		t.Skip("no SGEMM kernel")
	}
	r := rand.New(rand.NewPCG(9, 9))
	best := rowTile
	defer func() { rowTile = best }()
	for _, tile := range append(rowTiles(), 0) {
		rowTile = tile
		for _, K := range []int{64, 200, 37, 8} {
			for _, N := range []int{1, 3, 8, 13, 70} {
				for _, M := range []int{1, 2, 3, 4, 5, 9} {
					A := make([]float32, M*K)
					for i := range A {
						A[i] = float32(r.NormFloat64())
					}
					B16 := make([]uint16, N*K)
					for i := range B16 {
						B16[i] = uint16(math.Float32bits(float32(r.NormFloat64())) >> 16)
					}
					B := make([]float32, N*K)
					widenBF16(B, B16)
					for _, acc := range []bool{false, true} {
						want, got := make([]float32, M*N), make([]float32, M*N)
						for i := range want {
							want[i] = float32(i)
							got[i] = float32(i)
						}
						sgemmNTRows(kn, want, A, B, nil, M, N, K, acc)
						sgemmNTRows(kn, got, A, nil, B16, M, N, K, acc)
						require.Equal(t, want, got, "tile %d M %d N %d K %d acc %v", tile, M, N, K, acc)
					}
				}
			}
		}
	}
}
