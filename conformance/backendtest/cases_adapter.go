package backendtest

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/conformance/oracle"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/receipt"
)

// LossFunctions are the losses every backend implements.
var LossFunctions = []string{"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}

func capabilityCases() []testCase {
	return []testCase{
		{"capabilities/trainer", func(h *harness) {
			resp, err := h.tr.GetCapabilities(h.ctx, &backendv1.GetCapabilitiesRequest{})
			require.NoError(h.t, err)
			mi := h.modelInfo(resp.GetModels())
			require.Equal(h.t, int32(h.o.Cfg.VocabSize), mi.GetVocabSize(), "vocab_size")
			require.Equal(h.t, int32(h.o.Cfg.HiddenSize), mi.GetHiddenSize(), "hidden_size")
			// The revision of the model's files (docs/receipts.md), as the gateway computes it.
			rev, err := receipt.DirRevision(h.opts.ModelDir)
			require.NoError(h.t, err)
			require.Equal(h.t, rev, mi.GetRevision(), "revision")
			require.Positive(h.t, mi.GetMaxSequenceLength(), "max_sequence_length")
			require.GreaterOrEqual(h.t, mi.GetMaxLoraRank(), int32(1), "max_lora_rank")
			require.Subset(h.t, resp.GetLossFunctions(), LossFunctions, "loss_functions")
			require.NotEmpty(h.t, resp.GetImplementation(), "implementation")
		}},
		{"capabilities/sampler", func(h *harness) {
			resp, err := h.sp.GetCapabilities(h.ctx, &backendv1.GetCapabilitiesRequest{})
			require.NoError(h.t, err)
			h.modelInfo(resp.GetModels())
		}},
	}
}

func (h *harness) modelInfo(models []*loopsv1.ModelInfo) *loopsv1.ModelInfo {
	h.t.Helper()
	var names []string
	for _, m := range models {
		if m.GetName() == h.opts.ModelName {
			return m
		}
		names = append(names, m.GetName())
	}
	h.t.Fatalf("GetCapabilities lists %v, not %q", names, h.opts.ModelName)
	return nil
}

// caps returns the trainer's ModelInfo of the suite's model.
func (h *harness) caps() *loopsv1.ModelInfo {
	h.t.Helper()
	resp, err := h.tr.GetCapabilities(h.ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(h.t, err)
	return h.modelInfo(resp.GetModels())
}

func forwardCases() []testCase {
	ce := oracle.Loss{Name: "cross_entropy"}
	return []testCase{
		{"forward/fresh_adapter_is_base_model", func(h *harness) {
			// B starts at zero, so a new adapter computes the base model
			id := h.create(loraConfig())
			data := []example{h.ceExample(9, nil), h.ceExample(3, nil)}
			res := h.fb(id, ce, data, true)
			h.checkOutputs(res, data, h.o.Evaluate(nil, ce, oracleData(data)))
		}},
		{"forward/outputs_and_metrics", func(h *harness) {
			// per-datum logprobs (N,) and elementwise_loss (N,), float32; "name:reduction" metrics
			dir, ad := h.warm(loraConfig())
			id := h.loadFresh(dir, loraConfig())
			data := []example{h.ceExample(1, nil), h.ceExample(10, nil), h.ceExample(4, nil)}
			ev := h.o.Evaluate(ad, ce, oracleData(data))
			h.checkOutputs(h.fb(id, ce, data, true), data, ev)
			h.checkOutputs(h.fb(id, ce, data, false), data, ev)
		}},
		{"forward/single_token", func(h *harness) {
			dir, ad := h.warm(loraConfig())
			id := h.loadFresh(dir, loraConfig())
			data := []example{h.ceExample(1, []float64{2.5})}
			h.checkOutputs(h.fb(id, ce, data, true), data, h.o.Evaluate(ad, ce, oracleData(data)))
		}},
	}
}

// targetModules are the PEFT target module names of each flag.
var targetModules = map[string][]string{
	"attn":    {"q_proj", "k_proj", "v_proj", "o_proj"},
	"mlp":     {"gate_proj", "up_proj", "down_proj"},
	"unembed": {"lm_head"},
}

func adapterCases() []testCase {
	ce := oracle.Loss{Name: "cross_entropy"}
	flags := func(name string, attn, mlp, unembed bool) testCase {
		return testCase{"lora/targets/" + name, func(h *harness) {
			lc := &loopsv1.LoraConfig{Rank: 3, Seed: 1, TrainAttn: attn, TrainMlp: mlp, TrainUnembed: unembed}
			h.checkTargets(lc)
		}}
	}
	return []testCase{
		flags("attn", true, false, false),
		flags("mlp", false, true, false),
		flags("unembed", false, false, true),
		flags("attn_mlp", true, true, false),
		flags("all", true, true, true),
		{"lora/rank/one", func(h *harness) {
			h.checkTargets(&loopsv1.LoraConfig{Rank: 1, Seed: 2, TrainAttn: true, TrainMlp: true, TrainUnembed: true})
		}},
		{"lora/rank/max", func(h *harness) {
			r := h.caps().GetMaxLoraRank()
			h.checkTargets(&loopsv1.LoraConfig{Rank: r, Seed: 2, TrainAttn: true, TrainMlp: true, TrainUnembed: true})
		}},
		{"lora/seed", func(h *harness) {
			// A is drawn from the seed: the same seed gives the same A, another seed another A
			lc := loraConfig()
			a := h.oracleAdapter(h.save(h.create(lc), false)).Vector()
			b := h.oracleAdapter(h.save(h.create(lc), false)).Vector()
			require.Zero(h.t, h.maxAbsDiff(a, b), "two adapters with seed %d differ", lc.Seed)
			lc.Seed++
			c := h.oracleAdapter(h.save(h.create(lc), false)).Vector()
			require.Positive(h.t, h.maxAbsDiff(a, c), "seeds %d and %d give the same A", lc.Seed-1, lc.Seed)
		}},
		{"checkpoint/round_trip", func(h *harness) {
			// save with optimizer state, load into a new adapter: the next step is the same
			// as continuing; loading without optimizer state restarts Adam
			lc := loraConfig()
			dir, _ := h.warm(lc)
			d1, d2 := h.ceExample(7, nil), h.ceExample(6, nil)
			p := defaultAdam(1e-2)
			x := h.loadFresh(dir, lc)
			h.fb(x, ce, []example{d1}, false)
			h.step(x, p)
			ckpt := h.save(x, true)
			h.fb(x, ce, []example{d2}, false)
			h.step(x, p)
			cont := h.save(x, false)

			y := h.create(lc)
			_, err := h.tr.LoadAdapter(h.ctx, &backendv1.LoadAdapterRequest{AdapterId: y, Dir: ckpt, LoadOptimizer: true})
			require.NoError(h.t, err, "LoadAdapter with optimizer")
			h.sameWeights("loaded vs saved", h.save(y, false), ckpt, 0)
			h.fb(y, ce, []example{d2}, false)
			h.step(y, p)
			h.sameWeights("resumed vs continued", h.save(y, false), cont, 1e-7)

			z := h.loadFresh(ckpt, lc)
			h.fb(z, ce, []example{d2}, false)
			h.step(z, p)
			d := h.maxAbsDiff(h.oracleAdapter(h.save(z, false)).Vector(), h.oracleAdapter(cont).Vector())
			require.Greater(h.t, d, 1e-4, "a step after loading without optimizer state equals one with it")
		}},
		{"checkpoint/peft_layout", func(h *harness) {
			lc := loraConfig()
			dir, _ := h.warm(lc)
			var cfg map[string]any
			b, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
			require.NoError(h.t, err)
			require.NoError(h.t, json.Unmarshal(b, &cfg))
			require.Equal(h.t, "LORA", cfg["peft_type"], "peft_type")
			require.Equal(h.t, "CAUSAL_LM", cfg["task_type"], "task_type")
			require.EqualValues(h.t, 32, cfg["lora_alpha"], "lora_alpha")
			require.EqualValues(h.t, lc.Rank, cfg["r"], "r")
			require.FileExists(h.t, filepath.Join(dir, "adapter_model.safetensors"))
		}},
		{"adapters/isolation", func(h *harness) {
			// training one adapter never changes another's outputs or weights
			lc := loraConfig()
			dir, _ := h.warm(lc)
			x, y := h.loadFresh(dir, lc), h.loadFresh(dir, lc)
			probe := []example{h.ceExample(8, nil)}
			before := h.fb(y, ce, probe, true)
			saved := h.save(y, false)
			for i := 0; i < 2; i++ {
				h.fb(x, ce, []example{h.ceExample(6, nil)}, false)
				h.step(x, defaultAdam(0.05))
			}
			after := h.fb(y, ce, probe, true)
			require.Equal(h.t, before.GetOutputs()[0].GetOutputs()["logprobs"].GetFloat32Data(),
				after.GetOutputs()[0].GetOutputs()["logprobs"].GetFloat32Data(), "adapter %s changed when %s trained", y, x)
			h.sameWeights("untouched adapter", h.save(y, false), saved, 0)
			moved := h.maxAbsDiff(h.oracleAdapter(h.save(x, false)).Vector(), h.oracleAdapter(saved).Vector())
			require.Greater(h.t, moved, 1e-3, "the trained adapter did not move")
		}},
		{"adapters/mixed_batch", func(h *harness) {
			// one request with items of two adapters (and two losses) equals two requests
			lc := loraConfig()
			dir, ad := h.warm(lc)
			d1 := []example{h.ceExample(7, nil)}
			is := oracle.Loss{Name: "importance_sampling"}
			d2 := []example{h.rlExample(6, ad, []float64{0.8, 1.2}, []float64{1, -1})}
			p, q := h.loadFresh(dir, lc), h.loadFresh(dir, lc)
			resp, err := h.tr.ForwardBackward(h.ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
				item(p, ce, d1, false), item(q, is, d2, false)}})
			require.NoError(h.t, err)
			require.Len(h.t, resp.GetResults(), 2)
			for i, r := range resp.GetResults() {
				require.Nil(h.t, r.GetError(), "item %d: %v", i, r.GetError())
			}
			h.checkOutputs(resp.GetResults()[0].GetResult(), d1, h.o.Evaluate(ad, ce, oracleData(d1)))
			h.checkOutputs(resp.GetResults()[1].GetResult(), d2, h.o.Evaluate(ad, is, oracleData(d2)))
			h.step(p, probeAdam)
			h.step(q, probeAdam)
			r, s := h.loadFresh(dir, lc), h.loadFresh(dir, lc)
			h.fb(r, ce, d1, false)
			h.fb(s, is, d2, false)
			h.step(r, probeAdam)
			h.step(s, probeAdam)
			h.sameWeights("mixed batch vs alone (first adapter)", h.save(p, false), h.save(r, false), 1e-6)
			h.sameWeights("mixed batch vs alone (second adapter)", h.save(q, false), h.save(s, false), 1e-6)
		}},
	}
}

// checkTargets creates an adapter and checks its saved folder: exactly the modules of its
// flags in every layer, rank r, alpha 32, A [r, in] not zero, B [out, r] zero.
func (h *harness) checkTargets(lc *loopsv1.LoraConfig) {
	h.t.Helper()
	dir := h.save(h.create(lc), false)
	ad := h.oracleAdapter(dir)
	var want []string
	var names []string
	add := func(flag string) {
		for _, m := range targetModules[flag] {
			names = append(names, m)
			if m == "lm_head" {
				want = append(want, "lm_head")
				continue
			}
			sub := "self_attn"
			if flag == "mlp" {
				sub = "mlp"
			}
			for l := 0; l < h.o.Cfg.NumLayers; l++ {
				want = append(want, fmt.Sprintf("model.layers.%d.%s.%s", l, sub, m))
			}
		}
	}
	if lc.TrainAttn {
		add("attn")
	}
	if lc.TrainMlp {
		add("mlp")
	}
	if lc.TrainUnembed {
		add("unembed")
	}
	sort.Strings(want)
	require.Equal(h.t, want, ad.Modules(), "adapted modules")
	require.ElementsMatch(h.t, names, ad.Cfg.TargetModules, "target_modules")
	require.Equal(h.t, int(lc.Rank), ad.Cfg.R, "r")
	require.InDelta(h.t, 32.0, ad.Cfg.LoraAlpha, 0, "lora_alpha")
	for _, m := range want {
		p := ad.Pairs[m]
		in, out := h.o.W[m+".weight"], h.o.W[m+".weight"]
		if m == "lm_head" && h.o.Tied {
			in, out = h.o.W["model.embed_tokens.weight"], h.o.W["model.embed_tokens.weight"]
		}
		require.NotNil(h.t, in, "the model has no %s", m)
		require.Equal(h.t, []int{int(lc.Rank), in.Cols()}, p.A.Shape, "%s lora_A shape", m)
		require.Equal(h.t, []int{out.Rows(), int(lc.Rank)}, p.B.Shape, "%s lora_B shape", m)
		amax, bmax := 0.0, 0.0
		for _, v := range p.A.Data {
			amax = math.Max(amax, math.Abs(v))
		}
		for _, v := range p.B.Data {
			bmax = math.Max(bmax, math.Abs(v))
		}
		require.Positive(h.t, amax, "%s lora_A is zero", m)
		require.Zero(h.t, bmax, "%s lora_B is not zero on a new adapter", m)
	}
}
