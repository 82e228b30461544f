package tinkerlayout

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/internal/bounded"
)

// The unembedding's module in each layout, as tensor-name prefixes and as target_modules
// entries.
const (
	peftHead   = "base_model.model.lm_head."
	tinkerHead = "base_model.model.model.unembed_tokens."
	// cookbookTiedHead is where tinker-cookbook's build_lora_adapter puts Tinker's
	// unembedding LoRA for a model with tied embeddings (as lora_A/lora_B, which PEFT's own
	// embedding LoRA never uses: it names its factors lora_embedding_A/B).
	cookbookTiedHead = "base_model.model.model.embed_tokens."

	peftHeadModule       = "lm_head"
	tinkerHeadModule     = "unembed_tokens"
	cookbookTiedHeadLeaf = "embed_tokens"
)

// MaxHeaderBytes bounds the safetensors header a conversion reads (a LoRA adapter of a
// 100-layer model with every target holds about 1 400 tensors, under 200 KiB of header).
const MaxHeaderBytes = 16 << 20

// peftModel prefixes the PEFT names of a text model's decoder modules (model.*), which are
// Tinker's names of them for every model.
const peftModel = "base_model.model.model."

// TinkerName returns the name in Tinker's layout of a tensor named in PEFT's layout (an
// adapter tensor, or an optimizer moment "<tensor>.exp_avg") for a base model whose
// language model's modules are named under lm (ModelInfo.language_model_prefix: "" for a
// text model, whose decoder is "model."; "model.language_model." for a vision-language
// checkpoint's). Tinker names the modules as the text model does (the cookbook adds a
// vision-language model's prefix itself) and the unembedding's LoRA model.unembed_tokens.
func TinkerName(name, lm string) string {
	if rest, ok := strings.CutPrefix(name, peftHead); ok {
		return tinkerHead + rest
	}
	if lm != "" {
		if rest, ok := strings.CutPrefix(name, "base_model.model."+lm); ok {
			return peftModel + rest
		}
	}
	return name
}

// PEFTName returns the PEFT name, on a base model whose language model's modules are named
// under lm (as TinkerName), of a tensor named in Tinker's layout, in PEFT's, or in the PEFT
// adapter tinker-cookbook's build_lora_adapter writes from Tinker's for a model with tied
// embeddings (model.embed_tokens, or the vision-language model's, with lora_A/lora_B
// factors: lm_head). Other names are returned unchanged.
func PEFTName(name, lm string) string {
	if rest, ok := strings.CutPrefix(name, tinkerHead); ok {
		return peftHead + rest
	}
	vl := peftModel
	if lm != "" {
		vl = "base_model.model." + lm
	}
	for _, emb := range []string{cookbookTiedHead, vl + cookbookTiedHeadLeaf + "."} {
		if rest, ok := strings.CutPrefix(name, emb); ok && (strings.HasPrefix(rest, "lora_A.") || strings.HasPrefix(rest, "lora_B.")) {
			return peftHead + rest
		}
	}
	if lm != "" && !strings.HasPrefix(name, vl) {
		if rest, ok := strings.CutPrefix(name, peftModel); ok {
			return vl + rest
		}
	}
	return name
}

// Renamed is a safetensors stream with its tensors renamed (RenameTensors).
type Renamed struct {
	// Reader yields the renamed file: the new header, then the data section unchanged.
	io.Reader
	// Size is the renamed file's size in bytes.
	Size int64
	// Modules maps each module leaf name that was renamed to its new one (e.g. lm_head to
	// unembed_tokens); empty when no tensor changed name, in which case the stream is the
	// original bytes.
	Modules map[string]string
	// Experts is set when expert LoRA was converted to Tinker's layout (its config needs
	// ExpertConfigToTinker).
	Experts bool
}

// RenameTensors reads the header of the safetensors file of size bytes that r streams
// (at most MaxHeaderBytes of it, validated against size) and returns the file with every
// tensor renamed by rename; tensor data, dtypes, shapes and metadata are unchanged. Two
// tensors renamed to one name are an error. With an error the result still streams the
// original bytes (those already read, then the rest of r), for a caller that serves a file
// it cannot convert as it is.
func RenameTensors(r io.Reader, size int64, rename func(string) string) (Renamed, error) {
	return renameTensors(r, size, rename, nil, nil)
}

// ErrHeadOnlyTied is ToTinker's error for an adapter whose unembedding LoRA follows the
// head-only rule on a model with tied embeddings (metadata peft.UnembedMetaKey =
// peft.UnembedHeadOnly: trained before Loops adapted the shared matrix). Tinker's layout
// cannot say that: tinker-cookbook merges model.unembed_tokens into the shared embedding
// matrix, so a converted file would give the tools a different model.
var ErrHeadOnlyTied = errors.New("this checkpoint's unembedding LoRA adapts the output head alone of a model " +
	"with tied embeddings (it was trained before Loops applied it to the shared embedding matrix), which Tinker's " +
	"layout cannot express: tinker-cookbook would merge it into the input embedding too. " +
	"Export it with `loops checkpoints export --format merged` (the head is untied in the merged model) or " +
	"`--format peft` (PEFT applies it to the head alone)")

// ToTinker is RenameTensors to Tinker's layout (TinkerName), refusing with ErrHeadOnlyTied
// (and the original bytes) an adapter Tinker's layout cannot express. A file with expert
// LoRA (PEFT's target_parameters layout) is converted to Tinker's 3-D w1/w2/w3 tensors as ck
// says (its data reordered, one tensor at a time), or refused with ErrNoTinkerLayout for a
// family not in ExpertFamilies. A head-only unembedding is known from the file's metadata,
// or, when it has none, from ck.HeadOnlyTied.
func ToTinker(r io.Reader, size int64, ck Checkpoint) (Renamed, error) {
	rename := func(k string) string { return TinkerName(k, ck.LanguageModelPrefix) }
	return renameTensors(r, size, rename, &ck, func(f *safetensors.File) error {
		switch rule := f.Metadata[peft.UnembedMetaKey]; {
		case rule == peft.UnembedHeadOnly, rule == "" && ck.HeadOnlyTied:
			for k := range f.Tensors {
				if strings.HasPrefix(k, peftHead) {
					return ErrHeadOnlyTied
				}
			}
		}
		return nil
	})
}

// renameTensors is RenameTensors; check, when set, may refuse the parsed header.
func renameTensors(r io.Reader, size int64, rename func(string) string, ex *Checkpoint, check func(*safetensors.File) error) (Renamed, error) {
	var read bytes.Buffer
	orig := func(err error) (Renamed, error) {
		return Renamed{Reader: io.MultiReader(&read, r), Size: size}, err
	}
	failed := func(err error) (Renamed, error) { // r failed: its error ends the stream too
		return Renamed{Reader: io.MultiReader(&read, failing{err}), Size: size}, err
	}
	if _, err := io.CopyN(&read, r, 8); err != nil && !errors.Is(err, io.EOF) {
		return failed(err)
	} else if err != nil {
		return orig(fmt.Errorf("reading the safetensors header length: %w", err))
	}
	n := binary.LittleEndian.Uint64(read.Bytes())
	if size < 8 || n > uint64(size-8) || n > MaxHeaderBytes {
		return orig(fmt.Errorf("safetensors header of %d bytes does not fit a file of %d bytes and the limit of %d", n, size, MaxHeaderBytes))
	}
	if _, err := io.CopyN(&read, r, int64(n)); err != nil && !errors.Is(err, io.EOF) {
		return failed(err)
	} else if err != nil {
		return orig(fmt.Errorf("reading the safetensors header: %w", err))
	}
	prefix := read.Bytes()
	f, err := safetensors.Parse(bytes.NewReader(prefix), size, safetensors.Limits{MaxHeaderBytes: MaxHeaderBytes})
	if err != nil {
		return orig(err)
	}
	if check != nil {
		if err := check(f); err != nil {
			return orig(err)
		}
	}
	if ex != nil && hasExperts(f.Tensors) {
		plan, err := tinkerExperts(f, *ex)
		if err != nil {
			return orig(err)
		}
		hdr, total, err := encodePlan(plan, func(t outTensor) int64 { return elemSize(f, t.src) }, f.Metadata)
		if err != nil {
			return orig(err)
		}
		modules := map[string]string{}
		for _, t := range plan {
			if t.name != t.src && !strings.Contains(t.name, ".experts.w") {
				modules[moduleLeaf(t.src)] = moduleLeaf(t.name)
			}
		}
		return Renamed{Reader: io.MultiReader(bytes.NewReader(hdr), &planReader{r: r, f: f, plan: plan}), Size: total, Modules: modules, Experts: true}, nil
	}
	out := make(map[string]safetensors.Info, len(f.Tensors))
	modules := map[string]string{}
	for k, info := range f.Tensors {
		nk := rename(k)
		if _, dup := out[nk]; dup {
			return orig(fmt.Errorf("two tensors are named %s once renamed (does the file hold the unembedding's LoRA under two names?)", nk))
		}
		out[nk] = info
		if nk != k {
			modules[moduleLeaf(k)] = moduleLeaf(nk)
		}
	}
	if len(modules) == 0 {
		return orig(nil)
	}
	hdr, err := safetensors.EncodeHeader(out, f.Metadata)
	if err != nil {
		return orig(err)
	}
	data := size - f.DataOffset()
	return Renamed{Reader: io.MultiReader(bytes.NewReader(hdr), r), Size: int64(len(hdr)) + data, Modules: modules}, nil
}

// failing is a reader that fails with err.
type failing struct{ err error }

func (f failing) Read([]byte) (int, error) { return 0, f.err }

// moduleLeaf is the module's own name in a LoRA tensor name:
// "base_model.model.lm_head.lora_A.weight" → "lm_head".
func moduleLeaf(name string) string {
	i := strings.Index(name, ".lora_")
	if i < 0 {
		return ""
	}
	mod := name[:i]
	return mod[strings.LastIndex(mod, ".")+1:]
}

// RenameTargetModules returns adapter_config.json b with every target_modules entry that
// modules maps renamed, and whether anything changed; every other field is kept as it was
// (the JSON object is re-encoded with sorted keys and two-space indentation).
func RenameTargetModules(b []byte, modules map[string]string) ([]byte, bool, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, false, fmt.Errorf("%s is not a JSON object: %w", peft.AdapterConfigFile, err)
	}
	raw, ok := cfg["target_modules"]
	if !ok || len(modules) == 0 {
		return b, false, nil
	}
	var tms []string
	if err := json.Unmarshal(raw, &tms); err != nil {
		return b, false, nil // not a list of names: left for the config checks to refuse
	}
	changed := false
	seen := map[string]bool{}
	out := tms[:0]
	for _, m := range tms {
		if nm, ok := modules[m]; ok {
			m, changed = nm, true
		}
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	if !changed {
		return b, false, nil
	}
	cfg["target_modules"], _ = json.Marshal(out)
	nb, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, false, err
	}
	return append(nb, '\n'), true, nil
}

// setWeightTying returns adapter_config.json b with ensure_weight_tying true (re-encoded as
// RenameTargetModules does).
func setWeightTying(b []byte) ([]byte, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s is not a JSON object: %w", peft.AdapterConfigFile, err)
	}
	cfg["ensure_weight_tying"] = json.RawMessage("true")
	nb, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(nb, '\n'), nil
}

// TinkerModules maps PEFT's target module names to Tinker's (RenameTargetModules).
var TinkerModules = map[string]string{peftHeadModule: tinkerHeadModule}

// ToPEFT converts the adapter folder dir (adapter_config.json and
// adapter_model.safetensors) from Tinker's layout, or from the PEFT adapter
// tinker-cookbook's build_lora_adapter writes for a tied model, or PEFT's own save of a tied
// model's unembedding under ensure_weight_tying (the embedding's lora_embedding_A/B copies of
// the head's factors are dropped: dropTiedEmbedding), to PEFT's layout in place;
// an unembedding LoRA so converted gets ensure_weight_tying (on a model with tied
// embeddings it adapts the shared matrix, as Tinker's tools apply it). A folder already in
// PEFT's layout is left as it is. Tinker's 3-D expert LoRA (experts.w1/w2/w3) is read for
// a base model of a family in ExpertFamilies (expertsToPEFT). On a vision-language
// checkpoint's language model (base.LanguageModelPrefix) Tinker's text-model names get the
// prefix PEFT's names of it have (PEFTName); names that have it already are kept. It returns
// whether anything changed.
func ToPEFT(dir string, base Base) (bool, error) {
	experts, err := expertsToPEFT(dir, base.Family)
	if err != nil {
		return false, err
	}
	dropped, err := dropTiedEmbedding(dir, base.LanguageModelPrefix)
	if err != nil {
		return false, err
	}
	renamed, err := renameToPEFT(dir, base.LanguageModelPrefix)
	return experts || dropped || renamed, err
}

// peftTiedEmbed is the leaf, after the language model's prefix, of the factors of the
// embedding LoRA PEFT saves for a model with tied embeddings under ensure_weight_tying:
// lora_embedding_A is the head's lora_B transposed and lora_embedding_B its lora_A
// transposed, one storage in PEFT, saved twice.
const peftTiedEmbed = "embed_tokens.lora_embedding_"

// dropTiedEmbedding rewrites dir's adapter_model.safetensors without PEFT's tied embedding
// factors when it also holds the head's (lm_head) pair, which carries the same numbers, and
// names the head instead of the embedding in target_modules (PEFT writes
// "model.embed_tokens"); ensure_weight_tying stays as PEFT wrote it. It returns whether it
// changed anything. Tensor data is copied as stored.
func dropTiedEmbedding(dir, lm string) (bool, error) {
	emb := peftModel + peftTiedEmbed
	if lm != "" {
		emb = "base_model.model." + lm + peftTiedEmbed
	}
	wp := filepath.Join(dir, peft.AdapterWeightsFile)
	sf, err := safetensors.OpenLimited(wp, safetensors.Limits{MaxHeaderBytes: MaxHeaderBytes})
	if err != nil {
		return false, fmt.Errorf("%s: %w", peft.AdapterWeightsFile, err)
	}
	defer sf.Close()
	hasHead, drop := false, 0
	for k := range sf.Tensors {
		hasHead = hasHead || strings.HasPrefix(k, peftHead)
		if strings.HasPrefix(k, emb) {
			drop++
		}
	}
	if drop == 0 || !hasHead {
		return false, nil
	}
	type kept struct {
		name string
		info safetensors.Info
	}
	var ks []kept
	for k, info := range sf.Tensors {
		if !strings.HasPrefix(k, emb) {
			ks = append(ks, kept{k, info})
		}
	}
	slices.SortFunc(ks, func(a, b kept) int { return cmp.Compare(a.info.Offsets[0], b.info.Offsets[0]) })
	out := make(map[string]safetensors.Info, len(ks))
	var end int64
	for _, k := range ks {
		n := k.info.Offsets[1] - k.info.Offsets[0]
		info := k.info
		info.Offsets = [2]int64{end, end + n}
		out[k.name] = info
		end += n
	}
	hdr, err := safetensors.EncodeHeader(out, sf.Metadata)
	if err != nil {
		return false, err
	}
	src, err := os.Open(wp)
	if err != nil {
		return false, err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, ".convert-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(hdr)
	for _, k := range ks {
		if err != nil {
			break
		}
		o := k.info.Offsets
		_, err = io.Copy(tmp, io.NewSectionReader(src, sf.DataOffset()+o[0], o[1]-o[0]))
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
	nb, changed, err := RenameTargetModules(cb, map[string]string{"model.embed_tokens": peftHeadModule, "embed_tokens": peftHeadModule,
		lm + cookbookTiedHeadLeaf: peftHeadModule})
	if err != nil {
		return false, err
	}
	if changed {
		if err := os.WriteFile(cp, nb, 0o644); err != nil {
			return false, err
		}
	}
	return true, os.Rename(tmp.Name(), wp)
}

// readAdapterConfig reads dir's adapter_config.json, at most peft.MaxConfigBytes of it
// (refused from its size before it is read), and returns its path.
func readAdapterConfig(dir string) (string, []byte, error) {
	cp := filepath.Join(dir, peft.AdapterConfigFile)
	b, err := bounded.ReadFile(cp, peft.MaxConfigBytes)
	return cp, b, err
}

// renameToPEFT is ToPEFT's renaming of Tinker's and the cookbook's names.
func renameToPEFT(dir, lm string) (bool, error) {
	wp := filepath.Join(dir, peft.AdapterWeightsFile)
	f, err := os.Open(wp)
	if err != nil {
		return false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	rn, err := RenameTensors(f, st.Size(), func(k string) string { return PEFTName(k, lm) })
	if err != nil {
		return false, fmt.Errorf("%s: %w", peft.AdapterWeightsFile, err)
	}
	if len(rn.Modules) == 0 {
		return false, nil
	}
	tmp, err := os.CreateTemp(dir, ".convert-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, rn); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	cp, cb, err := readAdapterConfig(dir)
	if err != nil {
		return false, err
	}
	nb, changed, err := RenameTargetModules(cb, rn.Modules)
	if err != nil {
		return false, err
	}
	for _, to := range rn.Modules {
		if to == peftHeadModule {
			// Tinker's unembedding adapts the shared matrix of a tied model (the cookbook
			// merges it so): say so as PEFT does, for the engines and for PEFT
			if nb, err = setWeightTying(nb); err != nil {
				return false, err
			}
			changed = true
			break
		}
	}
	if changed {
		if err := os.WriteFile(cp, nb, 0o644); err != nil {
			return false, err
		}
	}
	if err := os.Rename(tmp.Name(), wp); err != nil {
		return false, err
	}
	return true, nil
}
