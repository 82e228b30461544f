package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPackedProductIsRowStable checks sgemmNTPacked against the SGEMM that packs per call
// (sgemm, the training path: the same sums by another packing and driver), bit for bit,
// for every row count up to 14 and 32 (panels, single rows and padded panels), whole and
// partial strips and groups, one or several kc blocks, with and without adding to C, on
// one and several threads; and against the float64 product.
func TestPackedProductIsRowStable(t *testing.T) {
	if packedKernel == nil {
		t.Skip("no packed decode kernel on this CPU")
	}
	defer SetThreads(Threads())
	r := rand.New(rand.NewPCG(5, 6))
	fill := func(n int) []float32 { return normalF32(r, n) }
	for _, sh := range [][2]int{{256, 256}, {64, 768}, {37, 19}, {130, 300}, {16, 8}, {80, 1}, {3, 5}} {
		N, K := sh[0], sh[1]
		W := fill(N * K)
		p := packNT(W, N, K)
		A := fill(32 * K)
		want := make([]float32, 32*N)
		sgemm(activeKernel, 32, N, K, A, K, 1, W, 1, K, want, N, false)
		for i := range 32 {
			for j := range N {
				var f64 float64
				for k := range K {
					f64 += float64(A[i*K+k]) * float64(W[j*K+k])
				}
				require.InDelta(t, f64, float64(want[i*N+j]), 1e-4*(1+math.Abs(f64)), "N=%d K=%d [%d,%d]", N, K, i, j)
			}
		}
		// the same weight packed for A·W (W read as [N,K] row-major here)
		pn := packNN(W, K, N)
		An := fill(32 * N)
		wantNN := make([]float32, 32*K)
		sgemm(activeKernel, 32, K, N, An, N, 1, W, K, 1, wantNN, K, false)
		c0 := fill(32 * N)
		for _, threads := range []int{1, 2, 5} {
			SetThreads(threads)
			for _, M := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 32} {
				for _, off := range []int{0, 32 - M} { // the same rows at another place in a batch
					got := make([]float32, M*N)
					sgemmNTPacked(got, A[off*K:(off+M)*K], p, M, false)
					require.Equal(t, want[off*N:(off+M)*N], got, "N=%d K=%d M=%d off=%d threads=%d", N, K, M, off, threads)
					sum := append([]float32(nil), c0[:M*N]...)
					sgemmNTPacked(sum, A[off*K:(off+M)*K], p, M, true)
					wantSum := append([]float32(nil), c0[:M*N]...)
					sgemm(activeKernel, M, N, K, A[off*K:], K, 1, W, 1, K, wantSum, N, true)
					require.Equal(t, wantSum, sum, "N=%d K=%d M=%d off=%d threads=%d with acc", N, K, M, off, threads)
					gotNN := make([]float32, M*K)
					sgemmNTPacked(gotNN, An[off*N:(off+M)*N], pn, M, false)
					require.Equal(t, wantNN[off*K:(off+M)*K], gotNN, "A·W: N=%d K=%d M=%d off=%d threads=%d", N, K, M, off, threads)
				}
			}
		}
	}
}

// TestDecodeUsesPackedWeights checks that a small float32 model decodes from packed
// weights (when the CPU has the kernel), that a merged copy does not use its original's
// packs, and that a model above maxPackedModelBytes is not packed.
func TestDecodeUsesPackedWeights(t *testing.T) {
	if packedKernel == nil {
		t.Skip("no packed decode kernel on this CPU")
	}
	m, err := NewRandom[float32](benchDecodeConfig, RandomOptions{Seed: 7, QKNorm: true})
	require.NoError(t, err)
	dp := m.packedWeights()
	require.NotNil(t, dp)
	for l := range m.Layers {
		for tg := range m.Layers[l].Lin {
			li := &m.Layers[l].Lin[tg]
			require.True(t, packs(dp.pack(l, Target(tg)), li.W, li.Out, li.In, false), "layer %d target %d", l, tg)
			require.True(t, packs(dp.packNN(l, Target(tg)), li.W, li.In, li.Out, true), "layer %d target %d for A·W", l, tg)
			require.False(t, packs(dp.pack(l, Target(tg)), li.W, li.In, li.Out, true), "an A·Wᵀ pack is not an A·W one")
		}
	}
	require.True(t, packs(dp.pack(-1, 0), m.Head.W, m.Head.Out, m.Head.In, false))
	ad, err := NewAdapter(m, LoraConfig{Rank: 4, Seed: 3, Attn: true})
	require.NoError(t, err)
	for i := range ad.Layers[0][TQ].B.W {
		ad.Layers[0][TQ].B.W[i] = 0.1
	}
	merged := Merged(m, ad)
	mq := &merged.Layers[0].Lin[TQ]
	require.False(t, packs(dp.pack(0, TQ), mq.W, mq.Out, mq.In, false), "the merged weight is not the packed one")
	require.NotSame(t, m.packs, merged.packs)

	big := *m
	big.packs = new(weightPacks)
	big.Layers = append([]Layer[float32](nil), m.Layers...)
	big.Layers[0].Lin[TUp].W = make([]float32, maxPackedModelBytes/4)
	require.Nil(t, big.packedWeights(), "a model over the bound decodes from its weights as they are")
}

// TestTrainingWithPackedWeightsIsBitIdentical: a training step through the packed weights
// (a small float32 model packs them) gives the losses, log-probs and LoRA gradients of the
// same step without them, bit for bit, for batches below and above the small-M dot path.
func TestTrainingWithPackedWeightsIsBitIdentical(t *testing.T) {
	if packedKernel == nil || activeKernel.fn == nil {
		t.Skip("no packed kernels on this CPU")
	}
	m, err := NewRandom[float32](benchDecodeConfig, RandomOptions{Seed: 7, QKNorm: true})
	require.NoError(t, err)
	require.NotNil(t, m.packedWeights().packNN(0, TDown), "loops/tiny's shape packs its weights for input gradients too")
	plain := *m
	plain.packs = nil // the same weights, multiplied as they are
	for _, n := range []int{3, 40} {
		run := func(model *Model[float32]) ([]Output, [][]float32) {
			ad, err := NewAdapter(model, LoraConfig{Rank: 4, Seed: 5, Attn: true, MLP: true, Unembed: true})
			require.NoError(t, err)
			for _, p := range ad.Params {
				for i := range p.W {
					p.W[i] = float32(math.Sin(float64(i+len(p.Name)))) * 0.05
				}
			}
			rr := rand.New(rand.NewPCG(uint64(n), 1))
			tk, tg := make([]int, n), make([]int, n)
			for i := range tk {
				tk[i], tg[i] = rr.IntN(512), rr.IntN(512)
			}
			outs := model.ForwardBackward([]Seq[float32]{{Tokens: tk, Targets: tg, K: 1, Adapter: ad}}, testLoss, true)
			var grads [][]float32
			for _, p := range ad.Params {
				grads = append(grads, p.G)
			}
			return outs, grads
		}
		wantOut, wantG := run(&plain)
		gotOut, gotG := run(m)
		require.Equal(t, wantOut, gotOut, "n=%d", n)
		require.Equal(t, wantG, gotG, "n=%d", n)
	}
}
