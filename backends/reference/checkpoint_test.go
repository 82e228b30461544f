package reference

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// maxLoadAlloc bounds what refusing a crafted checkpoint may allocate. A valid rank-32
// adapter of the tiny model takes about 10 MiB; today's limits keep every refusal far below.
const maxLoadAlloc = 64 << 20

var (
	srcOnce sync.Once
	srcDir  string
)

// validCheckpoint saves a trained rank-8 adapter of the tiny model with its optimizer
// state (once) and returns a fresh copy of its folder.
func validCheckpoint(t *testing.T) string {
	t.Helper()
	e := engine(t)
	srcOnce.Do(func() {
		createAdapter(t, e, "crafted-src", 8, 5)
		fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "crafted-src", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
		_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "crafted-src", Adam: &loopsv1.AdamParams{LearningRate: 1e-2}})
		require.NoError(t, err)
		srcDir = filepath.Join(engDir, "crafted-src")
		_, err = e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "crafted-src", Dir: srcDir, IncludeOptimizer: true})
		require.NoError(t, err)
	})
	require.NotEmpty(t, srcDir, "the source checkpoint was not saved")
	dir := t.TempDir()
	for _, name := range []string{peft.AdapterConfigFile, peft.AdapterWeightsFile, peft.OptimizerFile} {
		b, err := os.ReadFile(filepath.Join(srcDir, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	return dir
}

// editConfig rewrites dir/adapter_config.json through edit.
func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, peft.AdapterConfigFile)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	cfg := map[string]any{}
	require.NoError(t, json.Unmarshal(b, &cfg))
	edit(cfg)
	b, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, b, 0o644))
}

// stTensor is one tensor of a safetensors file being crafted. Data nil with Size > 0
// leaves a sparse hole of Size bytes.
type stTensor struct {
	DType string
	Shape []int64
	Data  []byte
	Size  int64
}

func (s *stTensor) size() int64 {
	if s.Data != nil {
		return int64(len(s.Data))
	}
	return s.Size
}

// stFile is a safetensors file being crafted, parsed without the package under test.
type stFile struct {
	Meta    map[string]any
	Tensors map[string]*stTensor
}

func readST(t *testing.T, path string) *stFile {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	n := binary.LittleEndian.Uint64(b)
	raw := map[string]json.RawMessage{}
	require.NoError(t, json.Unmarshal(b[8:8+n], &raw))
	out := &stFile{Tensors: map[string]*stTensor{}}
	data := b[8+n:]
	for k, v := range raw {
		if k == "__metadata__" {
			require.NoError(t, json.Unmarshal(v, &out.Meta))
			continue
		}
		var info struct {
			DType   string   `json:"dtype"`
			Shape   []int64  `json:"shape"`
			Offsets [2]int64 `json:"data_offsets"`
		}
		require.NoError(t, json.Unmarshal(v, &info))
		out.Tensors[k] = &stTensor{DType: info.DType, Shape: info.Shape, Data: append([]byte(nil), data[info.Offsets[0]:info.Offsets[1]]...)}
	}
	return out
}

// write lays the tensors out contiguously in name order; tamper may then change any
// header entry (offsets included) before it is written. Data goes where the final header
// puts it (where the layout put it for entries tamper removed or sent past the end).
func (s *stFile) write(t *testing.T, path string, tamper func(hdr map[string]any)) {
	t.Helper()
	names := make([]string, 0, len(s.Tensors))
	for k := range s.Tensors {
		names = append(names, k)
	}
	sort.Strings(names)
	hdr := map[string]any{}
	if s.Meta != nil {
		hdr["__metadata__"] = s.Meta
	}
	var off int64
	for _, k := range names {
		ts := s.Tensors[k]
		hdr[k] = map[string]any{"dtype": ts.DType, "shape": ts.Shape, "data_offsets": []int64{off, off + ts.size()}}
		off += ts.size()
	}
	if tamper != nil {
		tamper(hdr)
	}
	hb, err := json.Marshal(hdr)
	require.NoError(t, err)
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	var lb [8]byte
	binary.LittleEndian.PutUint64(lb[:], uint64(len(hb)))
	_, err = f.Write(append(lb[:], hb...))
	require.NoError(t, err)
	base, end := int64(8+len(hb)), off
	off = 0
	for _, k := range names {
		ts := s.Tensors[k]
		at := off
		if e, ok := hdr[k].(map[string]any); ok {
			if o, ok := e["data_offsets"].([]int64); ok && o[0]+ts.size() <= end {
				at = o[0]
			}
		}
		if len(ts.Data) > 0 {
			_, err = f.WriteAt(ts.Data, base+at)
			require.NoError(t, err)
		}
		off += ts.size()
	}
	require.NoError(t, f.Truncate(base+end))
}

func editST(t *testing.T, path string, edit func(*stFile), tamper func(map[string]any)) {
	t.Helper()
	s := readST(t, path)
	if edit != nil {
		edit(s)
	}
	s.write(t, path, tamper)
}

// writeRawHeader replaces path with a header length field n followed by body.
func writeRawHeader(t *testing.T, path string, n uint64, body string) {
	t.Helper()
	var lb [8]byte
	binary.LittleEndian.PutUint64(lb[:], n)
	require.NoError(t, os.WriteFile(path, append(lb[:], body...), 0o644))
}

const (
	qA0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
	qA1 = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
	qB0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
)

func setF32(t *testing.T, ts *stTensor, i int, v float32) {
	t.Helper()
	require.Equal(t, "F32", ts.DType)
	binary.LittleEndian.PutUint32(ts.Data[4*i:], math.Float32bits(v))
}

func weights(dir string) string   { return filepath.Join(dir, peft.AdapterWeightsFile) }
func optimizer(dir string) string { return filepath.Join(dir, peft.OptimizerFile) }

// allocDuring returns the bytes allocated while f runs.
func allocDuring(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Every field a checkpoint folder declares is checked against the base model and the
// engine's limits before anything is allocated for it: each crafted folder is refused with
// InvalidArgument and a clear message, allocating little, and the adapter it was loaded
// into keeps its weights.
func TestLoadAdapterRefusesCraftedCheckpoints(t *testing.T) {
	e := engine(t)
	maxRank := e.opts.MaxLoraRank
	removeModule := func(module string) func(*stFile) {
		return func(s *stFile) {
			for k := range s.Tensors {
				if strings.Contains(k, module) {
					delete(s.Tensors, k)
				}
			}
		}
	}
	for _, tc := range []struct {
		name    string
		craft   func(t *testing.T, dir string)
		optim   bool
		wantErr string
	}{
		{"huge r", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["r"] = 99999999 })
		}, false, fmt.Sprintf("rank limit %d", maxRank)},
		{"r above the rank limit", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["r"] = 512 })
		}, false, fmt.Sprintf("rank limit %d", maxRank)},
		{"r zero", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["r"] = 0 })
		}, false, "r must be at least 1"},
		{"r negative", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["r"] = -3 })
		}, false, "r must be at least 1"},
		{"r not matching the tensors", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["r"] = 4 })
		}, false, "for r = 4"},
		{"negative lora_alpha", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["lora_alpha"] = -32 })
		}, false, "lora_alpha must be a finite number"},
		{"rank_pattern", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["rank_pattern"] = map[string]any{"q_proj": 64} })
		}, false, "rank_pattern"},
		{"config larger than the cap", func(t *testing.T, dir string) {
			p := filepath.Join(dir, peft.AdapterConfigFile)
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, append(b, bytes.Repeat([]byte(" "), 2<<20)...), 0o644))
		}, false, "larger than the limit"},
		{"unknown target module", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["target_modules"] = []string{"q_proj", "wq"} })
		}, false, `unknown target module "wq"`},
		{"no target modules", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["target_modules"] = []string{} })
		}, false, "target_modules is empty"},
		{"listed target module without tensors", func(t *testing.T, dir string) {
			editST(t, weights(dir), removeModule("lm_head"), nil)
		}, false, "lists target module lm_head"},
		{"tensors of a module not listed", func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["target_modules"] = []string{"q_proj", "k_proj", "v_proj", "o_proj"} })
		}, false, "does not list"},
		{"tensor of no module of the model", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) {
				s.Tensors["base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight"] = s.Tensors[qA0]
				delete(s.Tensors, qA0)
			}, nil)
		}, false, "is not a LoRA tensor of this model"},
		{"lora_A without lora_B", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) { delete(s.Tensors, qB0) }, nil)
		}, false, "only one of lora_A and lora_B"},
		{"shape not matching the layer", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) {
				s.Tensors[qA0] = &stTensor{DType: "F32", Shape: []int64{8, 128}, Data: make([]byte, 8*128*4)}
			}, nil)
		}, false, "does the adapter belong to this base model"},
		{"huge shape with matching offsets", func(t *testing.T, dir string) {
			editST(t, weights(dir), nil, func(h map[string]any) {
				h[qA0] = map[string]any{"dtype": "F32", "shape": []int64{1 << 20, 1 << 20}, "data_offsets": []int64{0, 1 << 42}}
			})
		}, false, "data_offsets"},
		{"header length 2^63", func(t *testing.T, dir string) {
			writeRawHeader(t, weights(dir), 1<<63, "{}")
		}, false, "larger than the file"},
		{"header length beyond the file", func(t *testing.T, dir string) {
			writeRawHeader(t, weights(dir), 99<<20, "{}")
		}, false, "larger than the file"},
		{"data after the header's JSON", func(t *testing.T, dir string) {
			writeRawHeader(t, weights(dir), 4, "{}{}")
		}, false, "data after the JSON object"},
		{"offsets past the end of the file", func(t *testing.T, dir string) {
			p := weights(dir)
			st, err := os.Stat(p)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(p, st.Size()-64))
		}, false, "data section holds"},
		{"overlapping offsets", func(t *testing.T, dir string) {
			editST(t, weights(dir), nil, func(h map[string]any) {
				h[qA1].(map[string]any)["data_offsets"] = h[qA0].(map[string]any)["data_offsets"]
			})
		}, false, "overlap"},
		{"a gap between tensors", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) {
				s.Tensors["zz.gap"] = &stTensor{DType: "F32", Shape: []int64{2}, Data: make([]byte, 8)}
			}, func(h map[string]any) { delete(h, "zz.gap") })
		}, false, "data section holds"},
		{"dtype not allowed", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) { s.Tensors[qA0].DType = "I32" }, nil)
		}, false, "dtype I32 is not allowed"},
		{"unknown dtype", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) { s.Tensors[qA0].DType = "Q4_K" }, nil)
		}, false, `unknown dtype "Q4_K"`},
		{"too many tensors", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) {
				for i := range 200 {
					s.Tensors[fmt.Sprintf("x.%d", i)] = &stTensor{DType: "F32", Shape: []int64{0}, Data: []byte{}}
				}
			}, nil)
		}, false, "tensors, the limit"},
		{"huge header of many tensors", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) {
				for i := range 200000 {
					s.Tensors[fmt.Sprintf("x.%d", i)] = &stTensor{DType: "F32", Shape: []int64{0}, Data: []byte{}}
				}
			}, nil)
		}, false, "larger than the limit"},
		{"metadata that is not strings", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) { s.Meta["loops.seed"] = 5 }, nil)
		}, false, "__metadata__ must map strings to strings"},
		{"NaN weight", func(t *testing.T, dir string) {
			editST(t, weights(dir), func(s *stFile) { setF32(t, s.Tensors[qB0], 3, float32(math.NaN())) }, nil)
		}, false, "must be finite"},
		{"infinite exp_avg", func(t *testing.T, dir string) {
			editST(t, optimizer(dir), func(s *stFile) { setF32(t, s.Tensors[qA0+".exp_avg"], 0, float32(math.Inf(1))) }, nil)
		}, true, "must be finite"},
		{"negative exp_avg_sq", func(t *testing.T, dir string) {
			editST(t, optimizer(dir), func(s *stFile) { setF32(t, s.Tensors[qA0+".exp_avg_sq"], 0, -1) }, nil)
		}, true, ">= 0"},
		{"negative step", func(t *testing.T, dir string) {
			editST(t, optimizer(dir), func(s *stFile) { s.Meta["step"] = "-1" }, nil)
		}, true, "step count >= 0"},
		{"optimizer state of a tensor not in the weights", func(t *testing.T, dir string) {
			editST(t, optimizer(dir), func(s *stFile) {
				s.Tensors["base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight.exp_avg"] = s.Tensors[qA0+".exp_avg"]
				delete(s.Tensors, qA0+".exp_avg")
			}, nil)
		}, true, "is not the exp_avg or exp_avg_sq"},
		{"optimizer state missing a moment", func(t *testing.T, dir string) {
			editST(t, optimizer(dir), func(s *stFile) { delete(s.Tensors, qA0+".exp_avg_sq") }, nil)
		}, true, "want exp_avg and exp_avg_sq"},
		{"huge optimizer-state tensor", func(t *testing.T, dir string) {
			editST(t, optimizer(dir), func(s *stFile) {
				s.Tensors[qA0+".exp_avg"] = &stTensor{DType: "F32", Shape: []int64{8, 1 << 22}, Size: 8 << 24}
			}, nil)
		}, true, "has shape [8 4194304]"},
		{"huge optimizer-state file", func(t *testing.T, dir string) {
			p := optimizer(dir)
			st, err := os.Stat(p)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(p, st.Size()+256<<20))
		}, true, "data section holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := validCheckpoint(t)
			tc.craft(t, dir)
			createAdapter(t, e, "crafted", 8, 9)
			before := append([]float32(nil), adapterState_(t, e, "crafted").Params[0].W...)
			var err error
			alloc := allocDuring(func() {
				_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "crafted", Dir: dir, LoadOptimizer: tc.optim})
			})
			require.Error(t, err)
			require.Less(t, alloc, uint64(maxLoadAlloc), "refusing the checkpoint allocated %d bytes", alloc)
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), tc.wantErr)
			require.Equal(t, before, adapterState_(t, e, "crafted").Params[0].W, "a refused load changed the adapter")
		})
	}
}

// The sampler and a load into an adapter that does not exist yet go through the same
// checks; an invalid adapter_config.json is named, not reported as a missing adapter.
func TestCraftedCheckpointRefusedBySamplerAndNewAdapter(t *testing.T) {
	e := engine(t)
	dir := validCheckpoint(t)
	editConfig(t, dir, func(c map[string]any) { c["r"] = 99999999 })
	var err error
	alloc := allocDuring(func() {
		_, err = e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: dir, Prompt: []int32{1, 2},
			Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 1, TopP: 1}})
	})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "rank limit")
	require.Less(t, alloc, uint64(maxLoadAlloc))

	_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "crafted-new", Dir: dir})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "rank limit")
	editConfig(t, dir, func(c map[string]any) { c["r"] = -1 })
	_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "crafted-new", Dir: dir})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "r must be at least 1")
	// a folder without adapter_config.json still means: no such adapter
	_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "crafted-new", Dir: t.TempDir()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "%v", err)
}

// What PEFT writes still loads: BF16 and F16 tensors, ".default" key names, a subset of
// the targets listed in any order, tensors stored out of name order.
func TestLoadAdapterAcceptsPEFTVariants(t *testing.T) {
	e := engine(t)
	createAdapter(t, e, "variant", 8, 9)
	for _, dtype := range []string{"BF16", "F16"} {
		t.Run(dtype, func(t *testing.T) {
			dir := validCheckpoint(t)
			editConfig(t, dir, func(c map[string]any) { c["target_modules"] = []string{"v_proj", "q_proj", "o_proj", "k_proj"} })
			editST(t, weights(dir), func(s *stFile) {
				all := s.Tensors
				s.Tensors = map[string]*stTensor{}
				for k, ts := range all {
					if !strings.Contains(k, "self_attn") {
						continue
					}
					out := make([]byte, len(ts.Data)/2)
					for i := range out[:len(out)/2] {
						v := math.Float32frombits(binary.LittleEndian.Uint32(ts.Data[4*i:]))
						binary.LittleEndian.PutUint16(out[2*i:], toHalf(dtype, v))
					}
					s.Tensors[strings.Replace(k, ".weight", ".default.weight", 1)] = &stTensor{DType: dtype, Shape: ts.Shape, Data: out}
				}
			}, func(h map[string]any) {
				// reverse the data order: offsets need not follow names
				var names []string
				var total int64
				for k, v := range h {
					if k != "__metadata__" {
						names = append(names, k)
						o := v.(map[string]any)["data_offsets"].([]int64)
						total += o[1] - o[0]
					}
				}
				sort.Strings(names)
				for _, k := range names {
					o := h[k].(map[string]any)["data_offsets"].([]int64)
					n := o[1] - o[0]
					total -= n
					h[k].(map[string]any)["data_offsets"] = []int64{total, total + n}
				}
			})
			_, err := e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "variant", Dir: dir})
			require.NoError(t, err)
			ad := adapterState_(t, e, "variant")
			require.True(t, ad.Cfg.Attn)
			require.False(t, ad.Cfg.MLP)
			require.False(t, ad.Cfg.Unembed)
			require.Len(t, ad.Params, 4*4*2)
			fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "variant", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(seqA)}})
		})
	}
}

// toHalf rounds v to BF16 or F16 bits (by truncation; the values only need to be finite).
func toHalf(dtype string, v float32) uint16 {
	b := math.Float32bits(v)
	if dtype == "BF16" {
		return uint16(b >> 16)
	}
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	switch {
	case exp <= 0:
		return sign
	case exp >= 31:
		return sign | 0x7bff
	}
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}
