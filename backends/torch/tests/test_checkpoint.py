"""A crafted checkpoint folder is refused with InvalidArgument before torch allocates
anything for it (issue 8, item 5), and what PEFT writes still loads."""

import json
import math
import os
import shutil
import struct

import pytest
import torch

from loops_worker.errors import INVALID_ARGUMENT, NOT_FOUND, WorkerError
from loops_worker.proto import bpb, tpb

CONFIG, WEIGHTS, OPTIM = "adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors"
QA0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
QA1 = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
QB0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
# What refusing a crafted folder may add to the peak RSS (a valid rank-4 adapter of the tiny
# model is well under a megabyte; the crafted tensors below are 1 GiB of BF16 on disk, sparse,
# which reading as float32 would turn into 2 GiB).
MAX_GROWTH = 128 << 20


@pytest.fixture(scope="module")
def saved(engine, tmp_path_factory):
    """A trained rank-4 adapter of the tiny model saved with its optimizer state."""
    from test_worker import _datum

    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="crafted-src", base_model="tiny",
                                                   lora=tpb.LoraConfig(rank=4, seed=7, train_attn=True, train_mlp=True, train_unembed=True)))
    engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="crafted-src", loss_fn="cross_entropy", data=[_datum([5, 9, 33, 70, 11, 2])])]))
    engine.optim_step(bpb.OptimStepRequest(adapter_id="crafted-src", adam=tpb.AdamParams(learning_rate=0.05)))
    d = str(tmp_path_factory.mktemp("crafted") / "src")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="crafted-src", dir=d, include_optimizer=True))
    return d


@pytest.fixture
def folder(saved, tmp_path):
    d = str(tmp_path / "ckpt")
    shutil.copytree(saved, d)
    return d


def edit_config(d, **kv):
    p = os.path.join(d, CONFIG)
    with open(p) as f:
        c = json.load(f)
    c.update(kv)
    with open(p, "w") as f:
        f.write(json.dumps(c))


def read_st(path):
    """(tensors {name: [dtype, shape, bytes or size]}, metadata), parsed by hand."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    data = b[8 + n:]
    return {k: [v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in hdr.items()}, meta


def write_st(path, tensors, meta, tamper=None):
    """Lays the tensors out in name order; an int in place of bytes is a sparse hole of that
    size; tamper may change the header (offsets included) before it is written. Data goes
    where the final header puts it (where the layout put it for entries tamper removed)."""
    hdr, at, off = {}, {}, 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for k in sorted(tensors):
        dt, shape, data = tensors[k]
        size = data if isinstance(data, int) else len(data)
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + size]}
        at[k] = off
        off += size
    if tamper:
        tamper(hdr)
    hb = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        base = 8 + len(hb)
        for k in sorted(tensors):
            data = tensors[k][2]
            if isinstance(data, int) or not data:
                continue
            f.seek(base + (hdr[k]["data_offsets"][0] if k in hdr else at[k]))
            f.write(data)
        f.truncate(base + off)


def edit_st(path, edit=None, tamper=None):
    tensors, meta = read_st(path)
    if edit:
        edit(tensors, meta)
    write_st(path, tensors, meta, tamper)


def raw_header(path, n, body):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + body)


def set_f32(t, i, v):
    assert t[0] == "F32"
    b = bytearray(t[2])
    b[4 * i:4 * i + 4] = struct.pack("<f", v)
    t[2] = bytes(b)


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_growth(fn):
    """How far the peak RSS rose above the RSS before fn (Linux: the peak is reset first)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def drop(module):
    def edit(tensors, meta):
        for k in [k for k in tensors if module in k]:
            del tensors[k]
    return edit


def rename(old, new):
    def edit(tensors, meta):
        tensors[new] = tensors.pop(old)
    return edit


W, O = (lambda d: os.path.join(d, WEIGHTS)), (lambda d: os.path.join(d, OPTIM))
CASES = [
    ("huge r", lambda d: edit_config(d, r=99999999), False, "rank limit 64"),
    ("r above the rank limit", lambda d: edit_config(d, r=65), False, "rank limit 64"),
    ("r zero", lambda d: edit_config(d, r=0), False, "r must be at least 1"),
    ("r negative", lambda d: edit_config(d, r=-3), False, "r must be at least 1"),
    ("r not an integer", lambda d: edit_config(d, r=4.5), False, "r must be an integer"),
    ("r not matching the tensors", lambda d: edit_config(d, r=8), False, "for r = 8"),
    ("NaN lora_alpha", lambda d: edit_config(d, lora_alpha=math.nan), False, "NaN is not valid JSON"),
    ("negative lora_alpha", lambda d: edit_config(d, lora_alpha=-32), False, "lora_alpha must be a finite number"),
    ("rank_pattern", lambda d: edit_config(d, rank_pattern={"q_proj": 64}), False, "rank_pattern"),
    ("config larger than the cap", lambda d: open(os.path.join(d, CONFIG), "a").write(" " * (2 << 20)), False, "larger than the limit"),
    ("config not an object", lambda d: open(os.path.join(d, CONFIG), "w").write("[1]"), False, "must hold a JSON object"),
    ("unknown target module", lambda d: edit_config(d, target_modules=["q_proj", "wq"]), False, "unknown target module 'wq'"),
    ("target_modules a regex", lambda d: edit_config(d, target_modules="all-linear"), False, "must be a list of module names"),
    ("no target modules", lambda d: edit_config(d, target_modules=[]), False, "target_modules is empty"),
    ("target_parameters not names", lambda d: edit_config(d, target_parameters=["gate_up_proj", 3]), False, "target_parameters must be a list"),
    ("expert parameters the dense model lacks", lambda d: edit_config(d, target_parameters=["gate_up_proj"]), False,
     "lists target module gate_up_proj"),
    ("listed target module without tensors", lambda d: edit_st(W(d), drop("lm_head")), False, "lists target module lm_head"),
    ("tensors of a module not listed", lambda d: edit_config(d, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
     False, "does not list"),
    ("tensor of no module of the model", lambda d: edit_st(W(d), rename(QA0, QA0.replace("layers.0", "layers.9"))), False, "is not a LoRA tensor of this model"),
    ("lora_A without lora_B", lambda d: edit_st(W(d), lambda t, m: t.pop(QB0)), False, "only one of lora_A and lora_B"),
    ("shape not matching the layer", lambda d: edit_st(W(d), lambda t, m: t.__setitem__(QA0, ["F32", [4, 32], bytes(4 * 32 * 4)])),
     False, "does the adapter belong to this base model"),
    ("huge tensor in the weights", lambda d: edit_st(W(d), lambda t, m: t.__setitem__(QA0, ["BF16", [4, 1 << 27], 1 << 30])),
     False, "has shape [4, 134217728]"),
    ("huge shape with matching offsets", lambda d: edit_st(W(d), tamper=lambda h: h.__setitem__(
        QA0, {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 1 << 42]})), False, "data_offsets"),
    ("header length 2^63", lambda d: raw_header(W(d), 1 << 63, b"{}"), False, "larger than the file"),
    ("header length beyond the file", lambda d: raw_header(W(d), 99 << 20, b"{}"), False, "larger than the file"),
    ("data after the header's JSON", lambda d: raw_header(W(d), 4, b"{}{}"), False, "bad header"),
    ("offsets past the end of the file", lambda d: os.truncate(W(d), os.path.getsize(W(d)) - 64), False, "data section holds"),
    ("overlapping offsets", lambda d: edit_st(W(d), tamper=lambda h: h[QA1].__setitem__("data_offsets", h[QA0]["data_offsets"])), False, "overlap"),
    ("a gap between tensors", lambda d: edit_st(W(d), lambda t, m: t.__setitem__("zz.gap", ["F32", [2], bytes(8)]), lambda h: h.pop("zz.gap")),
     False, "data section holds"),
    ("dtype not allowed", lambda d: edit_st(W(d), lambda t, m: t[QA0].__setitem__(0, "I32")), False, "dtype I32 is not allowed"),
    ("unknown dtype", lambda d: edit_st(W(d), lambda t, m: t[QA0].__setitem__(0, "Q4_K")), False, "unknown dtype 'Q4_K'"),
    ("too many tensors", lambda d: edit_st(W(d), lambda t, m: t.update({f"x.{i}": ["F32", [0], b""] for i in range(200)})), False, "tensors, the limit"),
    ("huge header of many tensors", lambda d: edit_st(W(d), lambda t, m: t.update({f"x.{i}": ["F32", [0], b""] for i in range(200000)})),
     False, "larger than the limit"),
    ("metadata that is not strings", lambda d: edit_st(W(d), lambda t, m: m.__setitem__("loops.seed", 5)), False, "must map strings to strings"),
    ("NaN weight", lambda d: edit_st(W(d), lambda t, m: set_f32(t[QB0], 3, math.nan)), False, "must be finite"),
    ("infinite exp_avg", lambda d: edit_st(O(d), lambda t, m: set_f32(t[QA0 + ".exp_avg"], 0, math.inf)), True, "must be finite"),
    ("negative exp_avg_sq", lambda d: edit_st(O(d), lambda t, m: set_f32(t[QA0 + ".exp_avg_sq"], 0, -1.0)), True, ">= 0"),
    ("negative step", lambda d: edit_st(O(d), lambda t, m: m.__setitem__("step", "-1")), True, "step count >= 0"),
    ("optimizer state of a tensor not in the weights", lambda d: edit_st(O(d), rename(QA0 + ".exp_avg", QA0.replace("layers.0", "layers.9") + ".exp_avg")),
     True, "is not the exp_avg or exp_avg_sq"),
    ("optimizer state missing a moment", lambda d: edit_st(O(d), lambda t, m: t.pop(QA0 + ".exp_avg_sq")), True, "want exp_avg and exp_avg_sq"),
    ("huge optimizer-state tensor", lambda d: edit_st(O(d), lambda t, m: t.__setitem__(QA0 + ".exp_avg", ["BF16", [4, 1 << 27], 1 << 30])),
     True, "has shape [4, 134217728]"),
    ("huge optimizer-state file", lambda d: edit_st(O(d), lambda t, m: t.__setitem__("zz.extra", ["BF16", [1 << 29], 1 << 30])),
     True, "tensors, the limit"),
]


@pytest.mark.parametrize("craft,optim,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_crafted_checkpoint_is_refused(engine, folder, craft, optim, want):
    craft(folder)
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="crafted", base_model="tiny",
                                                   lora=tpb.LoraConfig(rank=4, seed=9, train_attn=True)))
    try:
        before = {k: v.detach().clone() for k, v in engine.adapter("crafted").params.items()}
        err = []

        def load():
            try:
                engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="crafted", dir=folder, load_optimizer=optim))
            except WorkerError as e:
                err.append(e)

        growth = peak_growth(load)
        assert err, "the crafted checkpoint was loaded"
        assert growth < MAX_GROWTH, f"refusing the checkpoint raised the peak RSS by {growth} bytes"
        assert err[0].code == INVALID_ARGUMENT, err[0].message
        assert want in err[0].message
        after = engine.adapter("crafted").params
        assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
    finally:
        engine.delete_adapter("crafted")


def test_crafted_checkpoint_into_a_new_adapter_and_the_sampler(engine, folder):
    from loops_worker.sampler import HFSampler

    edit_config(folder, r=99999999)
    with pytest.raises(WorkerError) as e:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="crafted-new", dir=folder))
    assert e.value.code == INVALID_ARGUMENT and "rank limit" in e.value.message
    with pytest.raises(WorkerError) as e:
        HFSampler(engine).sample(bpb.SampleRequest(base_model="tiny", adapter_dir=folder, prompt=[1, 2],
                                                   params=tpb.SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0)))
    assert e.value.code == INVALID_ARGUMENT and "rank limit" in e.value.message
    edit_config(folder, r=-1)
    with pytest.raises(WorkerError) as e:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="crafted-new", dir=folder))
    assert e.value.code == INVALID_ARGUMENT and "r must be at least 1" in e.value.message
    # a folder without adapter_config.json still means: no such adapter
    with pytest.raises(WorkerError) as e:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="crafted-new", dir=os.path.dirname(folder)))
    assert e.value.code == NOT_FOUND


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_peft_variants_still_load(engine, folder, dtype):
    """BF16/F16 tensors, '.default' key names, a subset of targets listed in any order,
    data stored out of name order."""
    edit_config(folder, target_modules=["v_proj", "q_proj", "o_proj", "k_proj"])
    tensors, meta = read_st(os.path.join(folder, WEIGHTS))
    out = {}
    for k, (dt, shape, data) in tensors.items():
        if "self_attn" in k:
            t = torch.frombuffer(bytearray(data), dtype=torch.float32).to(getattr(torch, {"BF16": "bfloat16", "F16": "float16"}[dtype]))
            out[k.replace(".weight", ".default.weight")] = [dtype, shape, t.view(torch.int16).numpy().tobytes()]

    def reverse(h):
        names = sorted(k for k in h if k != "__metadata__")
        total = sum(h[k]["data_offsets"][1] - h[k]["data_offsets"][0] for k in names)
        for k in names:
            n = h[k]["data_offsets"][1] - h[k]["data_offsets"][0]
            total -= n
            h[k]["data_offsets"] = [total, total + n]

    write_st(os.path.join(folder, WEIGHTS), out, meta, reverse)
    engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="variant", dir=folder))
    try:
        ad = engine.adapter("variant")
        assert ad.spec.attn and not ad.spec.mlp and not ad.spec.unembed
        assert len(ad.params) == 2 * 4 * 2
    finally:
        engine.delete_adapter("variant")


GRADS = "gradients.safetensors"


def _pending(engine, aid, d):
    """Creates adapter aid with a pending gradient (one forward_backward, no step) and saves
    its complete training state into d."""
    from test_worker import _datum

    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="tiny",
                                                   lora=tpb.LoraConfig(rank=4, seed=3, train_attn=True, train_mlp=True, train_unembed=True)))
    engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id=aid, loss_fn="cross_entropy", data=[_datum([5, 9, 33, 70, 11, 2])])]))
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id=aid, dir=d, include_optimizer=True, include_gradients=True))


def test_gradients_round_trip(engine, tmp_path):
    # an adapter offloaded between forward_backward and optim_step comes back with its
    # accumulated gradient, bit for bit; a parameter without one is stored as -0.0
    d = str(tmp_path / "spill")
    _pending(engine, "grad-src", d)
    src = engine.adapter("grad-src")
    engine.delete_adapter("grad-src")
    engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="grad-src", dir=d, load_optimizer=True, load_gradients=True))
    back = engine.adapter("grad-src")
    for k, p in src.params.items():
        assert torch.equal(p.grad.view(torch.int32), back.params[k].grad.view(torch.int32)), k
    tensors, _ = read_st(os.path.join(d, GRADS))
    assert sorted(tensors) == sorted(k + ".grad" for k in src.params)
    engine.optim_step(bpb.OptimStepRequest(adapter_id="grad-src", adam=tpb.AdamParams(learning_rate=0.05)))
    d2 = str(tmp_path / "after-step")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="grad-src", dir=d2, include_gradients=True))
    for k, (dt, shape, b) in read_st(os.path.join(d2, GRADS))[0].items():
        assert dt == "F32" and b == struct.pack("<f", -0.0) * math.prod(shape), k
    engine.delete_adapter("grad-src")


@pytest.mark.parametrize("craft,want", [
    (lambda d: os.remove(os.path.join(d, GRADS)), "could not be read"),
    (lambda d: edit_st(os.path.join(d, GRADS), lambda t, m: t.pop(QA0 + ".grad")), "want one gradient for each"),
    (lambda d: edit_st(os.path.join(d, GRADS), lambda t, m: t.__setitem__("nope.grad", t.pop(QA0 + ".grad"))), "is not the gradient of a tensor"),
    (lambda d: edit_st(os.path.join(d, GRADS), lambda t, m: t[QA0 + ".grad"].__setitem__(1, list(reversed(t[QA0 + ".grad"][1])))), "has shape"),
    (lambda d: edit_st(os.path.join(d, GRADS), lambda t, m: set_f32(t[QA0 + ".grad"], 2, math.nan)), "values must be finite"),
])
def test_crafted_gradients_are_refused(engine, tmp_path, craft, want):
    d = str(tmp_path / "spill")
    _pending(engine, "grad-bad", d)
    before = {k: p.grad.clone() for k, p in engine.adapter("grad-bad").params.items()}
    craft(d)
    with pytest.raises(WorkerError) as ei:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="grad-bad", dir=d, load_optimizer=True, load_gradients=True))
    assert ei.value.code == INVALID_ARGUMENT and want in ei.value.message, ei.value.message
    for k, p in engine.adapter("grad-bad").params.items():
        assert torch.equal(p.grad, before[k]), k
    engine.delete_adapter("grad-bad")
