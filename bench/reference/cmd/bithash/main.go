// Command bithash prints a SHA-256 of the reference engine's outputs on small random models
// (forward_backward losses, log-probs and LoRA gradients; a sampled completion's tokens and
// log-probs after a prompt long enough for two prefill chunks; prompt log-probs), so that
// two commits can be compared bit for bit: a change that claims to keep the numerics must
// print the same hashes before and after.
//
//	go run ./bench/reference/cmd/bithash
package main

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math"
	"os"

	"github.com/loops-dev/loops/backends/reference/nn"
)

func main() {
	base := nn.Config{Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3", Vocab: 512, Hidden: 256,
		Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 64, Inter: 512, MaxPos: 2048, RopeTheta: 1e6, Eps: 1e-6,
		Tied: true, HiddenAct: "silu"}
	cases := map[string]nn.Config{}
	cases["gqa2-hd64"] = base
	c := base
	c.Heads, c.KVHeads, c.HeadDim = 4, 4, 128 // one head per kv head
	cases["mha-hd128"] = c
	c = base
	c.Heads, c.KVHeads, c.HeadDim = 6, 2, 40 // three per kv head, a head size with a tail
	cases["gqa3-hd40"] = c
	for _, name := range []string{"gqa2-hd64", "mha-hd128", "gqa3-hd40"} {
		for _, threads := range []int{1, 2} {
			nn.SetThreads(threads)
			fmt.Printf("%-10s threads=%d %x\n", name, threads, run(cases[name]))
		}
	}
}

func run(cfg nn.Config) []byte {
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Seed: 3})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ad, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 8, Seed: 2, Attn: true, MLP: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, L := range ad.Layers { // B starts at zero: make the adapter do something
		for _, p := range L {
			if p != nil {
				for i := range p.B.W {
					p.B.W[i] = float32(math.Sin(float64(i))) * 0.05
				}
			}
		}
	}
	h := sha256.New()
	tok := func(i, n int) []int {
		t := make([]int, n)
		for k := range t {
			t[k] = (k*37 + i*11 + 5) % cfg.Vocab
		}
		return t
	}
	var seqs []nn.Seq[float32]
	for i, n := range []int{130, 7, 64} {
		t := tok(i, n+1)
		seqs = append(seqs, nn.Seq[float32]{Tokens: t[:n], Targets: t[1:], K: 1, Adapter: ad})
	}
	ce := func(_, _, _ int, lp float64) (float64, float64) { return -lp, -1 }
	for _, o := range m.ForwardBackward(seqs, ce, true) {
		f64s(h, o.LogProbs)
		f64s(h, o.Loss)
	}
	for _, L := range ad.Layers {
		for _, p := range L {
			if p != nil {
				f32s(h, p.A.G)
				f32s(h, p.B.G)
			}
		}
	}
	seed := uint64(9)
	out, ps := m.Sample(tok(7, 600), ad, 2, nn.SampleParams{MaxTokens: 24, Temperature: 1, Seed: &seed}, true, 0)
	for _, s := range out {
		for _, t := range s.Tokens {
			_ = binary.Write(h, binary.LittleEndian, int64(t))
		}
		f64s(h, s.LogProbs)
	}
	f64s(h, ps.LogProbs[1:])
	out, _ = m.Sample(tok(8, 20), nil, 3, nn.SampleParams{MaxTokens: 16, Temperature: 1, Seed: &seed}, false, 0)
	for _, s := range out {
		f64s(h, s.LogProbs)
	}
	return h.Sum(nil)
}

func f64s(h hash.Hash, x []float64) {
	for _, v := range x {
		_ = binary.Write(h, binary.LittleEndian, math.Float64bits(v))
	}
}

func f32s(h hash.Hash, x []float32) {
	for _, v := range x {
		_ = binary.Write(h, binary.LittleEndian, math.Float32bits(v))
	}
}
