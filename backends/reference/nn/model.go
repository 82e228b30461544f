package nn

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/loops-dev/loops/backends/reference/safetensors"
)

// MaxSeqCap caps the sequence length the engine serves, whatever a model's config says,
// so that RoPE tables stay small.
const MaxSeqCap = 32768

// RopeScaling is Llama 3's rope_scaling block (rope_type "llama3").
type RopeScaling struct {
	Type            string  `json:"rope_type"`
	Factor          float64 `json:"factor"`
	LowFreqFactor   float64 `json:"low_freq_factor"`
	HighFreqFactor  float64 `json:"high_freq_factor"`
	OriginalMaxPos  float64 `json:"original_max_position_embeddings"`
	LegacyTypeField string  `json:"type"`
}

// Config is the subset of a Hugging Face config.json the engine needs.
type Config struct {
	Architectures []string     `json:"architectures"`
	ModelType     string       `json:"model_type"`
	Vocab         int          `json:"vocab_size"`
	Hidden        int          `json:"hidden_size"`
	Layers        int          `json:"num_hidden_layers"`
	Heads         int          `json:"num_attention_heads"`
	KVHeads       int          `json:"num_key_value_heads"`
	HeadDim       int          `json:"head_dim"`
	Inter         int          `json:"intermediate_size"`
	MaxPos        int          `json:"max_position_embeddings"`
	RopeTheta     float64      `json:"rope_theta"`
	Eps           float64      `json:"rms_norm_eps"`
	Tied          bool         `json:"tie_word_embeddings"`
	RopeScaling   *RopeScaling `json:"rope_scaling,omitempty"`
	HiddenAct     string       `json:"hidden_act"`
	EOS           any          `json:"eos_token_id,omitempty"`
	BOS           any          `json:"bos_token_id,omitempty"`
	TorchDType    string       `json:"torch_dtype,omitempty"`

	// Gemma 3 (model_type gemma3_text; gemma3.go): the fields below are read for it only.
	HiddenActivation     string                     `json:"hidden_activation,omitempty"`
	QueryPreAttnScalar   float64                    `json:"query_pre_attn_scalar,omitempty"`
	SlidingWindow        int                        `json:"sliding_window,omitempty"`
	SlidingWindowPattern int                        `json:"sliding_window_pattern,omitempty"`
	LayerTypes           []string                   `json:"layer_types,omitempty"`
	RopeLocalBaseFreq    float64                    `json:"rope_local_base_freq,omitempty"`
	RopeParameters       map[string]json.RawMessage `json:"rope_parameters,omitempty"`
	FinalSoftcap         *float64                   `json:"final_logit_softcapping,omitempty"`
	AttnSoftcap          *float64                   `json:"attn_logit_softcapping,omitempty"`
	Bidirectional        bool                       `json:"use_bidirectional_attention,omitempty"`

	// Qwen3-MoE (model_type qwen3_moe; moe.go): the fields below are read for it only.
	NumExperts         int     `json:"num_experts,omitempty"`
	NumLocalExperts    int     `json:"num_local_experts,omitempty"` // transformers 5 writes num_experts under this name
	TopK               int     `json:"num_experts_per_tok,omitempty"`
	MoEInter           int     `json:"moe_intermediate_size,omitempty"`
	NormTopK           bool    `json:"norm_topk_prob,omitempty"`
	SparseStep         int     `json:"decoder_sparse_step,omitempty"`
	MLPOnlyLayers      []int   `json:"mlp_only_layers,omitempty"`
	RouterAuxCoef      float64 `json:"router_aux_loss_coef,omitempty"`
	OutputRouterLogits bool    `json:"output_router_logits,omitempty"`
	UseSlidingWindow   bool    `json:"use_sliding_window,omitempty"`

	gemma gemmaShape // derived by normalize for gemma3_text
	moe   moeShape   // derived by normalize for qwen3_moe
}

// EOSIds returns the end-of-sequence token ids of the config (eos_token_id may be a number
// or a list).
func (c *Config) EOSIds() []int {
	switch v := c.EOS.(type) {
	case float64:
		return []int{int(v)}
	case []any:
		var out []int
		for _, x := range v {
			if f, ok := x.(float64); ok {
				out = append(out, int(f))
			}
		}
		return out
	case int:
		return []int{v}
	case []int:
		return v
	}
	return nil
}

// MaxSeq is the longest sequence (prompt plus completion) the engine accepts.
func (c *Config) MaxSeq() int {
	if c.MaxPos <= 0 || c.MaxPos > MaxSeqCap {
		return MaxSeqCap
	}
	return c.MaxPos
}

func (c *Config) normalize() error {
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.ModelType == gemma3Type {
		c.HeadDim = 256 // Gemma3TextConfig's default
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.ModelType != gemma3Type {
		if err := c.normalizeRope(); err != nil {
			return err
		}
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.Eps == 0 {
		c.Eps = 1e-6
	}
	if c.Vocab <= 0 || c.Hidden <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.Inter <= 0 || c.HeadDim <= 0 || c.HeadDim%2 != 0 {
		return fmt.Errorf("config.json is missing or has invalid sizes (vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, head_dim)")
	}
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	}
	if c.ModelType == gemma3Type {
		return c.normalizeGemma3()
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" {
		return fmt.Errorf("hidden_act %q is not supported (only silu)", c.HiddenAct)
	}
	if c.ModelType == qwen3MoeType {
		return c.normalizeMoE()
	}
	return nil
}

// normalizeRope reads the rotary embedding of a dense family's config: transformers 5
// writes it as rope_parameters ({"rope_theta": …, "rope_type": "default" or "llama3", and
// Llama 3's factors}), older configs as rope_theta and rope_scaling. Both forms are read
// (they must agree when both are given); a rope type the engine does not compute (yarn,
// linear, dynamic, longrope, …) is refused rather than served with other positions.
func (c *Config) normalizeRope() error {
	if len(c.RopeParameters) > 0 {
		raw, err := json.Marshal(c.RopeParameters)
		if err != nil {
			return fmt.Errorf("rope_parameters: %w", err)
		}
		var p struct {
			RopeScaling
			Theta float64 `json:"rope_theta"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("rope_parameters: %w", err)
		}
		if p.Theta < 0 || math.IsNaN(p.Theta) || math.IsInf(p.Theta, 0) {
			return fmt.Errorf("rope_parameters.rope_theta %v is not a positive number", p.Theta)
		}
		if p.Theta > 0 {
			if c.RopeTheta != 0 && c.RopeTheta != p.Theta {
				return fmt.Errorf("rope_theta %v and rope_parameters.rope_theta %v disagree", c.RopeTheta, p.Theta)
			}
			c.RopeTheta = p.Theta
		}
		if t := p.ropeType(); t != "" && t != "default" {
			if c.RopeScaling != nil && c.RopeScaling.ropeType() != t {
				return fmt.Errorf("rope_scaling type %q and rope_parameters.rope_type %q disagree", c.RopeScaling.ropeType(), t)
			}
			rs := p.RopeScaling
			c.RopeScaling = &rs
		}
	}
	if rs := c.RopeScaling; rs != nil {
		switch rs.ropeType() {
		case "", "default":
			c.RopeScaling = nil
		case "llama3":
			if !(rs.Factor >= 1) || !(rs.LowFreqFactor > 0) || !(rs.HighFreqFactor > rs.LowFreqFactor) || !(rs.OriginalMaxPos > 0) {
				return fmt.Errorf("rope scaling llama3 needs factor >= 1, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0")
			}
		default:
			return fmt.Errorf("rope scaling type %q is not computed by the reference engine (it computes default and llama3 RoPE); start loops serve with --backend torch", rs.ropeType())
		}
	}
	return nil
}

// ropeType is the scaling's type, from rope_type or the legacy type field.
func (rs *RopeScaling) ropeType() string {
	if rs.Type != "" {
		return rs.Type
	}
	return rs.LegacyTypeField
}

// Arch names the architecture for ModelInfo.
func (c *Config) Arch() string {
	if len(c.Architectures) > 0 {
		return c.Architectures[0]
	}
	return c.ModelType
}

// Linear is a frozen dense layer y = x·Wᵀ + b with W of shape [Out, In].
type Linear[T Float] struct {
	W []T
	// W16, when not nil, holds the weight as bfloat16 halves instead of W (which is then
	// nil): see HoldBF16. Only float32 models hold it.
	W16     []uint16
	B       []T // optional bias
	Out, In int
}

// Layer is one decoder block.
type Layer[T Float] struct {
	AttnNorm, MLPNorm []T
	QNorm, KNorm      []T // Qwen3 per-head RMSNorm; nil for Llama/Qwen2
	// PostAttnNorm and PostMLPNorm normalise the attention and MLP outputs before their
	// residual sums (Gemma 3; nil otherwise). MLPNorm is then pre_feedforward_layernorm.
	PostAttnNorm, PostMLPNorm []T
	Lin                       [NumLayerTargets]Linear[T]
	// MoE is the layer's sparse MoE block (Qwen3-MoE), which replaces the MLP: Lin's
	// gate, up and down are then empty. nil for a dense layer.
	MoE *MoE[T]
}

// Target indexes the LoRA-able linear layers of a block.
type Target int

// The LoRA targets of a block, in PEFT naming order.
const (
	TQ Target = iota
	TK
	TV
	TO
	TGate
	TUp
	TDown
	NumLayerTargets
)

// TargetNames are the PEFT module names of the block targets.
var TargetNames = [NumLayerTargets]string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

func targetPrefix(t Target) string {
	if t <= TO {
		return "self_attn."
	}
	return "mlp."
}

// Model is a dense decoder (Qwen3, Qwen2, Llama) with frozen weights in T.
type Model[T Float] struct {
	Cfg    Config
	Embed  []T // [Vocab, Hidden]
	Layers []Layer[T]
	Norm   []T
	Head   Linear[T] // W aliases Embed when tied
	cos    []T       // [maxSeq, HeadDim/2]
	sin    []T
	// cosL, sinL are the sliding-window layers' rotary tables (Gemma 3's local base
	// frequency); nil when every layer uses cos and sin.
	cosL, sinL []T
	// CheckpointRows is the number of rows from which a training pass checkpoints its
	// layers (recomputes each layer's activations in the backward pass instead of keeping
	// them all): 0 means DefaultCheckpointRows, a negative number never. Losses and
	// gradients are the same bits either way.
	CheckpointRows int
	// packs holds the weights packed for decoding (packed.go), built at the first
	// decoding step: the weights must not change after construction.
	packs *weightPacks
}

// QDim is the width of the query projection.
func (m *Model[T]) QDim() int { return m.Cfg.Heads * m.Cfg.HeadDim }

// KVDim is the width of the key and value projections.
func (m *Model[T]) KVDim() int { return m.Cfg.KVHeads * m.Cfg.HeadDim }

// InitRope builds the rotary tables (with Llama 3 frequency scaling when configured; with
// Gemma 3's per-layer-type bases and linear scaling).
func (m *Model[T]) InitRope() {
	c := &m.Cfg
	half := c.HeadDim / 2
	inv := make([]float64, half)
	for j := range inv {
		inv[j] = 1 / math.Pow(c.RopeTheta, float64(2*j)/float64(c.HeadDim))
	}
	if rs := c.RopeScaling; rs != nil && rs.ropeType() == "llama3" {
		lowW := rs.OriginalMaxPos / rs.LowFreqFactor
		highW := rs.OriginalMaxPos / rs.HighFreqFactor
		for j, f := range inv {
			wl := 2 * math.Pi / f
			switch {
			case wl < highW:
			case wl > lowW:
				inv[j] = f / rs.Factor
			default:
				s := (rs.OriginalMaxPos/wl - rs.LowFreqFactor) / (rs.HighFreqFactor - rs.LowFreqFactor)
				inv[j] = (1-s)*f/rs.Factor + s*f
			}
		}
	}
	if g := &c.gemma; g.on {
		for j := range inv {
			inv[j] /= g.factor
		}
		local := make([]float64, half)
		for j := range local {
			local[j] = 1 / math.Pow(g.localTheta, float64(2*j)/float64(c.HeadDim)) / g.localFactor
		}
		m.cosL, m.sinL = ropeTables[T](local, c.MaxSeq())
	}
	m.cos, m.sin = ropeTables[T](inv, c.MaxSeq())
}

// ropeTables returns the cos and sin tables of n positions for inverse frequencies inv.
func ropeTables[T Float](inv []float64, n int) (cos, sin []T) {
	half := len(inv)
	cos, sin = make([]T, n*half), make([]T, n*half)
	for p := 0; p < n; p++ {
		for j := 0; j < half; j++ {
			a := float64(p) * inv[j]
			cos[p*half+j] = T(math.Cos(a))
			sin[p*half+j] = T(math.Sin(a))
		}
	}
	return cos, sin
}

// LoraParamsPerRank is the LoRA parameters of an adapter on every target per unit of rank:
// Σ in + out over the layers' targets and lm_head (replicaplan's LoRA term).
func (m *Model[T]) LoraParamsPerRank() int {
	n := m.Cfg.Hidden + m.Cfg.Vocab // lm_head
	for _, l := range m.Layers {
		for t, li := range l.Lin {
			if Target(t) > TO && m.Cfg.moe.on {
				continue // a MoE model's MLP LoRA is its experts' (NewAdapter): dense MLP layers are not adapted
			}
			n += li.In + li.Out
		}
		if l.MoE != nil { // rank r per expert on each expert target (ExpertLoRA)
			for _, e := range [][]Linear[T]{l.MoE.GateUp, l.MoE.Down} {
				for _, li := range e {
					n += li.In + li.Out
				}
			}
		}
	}
	return n
}

// LogitsChunk is the number of logits the loss head computes at a time (headChunk rows).
func (m *Model[T]) LogitsChunk() int { return headChunk * m.Cfg.Vocab }

// ParamCount returns the number of base parameters.
func (m *Model[T]) ParamCount() int {
	n := len(m.Embed) + len(m.Norm)
	for _, l := range m.Layers {
		n += len(l.AttnNorm) + len(l.MLPNorm) + len(l.QNorm) + len(l.KNorm) + len(l.PostAttnNorm) + len(l.PostMLPNorm)
		for _, li := range l.Lin {
			n += li.size() + len(li.B)
		}
		if l.MoE != nil {
			n += l.MoE.paramCount()
		}
	}
	if !m.Cfg.Tied {
		n += len(m.Head.W)
	}
	return n
}

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (Config, error) {
	var c Config
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	if err := CheckFamily(c.ModelType); err != nil {
		return c, err
	}
	return c, c.normalize()
}

// readTensor reads a tensor as T: a float32 model's straight into float32 (no float64
// copy of the tensor at load), with the bits of T of the float64 read.
func readTensor[T Float](f *safetensors.File, name string) ([]T, []int64, error) {
	if _, ok := any([]T(nil)).([]float32); ok {
		d, s, err := f.ReadFloat32(name)
		return any(d).([]T), s, err
	}
	d, s, err := f.ReadFloat64(name)
	if err != nil {
		return nil, nil, err
	}
	if out, ok := any(d).([]T); ok {
		return out, s, nil
	}
	out := make([]T, len(d))
	for i, v := range d {
		out[i] = T(v)
	}
	return out, s, nil
}

// Load reads a Hugging Face model folder: config.json and every *.safetensors file in it.
func Load[T Float](dir string) (*Model[T], error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("%s holds no .safetensors files", dir)
	}
	where := map[string]*safetensors.File{}
	for _, p := range files {
		f, err := safetensors.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		for name := range f.Tensors {
			where[name] = f
		}
	}
	get := func(name string, shape ...int) ([]T, error) {
		f, ok := where[name]
		if !ok {
			return nil, fmt.Errorf("tensor %s not found in %s", name, dir)
		}
		out, s, err := readTensor[T](f, name)
		if err != nil {
			return nil, err
		}
		if len(shape) > 0 {
			want := 1
			for _, x := range shape {
				want *= x
			}
			if len(out) != want {
				return nil, fmt.Errorf("tensor %s has shape %v, want %v", name, s, shape)
			}
		}
		return out, nil
	}
	has := func(name string) bool { _, ok := where[name]; return ok }
	m := &Model[T]{Cfg: cfg}
	c := &m.Cfg
	if m.Embed, err = get("model.embed_tokens.weight", c.Vocab, c.Hidden); err != nil {
		return nil, err
	}
	if m.Norm, err = get("model.norm.weight", c.Hidden); err != nil {
		return nil, err
	}
	if !has("lm_head.weight") {
		c.Tied = true
	}
	if c.Tied {
		m.Head = Linear[T]{W: m.Embed, Out: c.Vocab, In: c.Hidden}
	} else {
		w, err := get("lm_head.weight", c.Vocab, c.Hidden)
		if err != nil {
			return nil, err
		}
		m.Head = Linear[T]{W: w, Out: c.Vocab, In: c.Hidden}
	}
	dims := [NumLayerTargets][2]int{
		{m.QDim(), c.Hidden}, {m.KVDim(), c.Hidden}, {m.KVDim(), c.Hidden}, {c.Hidden, m.QDim()},
		{c.Inter, c.Hidden}, {c.Inter, c.Hidden}, {c.Hidden, c.Inter},
	}
	m.Layers = make([]Layer[T], c.Layers)
	for i := range m.Layers {
		L := &m.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		if L.AttnNorm, err = get(p+"input_layernorm.weight", c.Hidden); err != nil {
			return nil, err
		}
		if c.gemma.on {
			if L.PostAttnNorm, err = get(p+"post_attention_layernorm.weight", c.Hidden); err != nil {
				return nil, err
			}
			if L.MLPNorm, err = get(p+"pre_feedforward_layernorm.weight", c.Hidden); err != nil {
				return nil, err
			}
			if L.PostMLPNorm, err = get(p+"post_feedforward_layernorm.weight", c.Hidden); err != nil {
				return nil, err
			}
		} else if L.MLPNorm, err = get(p+"post_attention_layernorm.weight", c.Hidden); err != nil {
			return nil, err
		}
		if has(p+"self_attn.q_norm.weight") || c.gemma.on {
			if L.QNorm, err = get(p+"self_attn.q_norm.weight", c.HeadDim); err != nil {
				return nil, err
			}
			if L.KNorm, err = get(p+"self_attn.k_norm.weight", c.HeadDim); err != nil {
				return nil, err
			}
		}
		if c.gemma.on {
			for _, w := range [][]T{L.AttnNorm, L.PostAttnNorm, L.MLPNorm, L.PostMLPNorm, L.QNorm, L.KNorm} {
				foldNorm(w)
			}
		}
		nt := NumLayerTargets
		if c.sparseLayer(i) {
			if L.MoE, err = loadMoE(c, p, get, has); err != nil {
				return nil, err
			}
			nt = TGate // the MoE block replaces the MLP
		}
		for t := Target(0); t < nt; t++ {
			name := p + targetPrefix(t) + TargetNames[t]
			out, in := dims[t][0], dims[t][1]
			w, err := get(name+".weight", out, in)
			if err != nil {
				return nil, err
			}
			li := Linear[T]{W: w, Out: out, In: in}
			if LoadBF16 && where[name+".weight"].Tensors[name+".weight"].DType == "BF16" {
				holdLinear(&li)
			}
			if has(name + ".bias") {
				if li.B, err = get(name+".bias", out); err != nil {
					return nil, err
				}
			}
			L.Lin[t] = li
		}
	}
	if c.gemma.on {
		foldNorm(m.Norm)
	}
	m.InitRope()
	m.packs = new(weightPacks)
	return m, nil
}

// Tensors lists the HF tensor names and values of a model (for writing checkpoints of
// generated models).
func (m *Model[T]) Tensors() []safetensors.Tensor {
	conv := func(x []T) []float32 {
		o := make([]float32, len(x))
		for i, v := range x {
			o[i] = float32(v)
		}
		return o
	}
	c := m.Cfg
	var ts []safetensors.Tensor
	add := func(name string, d []T, shape ...int64) {
		ts = append(ts, safetensors.Tensor{Name: name, Shape: shape, Data: conv(d)})
	}
	add("model.embed_tokens.weight", m.Embed, int64(c.Vocab), int64(c.Hidden))
	norm := func(w []T) []T { return w }
	if c.gemma.on {
		norm = unfoldNorm[T]
	}
	add("model.norm.weight", norm(m.Norm), int64(c.Hidden))
	if !c.Tied {
		add("lm_head.weight", m.Head.W, int64(c.Vocab), int64(c.Hidden))
	}
	for i, L := range m.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", norm(L.AttnNorm), int64(c.Hidden))
		if c.gemma.on {
			add(p+"post_attention_layernorm.weight", norm(L.PostAttnNorm), int64(c.Hidden))
			add(p+"pre_feedforward_layernorm.weight", norm(L.MLPNorm), int64(c.Hidden))
			add(p+"post_feedforward_layernorm.weight", norm(L.PostMLPNorm), int64(c.Hidden))
		} else {
			add(p+"post_attention_layernorm.weight", L.MLPNorm, int64(c.Hidden))
		}
		if L.QNorm != nil {
			add(p+"self_attn.q_norm.weight", norm(L.QNorm), int64(c.HeadDim))
			add(p+"self_attn.k_norm.weight", norm(L.KNorm), int64(c.HeadDim))
		}
		if L.MoE != nil {
			L.MoE.tensors(p, add)
		}
		for t, li := range L.Lin {
			if li.size() == 0 {
				continue // a MoE layer's MLP
			}
			name := p + targetPrefix(Target(t)) + TargetNames[t]
			add(name+".weight", li.Weights(), int64(li.Out), int64(li.In))
			if li.B != nil {
				add(name+".bias", li.B, int64(li.Out))
			}
		}
	}
	return ts
}

// RandomOptions shape a randomly initialised model.
type RandomOptions struct {
	QKNorm   bool // Qwen3-style per-head q/k norms
	AttnBias bool // Qwen2-style q/k/v biases
	Std      float64
	Seed     uint64
}

// NewRandom builds a model with normal(0, Std) weights and unit norms from a fixed seed.
func NewRandom[T Float](cfg Config, o RandomOptions) (*Model[T], error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if o.Std == 0 {
		o.Std = 0.02
	}
	r := newRNG(o.Seed)
	randn := func(n int, std float64) []T {
		x := make([]T, n)
		for i := range x {
			x[i] = T(r.NormFloat64() * std)
		}
		return x
	}
	ones := func(n int) []T {
		x := make([]T, n)
		for i := range x {
			x[i] = 1
		}
		return x
	}
	m := &Model[T]{Cfg: cfg}
	c := &m.Cfg
	m.Embed = randn(c.Vocab*c.Hidden, o.Std)
	m.Norm = ones(c.Hidden)
	if c.Tied {
		m.Head = Linear[T]{W: m.Embed, Out: c.Vocab, In: c.Hidden}
	} else {
		m.Head = Linear[T]{W: randn(c.Vocab*c.Hidden, o.Std), Out: c.Vocab, In: c.Hidden}
	}
	dims := [NumLayerTargets][2]int{
		{m.QDim(), c.Hidden}, {m.KVDim(), c.Hidden}, {m.KVDim(), c.Hidden}, {c.Hidden, m.QDim()},
		{c.Inter, c.Hidden}, {c.Inter, c.Hidden}, {c.Hidden, c.Inter},
	}
	m.Layers = make([]Layer[T], c.Layers)
	for i := range m.Layers {
		L := &m.Layers[i]
		L.AttnNorm, L.MLPNorm = ones(c.Hidden), ones(c.Hidden)
		if c.gemma.on {
			L.PostAttnNorm, L.PostMLPNorm = ones(c.Hidden), ones(c.Hidden)
		}
		if o.QKNorm || c.gemma.on {
			L.QNorm, L.KNorm = ones(c.HeadDim), ones(c.HeadDim)
		}
		nt := NumLayerTargets
		if c.sparseLayer(i) {
			L.MoE, nt = randomMoE(c, randn, o.Std), TGate
		}
		for t := Target(0); t < nt; t++ {
			L.Lin[t] = Linear[T]{W: randn(dims[t][0]*dims[t][1], o.Std), Out: dims[t][0], In: dims[t][1]}
			if o.AttnBias && t <= TV {
				L.Lin[t].B = randn(dims[t][0], o.Std)
			}
		}
	}
	m.InitRope()
	m.packs = new(weightPacks)
	return m, nil
}

// Convert returns a copy of the model in another float type.
func Convert[U, T Float](m *Model[T]) *Model[U] {
	cv := func(x []T) []U {
		if x == nil {
			return nil
		}
		o := make([]U, len(x))
		for i, v := range x {
			o[i] = U(v)
		}
		return o
	}
	out := &Model[U]{Cfg: m.Cfg, Embed: cv(m.Embed), Norm: cv(m.Norm)}
	if m.Cfg.Tied {
		out.Head = Linear[U]{W: out.Embed, Out: m.Head.Out, In: m.Head.In}
	} else {
		out.Head = Linear[U]{W: cv(m.Head.W), Out: m.Head.Out, In: m.Head.In}
	}
	out.Layers = make([]Layer[U], len(m.Layers))
	for i, L := range m.Layers {
		o := &out.Layers[i]
		o.AttnNorm, o.MLPNorm, o.QNorm, o.KNorm = cv(L.AttnNorm), cv(L.MLPNorm), cv(L.QNorm), cv(L.KNorm)
		o.PostAttnNorm, o.PostMLPNorm = cv(L.PostAttnNorm), cv(L.PostMLPNorm)
		o.MoE = convertMoE(L.MoE, cv)
		for t, li := range L.Lin {
			o.Lin[t] = Linear[U]{W: cv(li.Weights()), B: cv(li.B), Out: li.Out, In: li.In}
		}
	}
	out.InitRope()
	out.packs = new(weightPacks)
	return out
}

// WriteConfig writes cfg as dir/config.json.
func WriteConfig(dir string, cfg Config, extra map[string]any) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	var mp map[string]any
	_ = json.Unmarshal(b, &mp)
	for k, v := range extra {
		mp[k] = v
	}
	for k, v := range mp {
		if v == nil {
			delete(mp, k)
		}
	}
	b, err = json.MarshalIndent(mp, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), append(b, '\n'), 0o644)
}
