package oracle

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeST writes a safetensors file with one tensor of raw little-endian bytes.
func writeST(t *testing.T, path, dtype string, shape []int, raw []byte) {
	t.Helper()
	hdr, err := json.Marshal(map[string]any{"x": map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int{0, len(raw)}}})
	require.NoError(t, err)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(append(b, hdr...), raw...)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

func TestReadSafetensorsDtypes(t *testing.T) {
	dir := t.TempDir()
	want := []float64{1, -2.5, 0.15625, 65504}
	cases := map[string][]byte{}
	var f32, bf16, f16 []byte
	for _, v := range want {
		bits := math.Float32bits(float32(v))
		f32 = binary.LittleEndian.AppendUint32(f32, bits)
		bf16 = binary.LittleEndian.AppendUint16(bf16, uint16(bits>>16))
	}
	// 1, -2.5, 0.15625, 65504 in IEEE half precision
	for _, h := range []uint16{0x3c00, 0xc100, 0x3100, 0x7bff} {
		f16 = binary.LittleEndian.AppendUint16(f16, h)
	}
	cases["F32"], cases["BF16"], cases["F16"] = f32, bf16, f16
	for dt, raw := range cases {
		p := filepath.Join(dir, dt+".safetensors")
		writeST(t, p, dt, []int{2, 2}, raw)
		ts, _, err := ReadSafetensors(p)
		require.NoError(t, err, dt)
		require.Equal(t, []int{2, 2}, ts["x"].Shape)
		for i, v := range want {
			tol := 0.0
			if dt == "BF16" {
				tol = math.Abs(v) / 128 // 8 mantissa bits
			}
			require.InDelta(t, v, ts["x"].Data[i], tol, "%s[%d]", dt, i)
		}
	}
	require.InDelta(t, 5.960464477539063e-08, halfToFloat(0x0001), 0, "subnormal")
}

// Each loss's derivative with respect to lp matches a finite difference of its value,
// except cispo, whose clipped ratio is a stop-gradient constant.
func TestLossDerivatives(t *testing.T) {
	d := &Datum{Tokens: []int{0}, Targets: []int{0}, K: 1, Weights: []float64{-1.3}, SamplerLogprobs: []float64{-2}, Advantages: []float64{0.7}}
	losses := []Loss{{Name: "cross_entropy"}, {Name: "importance_sampling"}, {Name: "ppo"},
		{Name: "ppo", Config: map[string]float64{"clip_low_threshold": 0.5, "clip_high_threshold": 3}},
		{Name: "dro"}, {Name: "dro", Config: map[string]float64{"beta": 0.4}}}
	for _, l := range losses {
		require.NoError(t, l.Validate())
		for _, lp := range []float64{-3, -2.1, -1.95, -1.5} {
			_, g := l.Token(d, 0, 0, lp)
			up, _ := l.Token(d, 0, 0, lp+1e-6)
			down, _ := l.Token(d, 0, 0, lp-1e-6)
			require.InDelta(t, (up-down)/2e-6, g, 1e-6, "%s %v at lp %g", l.Name, l.Config, lp)
		}
	}
	// ppo: outside the clip range on the side the min picks, the loss is flat
	v, g := Loss{Name: "ppo"}.Token(d, 0, 0, -2+math.Log(1.5))
	require.InDelta(t, -1.2*0.7, v, 1e-12)
	require.Zero(t, g)
	// cispo: −clip(r)·A·lp with the clip factor held constant
	v, g = Loss{Name: "cispo"}.Token(d, 0, 0, -2+math.Log(2))
	require.InDelta(t, 1.2*0.7*(-2+math.Log(2)), -v, 1e-12)
	require.InDelta(t, -1.2*0.7, g, 1e-12)
	// dro default beta
	v, _ = Loss{Name: "dro"}.Token(d, 0, 0, -1)
	require.InDelta(t, -(-1*0.7 - 0.5*0.05*1), v, 1e-12)
	require.Error(t, Loss{Name: "ppo", Config: map[string]float64{"beta": 1}}.Validate())
	require.Error(t, Loss{Name: "nope"}.Validate())
}

// gspo against a hand computation: the sequence ratio is the geometric mean of the marked
// positions' ratios; every position carries its value, clipped as ppo clips, and its
// derivative is that of s_t = sg(s)·exp(lp − sg(lp)), s·A on the unclipped branch.
func TestGSPO(t *testing.T) {
	q := []float64{-1, -2, -0.5, -3}
	d := &Datum{SamplerLogprobs: q, Advantages: []float64{0.4, 1, -2, 0.5}, SequenceRatioMask: []float64{0, 1, 1, 1}}
	ratios := []float64{7, 1.1, 0.9, 1.3} // position 0 is not marked: its ratio is not in s
	lps := make([]float64, 4)
	for i, r := range ratios {
		lps[i] = q[i] + math.Log(r)
	}
	s := SequenceRatio(d, lps)
	require.InDelta(t, math.Cbrt(1.1*0.9*1.3), s, 1e-12)
	require.Greater(t, s, 1.0004, "s is above gspo's default band")

	wide := Loss{Name: "gspo", Config: map[string]float64{"clip_low_threshold": 0.5, "clip_high_threshold": 2}}
	require.NoError(t, wide.Validate())
	for pos, a := range d.Advantages {
		v, g := wide.GSPOToken(d, pos, s)
		require.InDelta(t, -s*a, v, 1e-12, "inside the band every position is unclipped, the unmarked one too")
		require.InDelta(t, -s*a, g, 1e-12)
	}
	def := Loss{Name: "gspo"}
	v, g := def.GSPOToken(d, 1, s) // A > 0, s above the band: the clipped branch, flat
	require.InDelta(t, -DefaultGSPOClipHigh*1, v, 1e-12)
	require.Zero(t, g)
	v, g = def.GSPOToken(d, 2, s) // A < 0: the unclipped branch is the min
	require.InDelta(t, -s*-2, v, 1e-12)
	require.InDelta(t, -s*-2, g, 1e-12)

	// the derivative is that of the token ratio s·exp(lp' − lp) at lp' = lp
	for _, l := range []Loss{wide, def, {Name: "gspo", Config: map[string]float64{"clip_low_threshold": 1.2, "clip_high_threshold": 1.5}}} {
		for pos, a := range d.Advantages {
			tok := func(x float64) float64 {
				r := s * math.Exp(x)
				lo, hi := l.cfg("clip_low_threshold", DefaultGSPOClipLow), l.cfg("clip_high_threshold", DefaultGSPOClipHigh)
				return -math.Min(r*a, clamp(r, lo, hi)*a)
			}
			_, g := l.GSPOToken(d, pos, s)
			require.InDelta(t, (tok(1e-7)-tok(-1e-7))/2e-7, g, 1e-6, "%v position %d", l.Config, pos)
		}
	}
	require.Panics(t, func() { SequenceRatio(&Datum{SamplerLogprobs: q, SequenceRatioMask: make([]float64, 4)}, lps) })
}

// AdamStep against a hand computation: two steps with decay and clipping.
func TestAdamStep(t *testing.T) {
	p := AdamParams{LR: 0.1, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.01, GradClipNorm: 1}
	w := map[string][]float64{"a": {1, -2}}
	st := NewAdamState()
	norm := AdamStep(w, map[string][]float64{"a": {3, 4}}, st, p)
	require.InDelta(t, 5, norm, 1e-12)
	// clipped gradient (3,4)/(5+1e-6); first step moves by lr·sign
	c := 1 / (5 + 1e-6)
	g := []float64{3 * c, 4 * c}
	want := []float64{1*(1-0.001) - 0.1*g[0]/(math.Abs(g[0])+1e-8), -2*(1-0.001) - 0.1*g[1]/(math.Abs(g[1])+1e-8)}
	require.InDeltaSlice(t, want, w["a"], 1e-12)
	AdamStep(w, map[string][]float64{"a": {0.3, -0.4}}, st, p) // norm 0.5: not clipped
	for i, gi := range []float64{0.3, -0.4} {
		m := 0.9*0.1*g[i] + 0.1*gi
		v := 0.99*0.01*g[i]*g[i] + 0.01*gi*gi
		want[i] = want[i]*(1-0.001) - 0.1*(m/(1-0.81))/(math.Sqrt(v/(1-0.9801))+1e-8)
	}
	require.InDeltaSlice(t, want, w["a"], 1e-12)
}

// RoPE makes attention scores depend on relative positions only.
func TestRopeRelative(t *testing.T) {
	m := &Model{Cfg: Config{HeadDim: 8, RopeTheta: 100}}
	m.invFreq = ropeInvFreq(&m.Cfg)
	q := []float64{0.3, -1, 0.2, 0.5, 1.1, -0.4, 0.05, 0.7}
	k := []float64{-0.6, 0.1, 0.9, -0.2, 0.3, 0.8, -1.2, 0.4}
	score := func(pq, pk int) float64 {
		a, b := append([]float64(nil), q...), append([]float64(nil), k...)
		m.rope(a, pq)
		m.rope(b, pk)
		s := 0.0
		for i := range a {
			s += a[i] * b[i]
		}
		return s
	}
	require.InDelta(t, score(5, 2), score(13, 10), 1e-12)
	require.NotEqual(t, score(5, 2), score(5, 3))
}

func TestTopKAndLogSoftmax(t *testing.T) {
	ls := LogSoftmax([]float64{1, 3, 2, 3}, 2)
	s := 0.0
	for _, v := range ls {
		s += math.Exp(v)
	}
	require.InDelta(t, 1, s, 1e-12)
	top := TopK(ls, 3)
	require.Equal(t, []int{1, 3, 2}, []int{top[0].Token, top[1].Token, top[2].Token})
}

func TestDecoderByteLevel(t *testing.T) {
	dir := t.TempDir()
	tj := `{"model":{"vocab":{"Ġhi":0,"Ċ":1,"a":2}},"added_tokens":[{"id":3,"content":"<|end|>"}]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tj), 0o644))
	d, err := LoadDecoder(dir)
	require.NoError(t, err)
	require.Equal(t, " hi\na<|end|>", d.Decode([]int{0, 1, 2, 3}))
	require.True(t, d.IsSpecial(3))
	require.False(t, d.IsSpecial(2))
}
