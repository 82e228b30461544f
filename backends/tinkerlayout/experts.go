package tinkerlayout

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
)

// Expert LoRA names. Loops stores a MoE layer's expert LoRA as PEFT's target_parameters
// does: of the experts module's two targeted parameters, gate_up_proj (the first) has keys
// "<experts>.base_layer.lora_{A,B}.weight" and down_proj "<experts>.lora_{A,B}.weight";
// lora_A is [E·r, in] (expert-major) and lora_B [out, r·E] (column j·E+e). Tinker's layout,
// as tinker-cookbook merges it (expert_key_remaps, fused_concatenated), has 3-D tensors
// "<experts>.w{1,2,3}.lora_A.weight" (E, r, in) and ".lora_B.weight" (E, out, r), w1 the
// gate projection, w3 the up projection and w2 down_proj.
const (
	peftGateUp = ".experts.base_layer.lora_"
	peftDown   = ".experts.lora_"
)

// ExpertLayout is how a model family's fused expert parameters map to Tinker's w1/w2/w3.
type ExpertLayout struct {
	// Params are the fused parameters Loops adapts, in the experts module's parameter order
	// (PEFT's target_parameters; the first holds the base_layer keys): the gate and up
	// projections (or the up projection alone), then down_proj.
	Params [2]string
	// Interleaved: gate_up_proj's output interleaves the gate and up projections, gate at
	// even rows (gpt-oss, tinker-cookbook's fused_interleaved); otherwise the gate rows come
	// first, then up (fused_concatenated, and the per-expert gate_proj/up_proj of a
	// checkpoint saved per expert).
	Interleaved bool
	// UpOnly: the experts have no gate projection (Nemotron-H's non-gated ReLU² experts:
	// up_proj, down_proj). Tinker's w1 is then up_proj, whole, and there is no w3
	// (tinker-cookbook's nemotron profile maps w1 to up_proj and skips an empty w3).
	UpOnly bool
}

var gateUpDown = [2]string{"gate_up_proj", "down_proj"}

// ExpertFamilies are the model families (loops.v1 ModelInfo.family) whose expert LoRA
// converts exactly to Tinker's layout, with how. tinker-cookbook 0.6.1 merges w1 into the
// gate part of gate_up_proj (gpt-oss: its even rows), w3 into the up part and w2 into
// down_proj (Nemotron-H: w1 into up_proj), as trained; docs/export-import.md says which of
// its merge strategies work for each family.
var ExpertFamilies = map[string]ExpertLayout{
	"qwen3_moe":   {Params: gateUpDown},
	"qwen3_5_moe": {Params: gateUpDown},
	"deepseek_v3": {Params: gateUpDown},
	"glm_moe_dsa": {Params: gateUpDown},
	"minimax_m2":  {Params: gateUpDown},
	"gpt_oss":     {Params: gateUpDown, Interleaved: true},
	"nemotron_h":  {Params: [2]string{"up_proj", "down_proj"}, UpOnly: true},
}

// MaxExpertTensorBytes bounds one expert LoRA tensor a conversion holds in memory (its
// elements are reordered, not streamed).
const MaxExpertTensorBytes = 512 << 20

// ErrNoTinkerLayout is the error for an adapter whose expert LoRA has no Tinker layout that
// tinker-cookbook merges as Loops trained it.
var ErrNoTinkerLayout = errors.New("this checkpoint's expert LoRA has no Tinker layout that tinker-cookbook merges exactly for its model family. " +
	"Export it with `loops checkpoints export --format peft` (PEFT's target_parameters layout, which PEFT loads) or " +
	"`--format merged` (a merged Hugging Face model)")

// Checkpoint is what converting a checkpoint's files to Tinker's layout needs to know
// beyond the files themselves.
type Checkpoint struct {
	// Rank is the adapter's r (adapter_config.json), the rank of each expert.
	Rank int
	// Family is the base model's family; only ExpertFamilies convert expert LoRA.
	Family string
	// LanguageModelPrefix is where the base model's language model is in PEFT's names
	// (TinkerName).
	LanguageModelPrefix string
	// HeadOnlyTied says the adapter's unembedding LoRA follows the head-only rule on a model
	// with tied embeddings when its weights file does not say (no peft.UnembedMetaKey
	// metadata: a checkpoint written before engines recorded it): its adapter_config.json
	// has no ensure_weight_tying and the base model's embeddings are tied. ToTinker then
	// refuses it (ErrHeadOnlyTied) as it does a file that says so.
	HeadOnlyTied bool
}

// CheckpointFromConfig reads r and ensure_weight_tying from adapter_config.json b, for a
// base model as base says.
func CheckpointFromConfig(b []byte, base Base) (Checkpoint, error) {
	ck := Checkpoint{Family: base.Family, LanguageModelPrefix: base.LanguageModelPrefix}
	var cfg struct {
		R    int  `json:"r"`
		Ties bool `json:"ensure_weight_tying"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return ck, fmt.Errorf("%s: %w", peft.AdapterConfigFile, err)
	}
	ck.Rank, ck.HeadOnlyTied = cfg.R, base.TiedEmbeddings && !cfg.Ties
	return ck, nil
}

// Base is what converting an adapter needs to know of its base model (loops.v1 ModelInfo).
type Base struct {
	// Family is the model family (ModelInfo.family).
	Family string
	// LanguageModelPrefix is where a vision-language checkpoint's language model is in
	// PEFT's names, "model.language_model." (ModelInfo.language_model_prefix); empty for a
	// text model.
	LanguageModelPrefix string
	// TiedEmbeddings says the model's input embedding and output head are one matrix
	// (ModelInfo.tied_embeddings).
	TiedEmbeddings bool
}

// hasExperts reports whether names hold an expert LoRA in PEFT's layout.
func hasExperts(tensors map[string]safetensors.Info) bool {
	for k := range tensors {
		if isPEFTExpert(k) {
			return true
		}
	}
	return false
}

func isPEFTExpert(k string) bool {
	return strings.HasSuffix(k, ".weight") && (strings.Contains(k, peftGateUp) || strings.Contains(k, peftDown))
}

// outTensor is one tensor of a converted file: made from the source tensor src by take.
type outTensor struct {
	name string
	info safetensors.Info
	src  string
	take func(src []byte) []byte // nil: the source bytes as they are
}

// permuteB returns the rows of B [out, r·E] (column j·E+e, elements of es bytes) that
// rows lists, as (E, len(rows), r).
func permuteB(b []byte, es, r, e int64, rows []int64) []byte {
	dst := make([]byte, 0, int64(len(rows))*r*e*es)
	for x := range e {
		for _, o := range rows {
			for j := range r {
				s := (o*r*e + j*e + x) * es
				dst = append(dst, b[s:s+es]...)
			}
		}
	}
	return dst
}

// tinkerExperts plans the conversion of a file's tensors (in PEFT's layout) to Tinker's
// expert layout; other tensors keep their bytes and get TinkerName.
func tinkerExperts(f *safetensors.File, ex Checkpoint) ([]outTensor, error) {
	lay, ok := ExpertFamilies[ex.Family]
	if !ok {
		return nil, fmt.Errorf("model family %q: %w", ex.Family, ErrNoTinkerLayout)
	}
	if ex.Rank <= 0 {
		return nil, fmt.Errorf("%s has no positive r", peft.AdapterConfigFile)
	}
	r := int64(ex.Rank)
	names := slices.SortedFunc(func(yield func(string) bool) {
		for k := range f.Tensors {
			if !yield(k) {
				return
			}
		}
	}, func(a, b string) int { return cmp.Compare(f.Tensors[a].Offsets[0], f.Tensors[b].Offsets[0]) })
	var out []outTensor
	for _, k := range names {
		info := f.Tensors[k]
		if !isPEFTExpert(k) {
			out = append(out, outTensor{name: TinkerName(k, ex.LanguageModelPrefix), info: info, src: k})
			continue
		}
		n := info.Offsets[1] - info.Offsets[0]
		if len(info.Shape) != 2 || n > MaxExpertTensorBytes {
			return nil, fmt.Errorf("expert LoRA tensor %s has shape %v (%d bytes): want 2-D, at most %d bytes", k, info.Shape, n, MaxExpertTensorBytes)
		}
		es := n / max(1, safetensors.Numel(info.Shape))
		gateUp := strings.Contains(k, peftGateUp)
		mid := peftDown
		if gateUp {
			mid = peftGateUp
		}
		pre, factor, _ := strings.Cut(k, mid)
		pre += ".experts."
		isA := strings.HasPrefix(factor, "A.")
		d0, d1 := info.Shape[0], info.Shape[1]
		var e int64
		if isA {
			e = d0 / r
			if e*r != d0 || e < 1 {
				return nil, fmt.Errorf("expert lora_A %s has %d rows, not a multiple of r=%d", k, d0, r)
			}
		} else {
			e = d1 / r
			if e*r != d1 || e < 1 {
				return nil, fmt.Errorf("expert lora_B %s has %d columns, not a multiple of r=%d", k, d1, r)
			}
		}
		suffix := ".lora_" + factor
		switch {
		case isA:
			shape := []int64{e, r, d1}
			ws := []string{"w2"}
			if gateUp {
				ws = []string{"w1", "w3"}
				if lay.UpOnly {
					ws = ws[:1]
				}
			}
			for _, w := range ws {
				out = append(out, outTensor{name: pre + w + suffix, info: safetensors.Info{DType: info.DType, Shape: shape}, src: k})
			}
		case gateUp && lay.UpOnly:
			out = append(out, outTensor{name: pre + "w1" + suffix, info: safetensors.Info{DType: info.DType, Shape: []int64{e, d0, r}}, src: k,
				take: func(b []byte) []byte { return permuteB(b, es, r, e, gateUpRows(0, d0, false)) }})
		case gateUp:
			if d0%2 != 0 {
				return nil, fmt.Errorf("expert lora_B %s of gate_up_proj has %d rows, not gate and up halves", k, d0)
			}
			i := d0 / 2
			for h, w := range []string{"w1", "w3"} {
				rows := gateUpRows(int64(h), i, lay.Interleaved)
				out = append(out, outTensor{name: pre + w + suffix, info: safetensors.Info{DType: info.DType, Shape: []int64{e, i, r}}, src: k,
					take: func(b []byte) []byte { return permuteB(b, es, r, e, rows) }})
			}
		default:
			out = append(out, outTensor{name: pre + "w2" + suffix, info: safetensors.Info{DType: info.DType, Shape: []int64{e, d0, r}}, src: k,
				take: func(b []byte) []byte { return permuteB(b, es, r, e, gateUpRows(0, d0, false)) }})
		}
	}
	return out, nil
}

// gateUpRows are the rows of gate_up_proj's LoRA B that hold half h (0 gate, 1 up) of
// width i: the h-th block, or every other row from h when interleaved.
func gateUpRows(h, i int64, interleaved bool) []int64 {
	rows := make([]int64, i)
	for o := range i {
		if interleaved {
			rows[o] = 2*o + h
		} else {
			rows[o] = h*i + o
		}
	}
	return rows
}

// planReader streams a converted file: header, then each planned tensor, reading the
// source tensors in offset order from r (positioned at the data section).
type planReader struct {
	r       io.Reader
	f       *safetensors.File
	plan    []outTensor
	i       int
	cur     bytes.Reader
	srcName string
	srcData []byte
	pos     int64 // source data bytes consumed
}

func (p *planReader) Read(b []byte) (int, error) {
	for p.cur.Len() == 0 {
		if p.i == len(p.plan) {
			return 0, io.EOF
		}
		t := p.plan[p.i]
		p.i++
		if t.src != p.srcName {
			info := p.f.Tensors[t.src]
			if skip := info.Offsets[0] - p.pos; skip > 0 {
				if _, err := io.CopyN(io.Discard, p.r, skip); err != nil {
					return 0, err
				}
			}
			buf := make([]byte, info.Offsets[1]-info.Offsets[0])
			if _, err := io.ReadFull(p.r, buf); err != nil {
				return 0, err
			}
			p.srcName, p.srcData, p.pos = t.src, buf, info.Offsets[1]
		}
		data := p.srcData
		if t.take != nil {
			data = t.take(data)
		}
		p.cur.Reset(data)
	}
	return p.cur.Read(b)
}

// encodePlan lays the planned tensors out in order and returns the file's header and size.
func encodePlan(plan []outTensor, es func(outTensor) int64, meta map[string]string) ([]byte, int64, error) {
	out := make(map[string]safetensors.Info, len(plan))
	var end int64
	for i := range plan {
		n := safetensors.Numel(plan[i].info.Shape) * es(plan[i])
		plan[i].info.Offsets = [2]int64{end, end + n}
		if _, dup := out[plan[i].name]; dup {
			return nil, 0, fmt.Errorf("two tensors are named %s once converted", plan[i].name)
		}
		out[plan[i].name] = plan[i].info
		end += n
	}
	hdr, err := safetensors.EncodeHeader(out, meta)
	if err != nil {
		return nil, 0, err
	}
	return hdr, int64(len(hdr)) + end, nil
}

// elemSize is the element size of a tensor of f, from its byte size.
func elemSize(f *safetensors.File, name string) int64 {
	info := f.Tensors[name]
	return (info.Offsets[1] - info.Offsets[0]) / max(1, safetensors.Numel(info.Shape))
}

// TinkerExpertModules are the target_modules a Tinker-layout adapter with expert LoRA
// lists for the experts (adapter_config.json's target_parameters are dropped).
var TinkerExpertModules = []string{"w1", "w2", "w3"}

// Modules are the target_modules a Tinker-layout adapter lists for experts of this
// layout: w1, w2 and w3, or w1 and w2 when UpOnly.
func (l ExpertLayout) Modules() []string {
	if l.UpOnly {
		return TinkerExpertModules[:2]
	}
	return TinkerExpertModules
}

// ExpertConfigToTinker returns adapter_config.json b with target_parameters (PEFT's fused
// expert parameters) replaced by Tinker's expert modules of lay in target_modules; b
// unchanged when it has none.
func ExpertConfigToTinker(b []byte, lay ExpertLayout) ([]byte, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s is not a JSON object: %w", peft.AdapterConfigFile, err)
	}
	var tp []string
	if raw, ok := cfg["target_parameters"]; !ok || json.Unmarshal(raw, &tp) != nil || len(tp) == 0 {
		return b, nil
	}
	var tm []string
	_ = json.Unmarshal(cfg["target_modules"], &tm)
	for _, m := range lay.Modules() {
		if !slices.Contains(tm, m) {
			tm = append(tm, m)
		}
	}
	slices.Sort(tm)
	delete(cfg, "target_parameters")
	cfg["target_modules"], _ = json.Marshal(tm)
	nb, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(nb, '\n'), nil
}

// expertsToPEFT converts dir's adapter (adapter_model.safetensors, adapter_config.json)
// from Tinker's expert layout (experts.w1/w2/w3, 3-D) to PEFT's target_parameters layout,
// in place, for a base model of family. w1 and w3 (gate and up) must share lora_A, as Loops
// writes them: Loops adapts gate_up_proj with one LoRA of rank r per expert. It returns
// whether it changed anything.
func expertsToPEFT(dir, family string) (bool, error) {
	wp := filepath.Join(dir, peft.AdapterWeightsFile)
	f, err := safetensors.OpenLimited(wp, safetensors.Limits{MaxHeaderBytes: MaxHeaderBytes})
	if err != nil {
		return false, fmt.Errorf("%s: %w", peft.AdapterWeightsFile, err)
	}
	defer f.Close()
	src, err := os.Open(wp)
	if err != nil {
		return false, err
	}
	defer src.Close()
	read := func(name string) ([]byte, error) {
		info := f.Tensors[name]
		n := info.Offsets[1] - info.Offsets[0]
		if n > MaxExpertTensorBytes {
			return nil, fmt.Errorf("expert LoRA tensor %s is larger than %d bytes", name, MaxExpertTensorBytes)
		}
		b := make([]byte, n)
		_, err := src.ReadAt(b, f.DataOffset()+info.Offsets[0])
		return b, err
	}
	type tensor struct {
		name string
		info safetensors.Info
		data []byte
	}
	var out []tensor
	found := false
	lay, known := ExpertFamilies[family]
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range f.Tensors {
			if !yield(k) {
				return
			}
		}
	}) {
		info := f.Tensors[k]
		pre, rest, ok := strings.Cut(k, ".experts.w")
		if !ok || !strings.HasSuffix(k, ".weight") || len(rest) < 2 || !strings.HasPrefix(rest[1:], ".lora_") {
			b, err := read(k)
			if err != nil {
				return false, err
			}
			out = append(out, tensor{k, safetensors.Info{DType: info.DType, Shape: info.Shape}, b})
			continue
		}
		found = true
		if !known {
			return false, fmt.Errorf("expert LoRA tensor %s: Tinker's expert layout is read for model families %v, not %q; import the adapter in PEFT's layout (target_parameters)",
				k, slices.Sorted(maps.Keys(ExpertFamilies)), family)
		}
		w, factor := rest[:1], rest[1+len(".lora_"):]
		if w == "3" && lay.UpOnly {
			if safetensors.Numel(info.Shape) != 0 {
				return false, fmt.Errorf("expert LoRA tensor %s: %s's experts have no gate projection, so Tinker's w3 must be empty (w1 is up_proj, w2 down_proj)", k, family)
			}
			continue // Tinker's empty placeholder
		}
		if w == "3" {
			continue // read with w1
		}
		if len(info.Shape) != 3 {
			return false, fmt.Errorf("expert LoRA tensor %s has shape %v: Tinker's expert layout is 3-D (experts, rank, in) / (experts, out, rank)", k, info.Shape)
		}
		es := elemSize(f, k)
		peftName := pre + peftDown + factor
		if w == "1" {
			peftName = pre + peftGateUp + factor
		} else if w != "2" {
			return false, fmt.Errorf("expert LoRA tensor %s: Tinker's expert projections are w1 (gate), w2 (down) and w3 (up)", k)
		}
		e, d1, d2 := info.Shape[0], info.Shape[1], info.Shape[2]
		parts := [][]byte{}
		b, err := read(k)
		if err != nil {
			return false, err
		}
		parts = append(parts, b)
		if w == "1" && !lay.UpOnly {
			k3 := pre + ".experts.w3" + rest[1:]
			i3, ok := f.Tensors[k3]
			if !ok || !slices.Equal(i3.Shape, info.Shape) || i3.DType != info.DType {
				return false, fmt.Errorf("expert LoRA tensor %s has no w3 (up projection) of the same shape and dtype: Loops adapts gate_up_proj, both halves", k)
			}
			b3, err := read(k3)
			if err != nil {
				return false, err
			}
			if strings.HasPrefix(factor, "A.") {
				if !bytes.Equal(b, b3) {
					return false, fmt.Errorf("expert LoRA %s and its w3 have different lora_A: Loops adapts gate_up_proj with one lora_A per expert (the adapters Loops downloads share it); "+
						"import this adapter's merged model instead, or retrain on Loops", strings.TrimSuffix(k, ".lora_"+factor))
				}
				parts = parts[:1]
			} else {
				parts = append(parts, b3)
			}
		}
		if strings.HasPrefix(factor, "A.") {
			// (E, r, in) → [E·r, in]: same bytes
			out = append(out, tensor{peftName, safetensors.Info{DType: info.DType, Shape: []int64{e * d1, d2}}, parts[0]})
			continue
		}
		// (E, out, r) per part, parts stacked along out → [out_total, r·E], column j·E+e
		r := d2
		outRows := d1 * int64(len(parts))
		dst := make([]byte, outRows*r*e*es)
		for p, pb := range parts {
			rows := gateUpRows(int64(p), d1, lay.Interleaved && len(parts) == 2)
			for x := range e {
				for o := range d1 {
					for j := range r {
						s := ((x*d1+o)*r + j) * es
						row := rows[o]
						t := (row*r*e + j*e + x) * es
						copy(dst[t:t+es], pb[s:s+es])
					}
				}
			}
		}
		out = append(out, tensor{peftName, safetensors.Info{DType: info.DType, Shape: []int64{outRows, r * e}}, dst})
	}
	if !found {
		return false, nil
	}
	hdrTensors := map[string]safetensors.Info{}
	var end int64
	for _, t := range out {
		t.info.Offsets = [2]int64{end, end + int64(len(t.data))}
		hdrTensors[t.name] = t.info
		end += int64(len(t.data))
	}
	hdr, err := safetensors.EncodeHeader(hdrTensors, f.Metadata)
	if err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, ".convert-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(hdr)
	for _, t := range out {
		if err != nil {
			break
		}
		_, err = tmp.Write(t.data)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	cp, cb, err := readAdapterConfig(dir)
	if err != nil {
		return false, err
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return false, fmt.Errorf("%s is not a JSON object: %w", peft.AdapterConfigFile, err)
	}
	var tm []string
	_ = json.Unmarshal(cfg["target_modules"], &tm)
	tm = slices.DeleteFunc(tm, func(m string) bool { return slices.Contains(TinkerExpertModules, m) })
	cfg["target_modules"], _ = json.Marshal(tm)
	cfg["target_parameters"], _ = json.Marshal(lay.Params[:])
	nb, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.WriteFile(cp, append(nb, '\n'), 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), wp)
}
