package nn

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
)

// gemma3Type is Gemma 3's text model_type (transformers' Gemma3ForCausalLM), computed as
// transformers 5.24 does: embeddings scaled by √hidden in the model's dtype, RMSNorms
// with weight 1+w (folded into the stored weight at load), q/k norms, attention scaled
// by query_pre_attn_scalar^-½, sliding-window layers (keys j > i − sliding_window) with
// their own RoPE base, global layers, a gelu_pytorch_tanh-gated MLP, norms after the
// attention and the MLP, tied embeddings.
const gemma3Type = "gemma3_text"

// gemmaShape is what normalizeGemma3 derives from a Gemma 3 config.
type gemmaShape struct {
	on          bool
	sliding     []bool  // per layer: a sliding-window layer
	window      int     // sliding_window
	localTheta  float64 // the sliding layers' RoPE base
	localFactor float64 // their linear RoPE scaling factor (1 = none)
	factor      float64 // the global layers' linear RoPE scaling factor (1 = none)
	attnScale   float64 // query_pre_attn_scalar^-½
	embedScale  float64 // √hidden
}

// ropeParam is one entry of transformers 5's rope_parameters.
type ropeParam struct {
	Type   string  `json:"rope_type"`
	Theta  float64 `json:"rope_theta"`
	Factor float64 `json:"factor"`
}

// normalizeGemma3 checks a gemma3_text config and derives gemmaShape; anything the
// engine does not compute exactly is refused.
func (c *Config) normalizeGemma3() error {
	g := gemmaShape{on: true, window: c.SlidingWindow, factor: 1, localFactor: 1}
	if act := c.HiddenActivation; act != "" && act != "gelu_pytorch_tanh" {
		return fmt.Errorf("gemma3: hidden_activation %q is not supported (only gelu_pytorch_tanh)", act)
	}
	if c.HiddenAct != "" && c.HiddenAct != "gelu_pytorch_tanh" && c.HiddenActivation == "" {
		return fmt.Errorf("gemma3: hidden_act %q is not supported (only gelu_pytorch_tanh)", c.HiddenAct)
	}
	if c.FinalSoftcap != nil || c.AttnSoftcap != nil {
		return fmt.Errorf("gemma3: final_logit_softcapping and attn_logit_softcapping are not computed by the reference engine; " +
			"set them to null (Gemma 3 checkpoints do) or use --backend torch")
	}
	if c.Bidirectional {
		return fmt.Errorf("gemma3: use_bidirectional_attention is not served (causal language models only)")
	}
	scalar := c.QueryPreAttnScalar
	if scalar == 0 {
		scalar = 256
	}
	if !(scalar > 0) {
		return fmt.Errorf("gemma3: query_pre_attn_scalar %v must be positive", c.QueryPreAttnScalar)
	}
	g.attnScale = math.Pow(scalar, -0.5)
	g.embedScale = math.Sqrt(float64(c.Hidden))
	types := c.LayerTypes
	if types == nil {
		pat := c.SlidingWindowPattern
		if pat == 0 {
			pat = 6
		}
		for i := range c.Layers {
			t := "full_attention"
			if (i+1)%pat != 0 {
				t = "sliding_attention"
			}
			types = append(types, t)
		}
	}
	if len(types) != c.Layers {
		return fmt.Errorf("gemma3: layer_types has %d entries for %d layers", len(types), c.Layers)
	}
	g.sliding = make([]bool, c.Layers)
	for i, t := range types {
		switch t {
		case "sliding_attention":
			g.sliding[i] = true
		case "full_attention":
		default:
			return fmt.Errorf("gemma3: layer_types[%d] %q is not served (sliding_attention or full_attention)", i, t)
		}
	}
	if g.window <= 0 {
		g.window = 4096 // Gemma3TextConfig's default
	}
	// RoPE: transformers 5 writes rope_parameters per layer type; older configs have
	// rope_theta, rope_local_base_freq and rope_scaling (for the global layers).
	global := ropeParam{Type: "default", Theta: c.RopeTheta, Factor: 1}
	local := ropeParam{Type: "default", Theta: c.RopeLocalBaseFreq, Factor: 1}
	if global.Theta == 0 {
		global.Theta = 1e6
	}
	if local.Theta == 0 {
		local.Theta = 1e4
	}
	if rs := c.RopeScaling; rs != nil {
		global.Type, global.Factor = rs.Type, rs.Factor
		if global.Type == "" {
			global.Type = rs.LegacyTypeField
		}
	}
	for key, dst := range map[string]*ropeParam{"full_attention": &global, "sliding_attention": &local} {
		raw, ok := c.RopeParameters[key]
		if !ok {
			continue
		}
		p := ropeParam{Type: "default"}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("gemma3: rope_parameters.%s: %w", key, err)
		}
		if p.Theta == 0 {
			p.Theta = dst.Theta
		}
		*dst = p
	}
	for key, p := range map[string]*ropeParam{"full_attention": &global, "sliding_attention": &local} {
		switch p.Type {
		case "", "default":
			p.Factor = 1
		case "linear":
			if !(p.Factor >= 1) {
				return fmt.Errorf("gemma3: rope_parameters.%s: linear factor %v must be at least 1", key, p.Factor)
			}
		default:
			return fmt.Errorf("gemma3: rope type %q (%s layers) is not served by the reference engine (default or linear); use --backend torch", p.Type, key)
		}
	}
	c.RopeTheta, g.factor = global.Theta, global.Factor
	g.localTheta, g.localFactor = local.Theta, local.Factor
	c.RopeScaling = nil // folded into g.factor
	c.gemma = g
	return nil
}

// attnScale is the attention's score scale.
func (c *Config) attnScale() float64 {
	if c.gemma.on {
		return c.gemma.attnScale
	}
	return 1 / math.Sqrt(float64(c.HeadDim))
}

// window is the sliding window of layer l (0: the layer attends to every earlier key).
func (c *Config) window(l int) int {
	if c.gemma.on && c.gemma.sliding[l] {
		return c.gemma.window
	}
	return 0
}

// firstKey is the first key row query position p of layer l attends to.
func (c *Config) firstKey(l, p int) int {
	if w := c.window(l); w > 0 {
		return max(0, p-w+1)
	}
	return 0
}

// ropeOf returns layer l's rotary tables.
func (m *Model[T]) ropeOf(l int) (cos, sin []T) {
	if m.cosL != nil && m.Cfg.gemma.sliding[l] {
		return m.cosL, m.sinL
	}
	return m.cos, m.sin
}

// scaleEmbeddings multiplies n embedding rows by Gemma's √hidden, rounded to T first as
// transformers rounds it to the weight's dtype (a no-op for other families).
func (m *Model[T]) scaleEmbeddings(x []T, n int) {
	if !m.Cfg.gemma.on {
		return
	}
	s := T(m.Cfg.gemma.embedScale)
	for i := range x[:n*m.Cfg.Hidden] {
		x[i] *= s
	}
}

// foldNorm turns a Gemma RMSNorm weight w into the 1+w the engine multiplies by (in
// float64, rounded once: transformers' float32 1.0 + w is the same number).
func foldNorm[T Float](w []T) []T {
	for i, v := range w {
		w[i] = T(1 + float64(v))
	}
	return w
}

// unfoldNorm is foldNorm's inverse, for writing a model's tensors.
func unfoldNorm[T Float](w []T) []T {
	out := make([]T, len(w))
	for i, v := range w {
		out[i] = T(float64(v) - 1)
	}
	return out
}

// geluTanh is gelu_pytorch_tanh: ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
func geluTanh(x float64) (y, dy float64) {
	const k = 0.7978845608028654 // √(2/π)
	u := k * (x + 0.044715*x*x*x)
	t := math.Tanh(u)
	y = 0.5 * x * (1 + t)
	dy = 0.5*(1+t) + 0.5*x*(1-t*t)*k*(1+3*0.044715*x*x)
	return y, dy
}

// mlpAct computes out = act(g)·u: silu for the Qwen/Llama families, gelu_pytorch_tanh
// for Gemma 3.
func (m *Model[T]) mlpAct(g, u, out []T) {
	if !m.Cfg.gemma.on {
		swiglu(g, u, out)
		return
	}
	n := len(g)
	runPooled(&gegluTasks, (n+elementwiseChunk-1)/elementwiseChunk, n*expWork,
		gegluTask[T]{g: g, u: u[:n], out: out[:n]})
}

// mlpActBwd computes dg and du from d(out) for mlpAct.
func (m *Model[T]) mlpActBwd(g, u, dout, dg, du []T) {
	if !m.Cfg.gemma.on {
		swigluBwd(g, u, dout, dg, du)
		return
	}
	n := len(g)
	runPooled(&gegluTasks, (n+elementwiseChunk-1)/elementwiseChunk, n*expWork,
		gegluTask[T]{g: g, u: u[:n], dout: dout[:n], dg: dg[:n], du: du[:n]})
}

// gegluTask is one geglu forward (out set) or backward (dg set) call over chunks.
type gegluTask[T Float] struct{ g, u, out, dout, dg, du []T }

var gegluTasks sync.Pool

func (t *gegluTask[T]) do(c int) {
	i0, i1 := c*elementwiseChunk, min((c+1)*elementwiseChunk, len(t.g))
	for i := i0; i < i1; i++ {
		y, dy := geluTanh(float64(t.g[i]))
		if t.dg == nil {
			t.out[i] = T(y * float64(t.u[i]))
			continue
		}
		d := float64(t.dout[i])
		t.du[i] = T(d * y)
		t.dg[i] = T(d * float64(t.u[i]) * dy)
	}
}
