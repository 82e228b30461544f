"""The shared PEFT-compatible adapter folder format (see backends/reference/nn/checkpoint.go).

adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules,
bias none, base_model_name_or_path. adapter_model.safetensors: F32, PEFT keys
base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight [r, in] / lora_B.weight
[out, r], metadata loops.seed. optimizer.safetensors (training checkpoints): <key>.exp_avg,
<key>.exp_avg_sq, metadata step. gradients.safetensors (an adapter offloaded from its slot
between forward_backward and optim_step): <key>.grad, F32, the accumulated gradient; a
parameter without one (.grad None) is stored as -0.0, the additive identity, so a restored
adapter accumulates and steps bit-identically.

Loading checks a folder as the reference engine's nn.LoadAdapter does, before torch
allocates anything for it (check_folder): adapter_config.json is read with a size cap, the
safetensors headers are parsed here (header length against the file, tensor count, dtypes,
shapes, offsets tiling the data section), every tensor name and shape is matched against the
base model's LoRA modules and r, r against the worker's rank limit; tensor values must be
finite.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .families import all_target_names

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER = "optimizer.safetensors"
GRADIENTS = "gradients.safetensors"
# adapter_config.json cap (nn.MaxConfigBytes); PEFT writes about a kilobyte.
MAX_CONFIG_BYTES = 256 << 10
# The module and parameter names an adapter_config.json may list (every family's targets).
TARGET_MODULES = all_target_names()
# target_modules names PEFT writes for the tied input embedding under ensure_weight_tying
TIED_EMBED_MODULES = ("model.embed_tokens", "embed_tokens", "model.language_model.embed_tokens")
PEFT_HEAD = "base_model.model.lm_head"
# (a vision-language checkpoint's language model: model.language_model.embed_tokens)
PEFT_TIED_EMBED = ("base_model.model.model.embed_tokens.lora_embedding_",
                   "base_model.model.model.language_model.embed_tokens.lora_embedding_")
# The dtypes an adapter's tensors may have (safetensors.FloatDTypes).
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
# Byte sizes of the dtypes of the safetensors specification.
ELEM_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}


# exclude_modules of an adapter on a vision-language checkpoint's language model: PEFT on the
# full VL model then adapts only what the worker trained (the vision tower of Gemma 3 has
# q/k/v_proj too); a regex PEFT full-matches against module names
VL_EXCLUDE = r"(?!model\.language_model\.)(?!lm_head$).*"


def peft_config(rank: int, alpha: float, target_modules, base_model: str, tied_embed: bool = False,
                target_parameters=(), vision: bool = False, exclude: str = "") -> dict:
    """adapter_config.json. Field order and values as the reference engine writes them;
    ensure_weight_tying (PEFT's field) marks a tied model's head LoRA that adapts the shared
    matrix; target_parameters (fused MoE expert parameters, PEFT's ParamWrapper) only when set;
    exclude: the family's regex of module names not adapted despite a target leaf name
    (families.Family.exclude), joined with VL_EXCLUDE on a vision-language checkpoint."""
    cfg = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0,
        "target_modules": list(target_modules),
        "bias": "none",
        "base_model_name_or_path": base_model,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
    }
    if tied_embed:
        cfg["ensure_weight_tying"] = True
    if target_parameters:
        cfg["target_parameters"] = list(target_parameters)
    ex = [e for e in (VL_EXCLUDE if vision else "", exclude) if e]
    if ex:
        cfg["exclude_modules"] = ex[0] if len(ex) == 1 else "|".join(f"(?:{e})" for e in ex)
    return cfg


def save(dir_: str, adapter, base_model: str, with_optimizer: bool, with_gradients: bool = False) -> int:
    os.makedirs(dir_, exist_ok=True)
    alpha = adapter.scale * adapter.spec.rank
    if abs(alpha - 32.0) < 1e-9:
        alpha = 32
    mods, params = adapter.targets()
    cfg = json.dumps(peft_config(adapter.spec.rank, alpha, mods, base_model,
                                 getattr(adapter, "tied_embed", False), params,
                                 getattr(adapter.base, "vision_checkpoint", False),
                                 getattr(getattr(adapter.base, "family", None), "exclude", "")), indent=2) + "\n"
    with open(os.path.join(dir_, ADAPTER_CONFIG), "w") as f:
        f.write(cfg)
    total = len(cfg.encode())
    ws = {k: p.detach().to("cpu", torch.float32).contiguous() for k, p in adapter.params.items()}
    path = os.path.join(dir_, ADAPTER_WEIGHTS)
    meta = {"format": "pt", "loops.seed": str(adapter.spec.seed)}
    if adapter.spec.unembed:
        # peft.UnembedMetaKey: which rule the unembedding LoRA follows
        meta["loops.unembed"] = "head-only" if getattr(adapter, "head_only_tied", False) else "shared"
    save_file(ws, path, metadata=meta)
    total += os.path.getsize(path)
    if with_optimizer:
        os_: Dict[str, torch.Tensor] = {}
        for k in adapter.params:
            os_[k + ".exp_avg"] = adapter.exp_avg[k].detach().to("cpu", torch.float32).contiguous()
            os_[k + ".exp_avg_sq"] = adapter.exp_avg_sq[k].detach().to("cpu", torch.float32).contiguous()
        path = os.path.join(dir_, OPTIMIZER)
        save_file(os_, path, metadata={"format": "pt", "step": str(adapter.step), "optimizer": "adamw"})
        total += os.path.getsize(path)
    if with_gradients:
        gs: Dict[str, torch.Tensor] = {}
        for k, p in adapter.params.items():
            if p.grad is None:
                gs[k + ".grad"] = torch.full(tuple(p.shape), -0.0, dtype=torch.float32)
            else:
                gs[k + ".grad"] = p.grad.detach().to("cpu", torch.float32).contiguous()
        path = os.path.join(dir_, GRADIENTS)
        save_file(gs, path, metadata={"format": "pt"})
        total += os.path.getsize(path)
    return total


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _open_regular(path: str):
    """Opens a regular file for reading; a FIFO, device or folder is refused before it is
    opened (opening a FIFO would block)."""
    name = os.path.basename(path)
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{name} is not a regular file")
    f = open(path, "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise ValueError(f"{name} is not a regular file")
    return f


def _read_capped(path: str, limit: int) -> bytes:
    name = os.path.basename(path)
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ValueError(f"{name} is {size} bytes, larger than the limit of {limit}")
        b = f.read(limit + 1)
    if len(b) > limit:
        raise ValueError(f"{name} is larger than the limit of {limit} bytes")
    return b


def read_config(dir_: str) -> dict:
    """adapter_config.json (at most MAX_CONFIG_BYTES), checked as nn.ReadPEFTConfig does:
    a LoRA adapter with an integer r >= 1, a finite lora_alpha >= 0 (0: the default), known
    target_modules, and none of the PEFT options this worker cannot apply."""
    b = _read_capped(os.path.join(dir_, ADAPTER_CONFIG), MAX_CONFIG_BYTES)
    try:
        c = json.loads(b, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{ADAPTER_CONFIG}: {e}") from None
    if not isinstance(c, dict):
        raise ValueError(f"{ADAPTER_CONFIG} must hold a JSON object")
    if c.get("peft_type") not in (None, "", "LORA"):
        raise ValueError(f"{ADAPTER_CONFIG}: peft_type {c.get('peft_type')!r} is not LORA")
    r = c.get("r")
    if not _is_int(r):
        raise ValueError(f"{ADAPTER_CONFIG}: r must be an integer, got {r!r}")
    if r < 1:
        raise ValueError(f"{ADAPTER_CONFIG}: r must be at least 1, got {r}")
    alpha = c.get("lora_alpha")
    if alpha is not None and not (_is_number(alpha) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"{ADAPTER_CONFIG}: lora_alpha must be a finite number >= 0, got {alpha!r}")
    if c.get("use_dora") or c.get("use_rslora"):
        raise ValueError(f"{ADAPTER_CONFIG}: DoRA and rsLoRA adapters are not supported")
    if c.get("modules_to_save"):
        raise ValueError(f"{ADAPTER_CONFIG}: modules_to_save is not supported, got {c.get('modules_to_save')!r}")
    if c.get("rank_pattern") or c.get("alpha_pattern"):
        raise ValueError(f"{ADAPTER_CONFIG}: rank_pattern and alpha_pattern are not supported (every module must have rank r)")
    tm = c.get("target_modules")
    if tm is None:
        tm = []
    if not isinstance(tm, list) or not all(isinstance(m, str) for m in tm):
        raise ValueError(f"{ADAPTER_CONFIG}: target_modules must be a list of module names, got {tm!r}")
    tp = c.get("target_parameters")
    if tp is None:
        tp = []
    if not isinstance(tp, list) or not all(isinstance(m, str) for m in tp):
        raise ValueError(f"{ADAPTER_CONFIG}: target_parameters must be a list of parameter names, got {tp!r}")
    if not tm and not tp:
        raise ValueError(f"{ADAPTER_CONFIG}: target_modules is empty")
    for m in tm + tp:
        if m in TIED_EMBED_MODULES and c.get("ensure_weight_tying") is True:
            continue
        if m not in TARGET_MODULES:
            raise ValueError(f"{ADAPTER_CONFIG}: unknown target module {m!r} (known: {', '.join(TARGET_MODULES)})")
    ewt = c.get("ensure_weight_tying")
    if ewt is not None and not isinstance(ewt, bool):
        raise ValueError(f"{ADAPTER_CONFIG}: ensure_weight_tying must be true or false, got {ewt!r}")
    if ewt is True:
        # PEFT's own save of a tied model lists the tied embedding in place of the head (its
        # factors are the head's, transposed): the adapter is the head's LoRA on W
        emb = [m for m in tm if m in TIED_EMBED_MODULES]
        tm = [m for m in tm if m not in TIED_EMBED_MODULES]
        if emb and "lm_head" not in tm:
            tm.append("lm_head")
    c["target_modules"], c["target_parameters"] = tm, tp
    ltt = c.get("layers_to_transform")
    if ltt is not None and not (_is_int(ltt) or (isinstance(ltt, list) and all(_is_int(x) for x in ltt))):
        raise ValueError(f"{ADAPTER_CONFIG}: layers_to_transform must be an integer or a list of integers, got {ltt!r}")
    return c


def tensor_limits(n: int) -> Tuple[int, int]:
    """(max header bytes, max tensors) of a checkpoint file of at most n tensors
    (nn.tensorLimits)."""
    return (64 << 10) + (1 << 10) * n, n


def read_header(path: str, max_header_bytes: int, max_tensors: int,
                dtypes: Sequence[str] = FLOAT_DTYPES) -> Tuple[Dict[str, Tuple[str, Tuple[int, ...]]], Dict[str, str]]:
    """The validated header of a safetensors file (safetensors.Parse): {name: (dtype,
    shape)} and the metadata. Nothing the header declares is allocated: its length is
    checked against the file and max_header_bytes first, then every entry (known and
    allowed dtype, non-negative integer shape, offsets holding exactly its bytes), the
    count, and that the tensors tile the data section (no gaps, no overlaps, nothing past
    the end of the file)."""
    name = os.path.basename(path)

    def bad(msg: str) -> ValueError:
        return ValueError(f"{name}: {msg}")

    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise bad(f"file of {size} bytes is too short for a safetensors header")
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            raise bad(f"header length {n} is larger than the file ({size} bytes)")
        if n > max_header_bytes:
            raise bad(f"header of {n} bytes is larger than the limit of {max_header_bytes} bytes")
        raw = f.read(n)
    try:
        hdr = json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"bad header: {e}") from None
    if not isinstance(hdr, dict):
        raise bad("bad header: not a JSON object")
    meta = hdr.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise bad("bad header: __metadata__ must map strings to strings")
    if len(hdr) > max_tensors:
        raise bad(f"header declares more than {max_tensors} tensors, the limit")
    out: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
    spans = []
    for k, v in hdr.items():
        if not isinstance(v, dict):
            raise bad(f"bad header: tensor {k!r} is not an object")
        dt, shape, offs = v.get("dtype"), v.get("shape"), v.get("data_offsets")
        if dt not in ELEM_SIZES:
            raise bad(f"tensor {k!r}: unknown dtype {dt!r}")
        if dt not in dtypes:
            raise bad(f"tensor {k!r}: dtype {dt} is not allowed here (want one of {list(dtypes)})")
        if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
            raise bad(f"tensor {k!r}: shape must be a list of integers, got {shape!r}")
        if any(d < 0 for d in shape):
            raise bad(f"tensor {k!r}: shape {shape} has a negative dimension")
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
            raise bad(f"tensor {k!r}: data_offsets must hold 2 integers, got {offs!r}")
        nbytes = ELEM_SIZES[dt] * math.prod(shape)
        b, e = offs
        if b < 0 or e < b or e - b != nbytes:
            raise bad(f"tensor {k!r}: data_offsets [{b}, {e}] do not hold the {nbytes} bytes of shape {shape} {dt}")
        out[k] = (dt, tuple(shape))
        spans.append((b, e, k))
    end = 0
    for b, e, k in sorted(spans):
        if b != end:
            what = "overlap another tensor" if b < end else f"leave a gap after byte {end}"
            raise bad(f"tensor {k!r}: data_offsets [{b}, {e}] {what}")
        end = e
    if end != size - 8 - n:
        raise bad(f"the tensors cover {end} bytes but the data section holds {size - 8 - n}")
    return out, meta


@dataclass
class Plan:
    """A checked adapter folder: what load_weights and load_optimizer may read."""

    rank: int
    alpha: float  # 0: the default
    seed: int
    keys: List[str]  # PEFT module keys present, each with lora_A and lora_B
    stored: Dict[str, str]  # canonical tensor name -> name in the file
    step: int = 0
    tied: bool = False  # ensure_weight_tying: a tied model's head LoRA adapts the shared matrix


def check_folder(dir_: str, modules: Dict[str, Tuple[str, int, int, int]], num_layers: int, max_rank: int,
                 with_optimizer: bool, with_gradients: bool = False) -> Plan:
    """Checks an adapter folder against the base model's LoRA modules ({PEFT key: (target
    name, in, out, experts)}; a fused-experts parameter has rank r per expert, so A is
    [experts·r, in] and B [out, experts·r]) and the rank limit without reading a tensor
    (nn.LoadAdapter's checks):
    adapter_config.json, both safetensors headers, every tensor name against the modules
    target_modules lists, every shape against r and the module's dimensions, and the
    optimizer state against the weights. Raises ValueError (or OSError) naming the problem."""
    pc = read_config(dir_)
    r = pc["r"]
    if r > max_rank:
        raise ValueError(f"{ADAPTER_CONFIG}: r = {r} is above this worker's rank limit {max_rank}")
    targets = set(pc["target_modules"]) | set(pc["target_parameters"])
    ltt = pc.get("layers_to_transform")
    for layer in ([ltt] if _is_int(ltt) else ltt or []):
        if not 0 <= layer < num_layers:
            raise ValueError(f"{ADAPTER_CONFIG}: layers_to_transform holds {layer}, but the model has {num_layers} layers")
    slots: Dict[str, Tuple[str, bool]] = {}  # tensor name -> (module key, is B)
    for key in modules:
        slots[key + ".lora_A.weight"] = (key, False)
        slots[key + ".lora_B.weight"] = (key, True)
    hb, nt = tensor_limits(len(slots) + 2)  # + the tied embedding's copies of the head's
    tensors, meta = read_header(os.path.join(dir_, ADAPTER_WEIGHTS), hb, nt)
    stored: Dict[str, str] = {}
    tied_head = PEFT_HEAD if pc.get("ensure_weight_tying") is True and PEFT_HEAD in modules else None
    for k, (_, shape) in tensors.items():
        if tied_head and k.startswith(PEFT_TIED_EMBED):
            # PEFT's saved copy of the head's factors for the tied embedding (lora_embedding_A
            # = Bᵀ [r, vocab], lora_embedding_B = Aᵀ [hidden, r]): not read, shape checked
            _, fan_in, fan_out, _ = modules[tied_head]
            pre = next(p for p in PEFT_TIED_EMBED if k.startswith(p))
            want = {"A": (r, fan_out), "B": (fan_in, r)}.get(k[len(pre):].split(".")[0])
            if want is None or shape != want:
                raise ValueError(f"{ADAPTER_WEIGHTS}: {k} is not the tied embedding's copy of the head's LoRA (shape {list(shape)})")
            continue
        name = k.replace(".default.weight", ".weight", 1)
        if name in stored:
            raise ValueError(f"{ADAPTER_WEIGHTS} holds both {stored[name]} and {k}")
        if name not in slots:
            raise ValueError(
                f"{ADAPTER_WEIGHTS}: tensor {k} is not a LoRA tensor of this model "
                f"(expected keys like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)")
        key, is_b = slots[name]
        target, fan_in, fan_out, experts = modules[key]
        if target not in targets:
            raise ValueError(f"{ADAPTER_WEIGHTS}: tensor {k} belongs to a module ({target}) that target_modules/target_parameters {sorted(targets)} does not list")
        want = (fan_out, r * experts) if is_b else (r * experts, fan_in)
        if shape != want:
            raise ValueError(
                f"{ADAPTER_WEIGHTS}: {k} has shape {list(shape)}, want {list(want)} for r = {r} "
                f"(does the adapter belong to this base model?)")
        stored[name] = k
    if not stored:
        raise ValueError(
            f"{ADAPTER_WEIGHTS} holds no LoRA tensors this model knows "
            f"(expected keys like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)")
    keys = []
    for key in modules:
        has_a, has_b = key + ".lora_A.weight" in stored, key + ".lora_B.weight" in stored
        if has_a != has_b:
            raise ValueError(f"{ADAPTER_WEIGHTS} holds only one of lora_A and lora_B for {key}")
        if has_a:
            keys.append(key)
    covered = {modules[k][0] for k in keys}
    for m in pc["target_modules"] + pc["target_parameters"]:
        if m not in covered:
            raise ValueError(f"{ADAPTER_CONFIG} lists target module {m} but {ADAPTER_WEIGHTS} holds no tensors for it")
    try:
        seed = int(meta.get("loops.seed", "0"))
    except ValueError:
        seed = 0
    alpha = pc.get("lora_alpha") or 0
    plan = Plan(rank=r, alpha=float(alpha), seed=seed, keys=keys, stored=stored,
                tied=pc.get("ensure_weight_tying") is True)
    if with_optimizer:
        path = os.path.join(dir_, OPTIMIZER)
        if not os.path.exists(path):
            raise FileNotFoundError(f"optimizer state requested but {OPTIMIZER} could not be read: {path} does not exist")
        hb, nt = tensor_limits(2 * len(stored))
        otensors, ometa = read_header(path, hb, nt)
        step = ometa.get("step", "")
        if not (step.isascii() and step.isdigit()):
            raise ValueError(f"{OPTIMIZER}: the metadata needs a step count >= 0, got {step!r}")
        plan.step = int(step)
        for k, (_, shape) in otensors.items():
            base = k[:-len(".exp_avg")] if k.endswith(".exp_avg") else k[:-len(".exp_avg_sq")] if k.endswith(".exp_avg_sq") else None
            if base is None or base not in stored:
                raise ValueError(f"{OPTIMIZER}: tensor {k} is not the exp_avg or exp_avg_sq of a tensor in {ADAPTER_WEIGHTS}")
            if shape != tensors[stored[base]][1]:
                raise ValueError(f"{OPTIMIZER}: {k} has shape {list(shape)}, want {list(tensors[stored[base]][1])}")
        if len(otensors) != 2 * len(stored):
            raise ValueError(f"{OPTIMIZER} holds {len(otensors)} tensors, want exp_avg and exp_avg_sq for each of the {len(stored)} in {ADAPTER_WEIGHTS}")
    if with_gradients:
        path = os.path.join(dir_, GRADIENTS)
        if not os.path.exists(path):
            raise FileNotFoundError(f"gradients requested but {GRADIENTS} could not be read: {path} does not exist")
        hb, nt = tensor_limits(len(stored))
        gtensors, _ = read_header(path, hb, nt)
        for k, (_, shape) in gtensors.items():
            base = k[:-len(".grad")] if k.endswith(".grad") else None
            if base is None or base not in stored:
                raise ValueError(f"{GRADIENTS}: tensor {k} is not the gradient of a tensor in {ADAPTER_WEIGHTS}")
            if shape != tensors[stored[base]][1]:
                raise ValueError(f"{GRADIENTS}: {k} has shape {list(shape)}, want {list(tensors[stored[base]][1])}")
        if len(gtensors) != len(stored):
            raise ValueError(f"{GRADIENTS} holds {len(gtensors)} tensors, want one gradient for each of the {len(stored)} in {ADAPTER_WEIGHTS}")
    return plan


def _finite(file: str, name: str, t: torch.Tensor, non_negative: bool = False) -> torch.Tensor:
    bad = ~torch.isfinite(t)
    if non_negative:
        bad |= t < 0
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        cond = "finite and >= 0" if non_negative else "finite"
        raise ValueError(f"{file}: {name} holds {float(t.flatten()[i])} at index {i} (values must be {cond})")
    return t


def read_weights(dir_: str, plan: Plan) -> Dict[str, torch.Tensor]:
    """The checked folder's LoRA tensors as float32, by canonical name (no '.default')."""
    out: Dict[str, torch.Tensor] = {}
    with safe_open(os.path.join(dir_, ADAPTER_WEIGHTS), framework="pt") as f:
        for name, k in plan.stored.items():
            out[name] = _finite(ADAPTER_WEIGHTS, k, f.get_tensor(k).to(torch.float32))
    return out


def read_optimizer(dir_: str, plan: Plan) -> Dict[str, torch.Tensor]:
    """The checked folder's Adam moments as float32, by '<name>.exp_avg[_sq]'."""
    out: Dict[str, torch.Tensor] = {}
    with safe_open(os.path.join(dir_, OPTIMIZER), framework="pt") as f:
        for name in plan.stored:
            for suffix in (".exp_avg", ".exp_avg_sq"):
                k = name + suffix
                out[k] = _finite(OPTIMIZER, k, f.get_tensor(k).to(torch.float32), non_negative=suffix == ".exp_avg_sq")
    return out


def read_gradients(dir_: str, plan: Plan) -> Dict[str, torch.Tensor]:
    """The checked folder's accumulated gradients as float32, by '<name>.grad'."""
    out: Dict[str, torch.Tensor] = {}
    with safe_open(os.path.join(dir_, GRADIENTS), framework="pt") as f:
        for name in plan.stored:
            k = name + ".grad"
            out[k] = _finite(GRADIENTS, k, f.get_tensor(k).to(torch.float32))
    return out
