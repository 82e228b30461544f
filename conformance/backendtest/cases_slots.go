package backendtest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/conformance/oracle"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Files of a saved adapter folder compared byte for byte by the slot cases.
const (
	weightsFile   = "adapter_model.safetensors"
	optimizerFile = "optimizer.safetensors"
	gradientsFile = "gradients.safetensors"
)

// slotCases check adapter slots (loops.backend.v1 SaveAdapter): an adapter offloaded with
// its complete training state (SaveAdapter with include_optimizer and include_gradients,
// then DeleteAdapter) and restored (LoadAdapter with load_optimizer and load_gradients)
// continues bit-identically, at any point of its training.
func slotCases() []testCase {
	return []testCase{
		{"slots/capabilities", func(h *harness) {
			resp, err := h.tr.GetCapabilities(h.ctx, &backendv1.GetCapabilitiesRequest{})
			require.NoError(h.t, err)
			require.Positive(h.t, resp.GetMaxAdapters(), "max_adapters: the trainer's adapter slots")
			require.True(h.t, resp.GetSavesGradients(), "saves_gradients: the trainer must honour include_gradients and load_gradients")
		}},
		{"slots/interleaved_one_slot", func(h *harness) { h.slotsInterleaved(3) }},
		{"slots/load_gradients", func(h *harness) {
			// the saved gradient is the accumulated one: restored with it, the step equals the
			// resident adapter's; restored without it, the pending gradient is dropped
			ce := oracle.Loss{Name: "cross_entropy"}
			lc := loraConfig()
			dir, _ := h.warm(lc)
			a := h.loadFresh(dir, lc)
			h.fb(a, ce, []example{h.ceExample(9, nil)}, false)
			h.fb(a, ce, []example{h.ceExample(6, []float64{1, -0.5, 2, 1, 0.25, 1})}, false)
			spill := h.dir("spill")
			h.offload(a, spill, false)
			b, c := h.create(lc), h.create(lc)
			_, err := h.tr.LoadAdapter(h.ctx, &backendv1.LoadAdapterRequest{AdapterId: b, Dir: spill, LoadOptimizer: true, LoadGradients: true})
			require.NoError(h.t, err, "LoadAdapter with load_gradients")
			_, err = h.tr.LoadAdapter(h.ctx, &backendv1.LoadAdapterRequest{AdapterId: c, Dir: spill, LoadOptimizer: true})
			require.NoError(h.t, err, "LoadAdapter without load_gradients")
			h.restore(a, spill)
			p := defaultAdam(1e-2)
			ga, gb, gc := h.step(a, p), h.step(b, p), h.step(c, p)
			require.Equal(h.t, ga.GetMetrics()["grad_norm:mean"], gb.GetMetrics()["grad_norm:mean"], "grad_norm with the restored gradient")
			require.Zero(h.t, gc.GetMetrics()["grad_norm:mean"], "grad_norm after a load without load_gradients: nothing is pending")
			da, db, dc := h.save(a, true), h.save(b, true), h.save(c, true)
			h.sameFiles("restored with gradients vs offloaded and restored", da, db, weightsFile, optimizerFile)
			wa, err := readSafetensors(filepath.Join(da, weightsFile))
			require.NoError(h.t, err)
			wc, err := readSafetensors(filepath.Join(dc, weightsFile))
			require.NoError(h.t, err)
			differ := false
			for k, t := range wa.tensors {
				differ = differ || !bytes.Equal(t.data, wc.tensors[k].data)
			}
			require.True(h.t, differ, "a step without the restored gradient must differ (the gradient was not zero)")
		}},
		{"slots/load_gradients_missing", func(h *harness) {
			// load_gradients needs gradients.safetensors: a folder without it is refused and
			// the adapter is left as it was
			ce := oracle.Loss{Name: "cross_entropy"}
			lc := loraConfig()
			a := h.create(lc)
			d := h.save(a, true)
			h.fb(a, ce, []example{h.ceExample(7, nil)}, false)
			before := h.dir("before")
			h.saveState(a, before)
			_, err := h.tr.LoadAdapter(h.ctx, &backendv1.LoadAdapterRequest{AdapterId: a, Dir: d, LoadOptimizer: true, LoadGradients: true})
			require.Error(h.t, err, "LoadAdapter with load_gradients from a folder without gradients.safetensors")
			require.Equal(h.t, connect.CodeInvalidArgument, code(err), "%v", err)
			after := h.dir("after")
			h.saveState(a, after)
			h.sameFiles("after a refused load", before, after, weightsFile, optimizerFile, gradientsFile)
		}},
	}
}

// saveState saves an adapter's complete training state into dir.
func (h *harness) saveState(id, dir string) {
	h.t.Helper()
	_, err := h.tr.SaveAdapter(h.ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: dir, IncludeOptimizer: true, IncludeGradients: true})
	require.NoError(h.t, err, "SaveAdapter with include_optimizer and include_gradients")
}

// offload saves an adapter's complete training state into dir and, with free, deletes it
// from the trainer (freeing its slot).
func (h *harness) offload(id, dir string, free bool) {
	h.t.Helper()
	h.saveState(id, dir)
	if free {
		_, err := h.tr.DeleteAdapter(h.ctx, &backendv1.DeleteAdapterRequest{AdapterId: id})
		require.NoError(h.t, err, "DeleteAdapter")
	}
}

// restore loads an adapter's complete training state from dir (re-creating a deleted one).
func (h *harness) restore(id, dir string) {
	h.t.Helper()
	_, err := h.tr.LoadAdapter(h.ctx, &backendv1.LoadAdapterRequest{AdapterId: id, Dir: dir, LoadOptimizer: true, LoadGradients: true})
	require.NoError(h.t, err, "LoadAdapter with load_optimizer and load_gradients")
}

// sameFiles requires the named safetensors files of two adapter folders to hold the same
// metadata and the same tensors, bit for bit (dtype, shape and bytes; the order of the
// header's entries may differ).
func (h *harness) sameFiles(what, a, b string, names ...string) {
	h.t.Helper()
	for _, n := range names {
		x, err := readSafetensors(filepath.Join(a, n))
		require.NoError(h.t, err, "%s: %s", what, n)
		y, err := readSafetensors(filepath.Join(b, n))
		require.NoError(h.t, err, "%s: %s", what, n)
		require.Equal(h.t, x.meta, y.meta, "%s: %s: metadata differs", what, n)
		require.Equal(h.t, len(x.tensors), len(y.tensors), "%s: %s: tensor count differs", what, n)
		for k, tx := range x.tensors {
			ty, ok := y.tensors[k]
			require.True(h.t, ok, "%s: %s: %s is missing", what, n, k)
			require.Equal(h.t, tx.dtype, ty.dtype, "%s: %s: dtype of %s", what, n, k)
			require.Equal(h.t, tx.shape, ty.shape, "%s: %s: shape of %s", what, n, k)
			require.True(h.t, bytes.Equal(tx.data, ty.data), "%s: %s: %s differs", what, n, k)
		}
	}
}

type rawTensor struct {
	dtype string
	shape []int64
	data  []byte
}

type rawSafetensors struct {
	meta    map[string]string
	tensors map[string]rawTensor
}

// readSafetensors reads a safetensors file the suite's backend wrote, keeping each
// tensor's bytes as stored.
func readSafetensors(path string) (*rawSafetensors, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("%s: too short", path)
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("%s: header length %d past the end", path, n)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	data := b[8+n:]
	out := &rawSafetensors{meta: map[string]string{}, tensors: map[string]rawTensor{}}
	for k, v := range hdr {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &out.meta); err != nil {
				return nil, fmt.Errorf("%s: __metadata__: %w", path, err)
			}
			continue
		}
		var e struct {
			DType   string   `json:"dtype"`
			Shape   []int64  `json:"shape"`
			Offsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, k, err)
		}
		if len(e.Offsets) != 2 || e.Offsets[0] > e.Offsets[1] || e.Offsets[1] > uint64(len(data)) {
			return nil, fmt.Errorf("%s: %s: bad data_offsets %v", path, k, e.Offsets)
		}
		out.tensors[k] = rawTensor{dtype: e.DType, shape: e.Shape, data: data[e.Offsets[0]:e.Offsets[1]]}
	}
	return out, nil
}

// slotsInterleaved trains k runs twice: kept resident (k slots), and through one slot,
// each run offloaded after every call and restored before its next one, so another run's
// forward_backward always comes between a run's forward_backward calls and between its
// last forward_backward and its optim_step. Every loss, log-prob, optimizer metric and the
// final weights, Adam state and pending gradient must be bit-identical.
func (h *harness) slotsInterleaved(k int) {
	ce := oracle.Loss{Name: "cross_entropy"}
	is := oracle.Loss{Name: "importance_sampling"}
	const steps, calls = 2, 2
	type op struct {
		run  int
		data []example // nil: optim_step
	}
	lcs := make([]*loopsv1.LoraConfig, k)
	losses := make([]oracle.Loss, k)
	adams := make([]oracle.AdamParams, k)
	for r := range k {
		lc := loraConfig()
		lc.Seed = uint64(11 + r)
		lcs[r] = lc
		losses[r] = ce
		adams[r] = defaultAdam(1e-2 * float64(r+1))
	}
	adams[k-1].WeightDecay, adams[k-1].GradClipNorm = 0.1, 0.05
	// the last run trains on importance_sampling, with sampler log-probs taken from its
	// initial adapter
	probe := h.create(lcs[k-1])
	initial := h.oracleAdapter(h.save(probe, false))
	losses[k-1] = is
	mk := func(r, n int) example {
		if losses[r].Name == is.Name {
			return h.rlExample(n, initial, []float64{0.8, 1.1, 1.3}, []float64{1, -0.5, 2})
		}
		return h.ceExample(n, nil)
	}
	var ops []op
	for s := range steps {
		for c := range calls {
			for r := range k {
				ops = append(ops, op{run: r, data: []example{mk(r, 5+2*r+c), mk(r, 4+s)}})
			}
		}
		for r := range k {
			ops = append(ops, op{run: r})
		}
	}
	// a pending gradient at the end, so the final comparison covers gradients.safetensors
	for r := range k {
		ops = append(ops, op{run: r, data: []example{mk(r, 6)}})
	}

	run := func(ids []string, before, after func(r int)) []proto.Message {
		var out []proto.Message
		for _, o := range ops {
			before(o.run)
			if o.data == nil {
				out = append(out, h.step(ids[o.run], adams[o.run]))
			} else {
				out = append(out, h.fb(ids[o.run], losses[o.run], o.data, false))
			}
			after(o.run)
		}
		return out
	}
	none := func(int) {}

	resident := make([]string, k)
	for r := range k {
		resident[r] = h.create(lcs[r])
	}
	want := run(resident, none, none)

	slotted := make([]string, k)
	spill := make([]string, k)
	for r := range k {
		slotted[r] = h.create(lcs[r])
		spill[r] = h.dir(fmt.Sprintf("spill-run%d", r))
		h.offload(slotted[r], spill[r], true)
	}
	got := run(slotted, func(r int) { h.restore(slotted[r], spill[r]) }, func(r int) {
		spill[r] = h.dir(fmt.Sprintf("spill-run%d", r))
		h.offload(slotted[r], spill[r], true)
	})
	require.Len(h.t, got, len(want))
	for i := range want {
		require.True(h.t, proto.Equal(want[i], got[i]), "call %d (run %d, %s): the result through one slot differs from the resident run's",
			i, ops[i].run, map[bool]string{true: "optim_step", false: "forward_backward"}[ops[i].data == nil])
	}
	for r := range k {
		h.restore(slotted[r], spill[r])
		a, b := h.dir(fmt.Sprintf("final-resident%d", r)), h.dir(fmt.Sprintf("final-slotted%d", r))
		h.saveState(resident[r], a)
		h.saveState(slotted[r], b)
		h.sameFiles(fmt.Sprintf("run %d: resident vs through one slot", r), a, b, weightsFile, optimizerFile, gradientsFile)
	}
}
