package oracle

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Config is the part of a Hugging Face config.json the oracle needs.
type Config struct {
	VocabSize         int             `json:"vocab_size"`
	HiddenSize        int             `json:"hidden_size"`
	NumLayers         int             `json:"num_hidden_layers"`
	NumHeads          int             `json:"num_attention_heads"`
	NumKVHeads        int             `json:"num_key_value_heads"`
	HeadDim           int             `json:"head_dim"`
	IntermediateSize  int             `json:"intermediate_size"`
	MaxPositions      int             `json:"max_position_embeddings"`
	RopeTheta         float64         `json:"rope_theta"`
	RMSNormEps        float64         `json:"rms_norm_eps"`
	TieWordEmbeddings bool            `json:"tie_word_embeddings"`
	HiddenAct         string          `json:"hidden_act"`
	RopeScaling       map[string]any  `json:"rope_scaling"`
	EOSTokenID        json.RawMessage `json:"eos_token_id"`
}

// Model is a base model held in float64.
type Model struct {
	Cfg Config
	// W holds every tensor of the checkpoint by its Hugging Face name.
	W map[string]*Tensor
	// EOS are the end-of-sequence ids of config.json and generation_config.json.
	EOS []int
	// Tied is true when the output projection is the embedding matrix.
	Tied bool

	invFreq []float64
}

// tokenIDs reads an eos_token_id field: a number, a list of numbers, or absent.
func tokenIDs(raw json.RawMessage) []int {
	if len(raw) == 0 {
		return nil
	}
	var one int
	if json.Unmarshal(raw, &one) == nil {
		return []int{one}
	}
	var many []int
	if json.Unmarshal(raw, &many) == nil {
		return many
	}
	return nil
}

// LoadModel reads a Hugging Face folder: config.json, every *.safetensors file and, when
// present, generation_config.json (for its eos_token_id).
func LoadModel(dir string) (*Model, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	m := &Model{W: map[string]*Tensor{}}
	if err := json.Unmarshal(b, &m.Cfg); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	c := &m.Cfg
	if c.NumKVHeads == 0 {
		c.NumKVHeads = c.NumHeads
	}
	if c.HeadDim == 0 {
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" {
		return nil, fmt.Errorf("hidden_act %q is not supported (only silu)", c.HiddenAct)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("%s has no *.safetensors", dir)
	}
	for _, f := range files {
		ts, _, err := ReadSafetensors(f)
		if err != nil {
			return nil, err
		}
		for k, v := range ts {
			m.W[k] = v
		}
	}
	if _, ok := m.W["model.embed_tokens.weight"]; !ok {
		return nil, fmt.Errorf("%s has no model.embed_tokens.weight", dir)
	}
	_, hasHead := m.W["lm_head.weight"]
	m.Tied = c.TieWordEmbeddings || !hasHead
	seen := map[int]bool{}
	add := func(ids []int) {
		for _, id := range ids {
			if id >= 0 && id < c.VocabSize && !seen[id] {
				seen[id] = true
				m.EOS = append(m.EOS, id)
			}
		}
	}
	add(tokenIDs(c.EOSTokenID))
	if gb, err := os.ReadFile(filepath.Join(dir, "generation_config.json")); err == nil {
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if json.Unmarshal(gb, &g) == nil {
			add(tokenIDs(g.EOS))
		}
	}
	m.invFreq = ropeInvFreq(c)
	return m, nil
}

// ropeInvFreq returns θ^(−2i/d) for i < d/2, adjusted by Llama 3 rope_scaling if present.
func ropeInvFreq(c *Config) []float64 {
	d := c.HeadDim
	f := make([]float64, d/2)
	for i := range f {
		f[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(d))
	}
	rs := c.RopeScaling
	if rs == nil {
		return f
	}
	typ, _ := rs["rope_type"].(string)
	if typ == "" {
		typ, _ = rs["type"].(string)
	}
	if typ != "llama3" {
		return f
	}
	num := func(k string) float64 { v, _ := rs[k].(float64); return v }
	factor, low, high, old := num("factor"), num("low_freq_factor"), num("high_freq_factor"), num("original_max_position_embeddings")
	lowWave, highWave := old/low, old/high
	for i, fr := range f {
		wave := 2 * math.Pi / fr
		switch {
		case wave < highWave:
		case wave > lowWave:
			f[i] = fr / factor
		default:
			s := (old/wave - low) / (high - low)
			f[i] = (1-s)*fr/factor + s*fr
		}
	}
	return f
}

// linear computes y = W·x + b + scale·B·(A·x) for every row x of xs. W is [out, in]; the
// bias and LoRA pair are optional.
func linear(xs [][]float64, w, bias *Tensor, lora *LoraPair, scale float64) [][]float64 {
	out, in := w.Rows(), w.Cols()
	ys := make([][]float64, len(xs))
	for t, x := range xs {
		if len(x) != in {
			panic(fmt.Sprintf("oracle: linear input has %d values, want %d", len(x), in))
		}
		y := make([]float64, out)
		for o := 0; o < out; o++ {
			row := w.Data[o*in : (o+1)*in]
			s := 0.0
			for i, v := range row {
				s += v * x[i]
			}
			y[o] = s
		}
		if bias != nil {
			for o := range y {
				y[o] += bias.Data[o]
			}
		}
		if lora != nil {
			r := lora.A.Rows()
			ax := make([]float64, r)
			for j := 0; j < r; j++ {
				row := lora.A.Data[j*in : (j+1)*in]
				s := 0.0
				for i, v := range row {
					s += v * x[i]
				}
				ax[j] = s
			}
			for o := 0; o < out; o++ {
				row := lora.B.Data[o*r : (o+1)*r]
				s := 0.0
				for j, v := range row {
					s += v * ax[j]
				}
				y[o] += scale * s
			}
		}
		ys[t] = y
	}
	return ys
}

// rmsNorm returns x / sqrt(mean(x²) + eps) · w.
func rmsNorm(x, w []float64, eps float64) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v * inv * w[i]
	}
	return y
}

// rope rotates one head vector in place at position pos (the "rotate half" layout of
// Hugging Face Llama/Qwen: pairs (i, i + d/2)).
func (m *Model) rope(v []float64, pos int) {
	h := len(v) / 2
	for i := 0; i < h; i++ {
		a := float64(pos) * m.invFreq[i]
		c, s := math.Cos(a), math.Sin(a)
		x, y := v[i], v[i+h]
		v[i] = x*c - y*s
		v[i+h] = y*c + x*s
	}
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

func (m *Model) weight(name string) *Tensor {
	w, ok := m.W[name]
	if !ok {
		panic("oracle: model has no tensor " + name)
	}
	return w
}

// Logits runs the decoder on tokens with an optional adapter and returns the
// next-token logits at every position ([N][vocab]).
func (m *Model) Logits(tokens []int, ad *Adapter) [][]float64 {
	head := m.weight("model.embed_tokens.weight")
	if !m.Tied {
		head = m.weight("lm_head.weight")
	}
	return linear(m.Hidden(tokens, ad), head, nil, ad.pair("lm_head"), ad.scale())
}

// Hidden runs the decoder on tokens with an optional adapter and returns the final hidden
// state at every position, after the model's final norm ([N][hidden]).
func (m *Model) Hidden(tokens []int, ad *Adapter) [][]float64 {
	c := m.Cfg
	n := len(tokens)
	emb := m.weight("model.embed_tokens.weight")
	hsz := c.HiddenSize
	x := make([][]float64, n)
	for t, tok := range tokens {
		if tok < 0 || tok >= emb.Rows() {
			panic(fmt.Sprintf("oracle: token %d outside the vocabulary", tok))
		}
		x[t] = append([]float64(nil), emb.Data[tok*hsz:(tok+1)*hsz]...)
		// a tied model's shared-matrix LoRA: row tok of scale·B·A joins the embedding
		if hp := ad.pair("lm_head"); hp != nil && m.Tied && ad.Cfg.EnsureWeightTying {
			r := hp.A.Rows()
			for d := range hsz {
				var s float64
				for k := range r {
					s += hp.B.Data[tok*r+k] * hp.A.Data[k*hsz+d]
				}
				x[t][d] += ad.scale() * s
			}
		}
	}
	lin := func(xs [][]float64, name string) [][]float64 {
		return linear(xs, m.weight(name+".weight"), m.W[name+".bias"], ad.pair(name), ad.scale())
	}
	hd, nh, nkv := c.HeadDim, c.NumHeads, c.NumKVHeads
	group := nh / nkv
	for l := 0; l < c.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		h := make([][]float64, n)
		for t := range x {
			h[t] = rmsNorm(x[t], m.weight(p+"input_layernorm.weight").Data, c.RMSNormEps)
		}
		q := lin(h, p+"self_attn.q_proj")
		k := lin(h, p+"self_attn.k_proj")
		v := lin(h, p+"self_attn.v_proj")
		qn, kn := m.W[p+"self_attn.q_norm.weight"], m.W[p+"self_attn.k_norm.weight"]
		for t := 0; t < n; t++ {
			for hh := 0; hh < nh; hh++ {
				seg := q[t][hh*hd : (hh+1)*hd]
				if qn != nil {
					copy(seg, rmsNorm(seg, qn.Data, c.RMSNormEps))
				}
				m.rope(seg, t)
			}
			for hh := 0; hh < nkv; hh++ {
				seg := k[t][hh*hd : (hh+1)*hd]
				if kn != nil {
					copy(seg, rmsNorm(seg, kn.Data, c.RMSNormEps))
				}
				m.rope(seg, t)
			}
		}
		att := make([][]float64, n)
		for t := 0; t < n; t++ {
			o := make([]float64, nh*hd)
			for hh := 0; hh < nh; hh++ {
				kvh := hh / group
				qv := q[t][hh*hd : (hh+1)*hd]
				scores := make([]float64, t+1)
				mx := math.Inf(-1)
				for s := 0; s <= t; s++ {
					kv := k[s][kvh*hd : (kvh+1)*hd]
					d := 0.0
					for i := range qv {
						d += qv[i] * kv[i]
					}
					scores[s] = d / math.Sqrt(float64(hd))
					mx = math.Max(mx, scores[s])
				}
				z := 0.0
				for s := range scores {
					scores[s] = math.Exp(scores[s] - mx)
					z += scores[s]
				}
				for s := range scores {
					vv := v[s][kvh*hd : (kvh+1)*hd]
					w := scores[s] / z
					for i := range vv {
						o[hh*hd+i] += w * vv[i]
					}
				}
			}
			att[t] = o
		}
		ao := lin(att, p+"self_attn.o_proj")
		for t := range x {
			for i := range x[t] {
				x[t][i] += ao[t][i]
			}
			h[t] = rmsNorm(x[t], m.weight(p+"post_attention_layernorm.weight").Data, c.RMSNormEps)
		}
		g := lin(h, p+"mlp.gate_proj")
		u := lin(h, p+"mlp.up_proj")
		for t := range g {
			for i := range g[t] {
				g[t][i] = silu(g[t][i]) * u[t][i]
			}
		}
		d := lin(g, p+"mlp.down_proj")
		for t := range x {
			for i := range x[t] {
				x[t][i] += d[t][i]
			}
		}
	}
	for t := range x {
		x[t] = rmsNorm(x[t], m.weight("model.norm.weight").Data, c.RMSNormEps)
	}
	return x
}

// MeanHidden is the mean over tokens of Hidden: the embedding of SampleRequest.embed.
func (m *Model) MeanHidden(tokens []int, ad *Adapter) []float64 {
	h := m.Hidden(tokens, ad)
	out := make([]float64, m.Cfg.HiddenSize)
	for _, row := range h {
		for i, v := range row {
			out[i] += v / float64(len(h))
		}
	}
	return out
}

// LogSoftmax returns log softmax(z / temperature).
func LogSoftmax(z []float64, temperature float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range z {
		mx = math.Max(mx, v/temperature)
	}
	s := 0.0
	for _, v := range z {
		s += math.Exp(v/temperature - mx)
	}
	lse := mx + math.Log(s)
	out := make([]float64, len(z))
	for i, v := range z {
		out[i] = v/temperature - lse
	}
	return out
}

// LogProbs returns, for each position i, log p(targets[i] | tokens[:i+1]) at temperature 1.
// targets has len(tokens)·k entries, row-major (N, k).
func (m *Model) LogProbs(tokens []int, ad *Adapter, targets []int, k int) []float64 {
	logits := m.Logits(tokens, ad)
	out := make([]float64, len(targets))
	for i := range logits {
		ls := LogSoftmax(logits[i], 1)
		for j := 0; j < k; j++ {
			out[i*k+j] = ls[targets[i*k+j]]
		}
	}
	return out
}

// IsEOS says whether tok is one of the model's end-of-sequence ids.
func (m *Model) IsEOS(tok int) bool {
	for _, e := range m.EOS {
		if e == tok {
			return true
		}
	}
	return false
}

// String describes the model's shape.
func (m *Model) String() string {
	c := m.Cfg
	return strings.Join([]string{
		fmt.Sprintf("vocab=%d hidden=%d layers=%d heads=%d/%d head_dim=%d mlp=%d", c.VocabSize, c.HiddenSize, c.NumLayers, c.NumHeads, c.NumKVHeads, c.HeadDim, c.IntermediateSize),
		fmt.Sprintf("theta=%g eps=%g tied=%v", c.RopeTheta, c.RMSNormEps, m.Tied),
	}, " ")
}
