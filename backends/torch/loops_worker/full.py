"""Full fine-tuning: a training run of LoRA rank 0 trains every weight of the model.

What is trained: every parameter of the causal language model as transformers loads it (the
input embedding, every decoder layer's attention, MLP and norm weights and biases, the final
norm and the output head; a tied head and embedding are one matrix, trained once with the
gradients of both uses). A vision-language checkpoint is refused (its vision tower would be
trained too, and images are a separate question).

How: the run gets its own copy of the model (a BaseModel loaded from the same folder with no
LoRA layers), so the shared base stays frozen for the LoRA runs and samplers of the replica.
Where the model's dtype is below float32 (bf16/f16 on a GPU) the run keeps float32 master
weights: each parameter's gradient is added into its master's float32 gradient as soon as
backward produces it, AdamW updates the masters (float32 moments) and the model's copy is the
masters rounded to its dtype. A float32 or float64 model is its own master (moments of its
dtype). The loss functions and AdamW are the LoRA runs' (lora.adamw_apply, in slices of
ADAM_CHUNK elements so a large matrix never gets float64 temporaries of its size); weight
decay applies to every weight.

Checkpoints are Hugging Face model folders: config.json, generation_config.json, the base
folder's tokenizer files, the weights in safetensors files of at most SHARD_BYTES each with
model.safetensors.index.json when there are several, and MARKER (the run's step and what the
folder holds). A sampler checkpoint holds the weights in the model's dtype, the one the run
computes with, and loads unchanged with transformers' from_pretrained and as the worker's
sampler; a state checkpoint holds the master weights, plus the Adam moments (optimizer-*
files, '<name>.exp_avg' and '<name>.exp_avg_sq') and, for a slot move, the accumulated
gradient (gradients-* files, '<name>.grad', -0.0 where none), so a run resumes bit-identically.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from typing import Dict, List, Optional, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from . import checkpoint as ckpt
from .lora import LoraSpec, Trained, adamw_apply

MARKER = "loops_full_finetune.json"
FORMAT = 1
# The largest safetensors file a checkpoint writes (Hugging Face's sharding by size).
SHARD_BYTES = 2 << 30
# Elements of one AdamW slice (float64 temporaries of 2^22 elements: 32 MiB each).
ADAM_CHUNK = 1 << 22
# Files of the base model's folder a checkpoint copies, so it is a complete model folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "preprocessor_config.json")
WEIGHTS, OPTIMIZER, GRADIENTS = "model", "optimizer", "gradients"
MAX_MARKER_BYTES = 64 << 10


def is_full_dir(d: str) -> bool:
    """Whether folder d is a full fine-tuning checkpoint."""
    return bool(d) and os.path.isfile(os.path.join(d, MARKER))


def marker_key(d: str) -> str:
    """A cache key for full checkpoint folder d (folders are immutable snapshots; size, times
    and inode guard against a rewritten one)."""
    st = os.stat(os.path.join(d, MARKER))
    return f"{d}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


class FullRun(Trained):
    """A full fine-tuning run, in the engine's place of an Adapter: its own copy of the model
    (base), the trained weights by Hugging Face name (params: the masters, each with .grad),
    and AdamW state."""

    full = True

    def __init__(self, run_id: str, shared, base):
        self.id = run_id
        self.shared = shared  # the replica's frozen BaseModel it was copied from
        self.base = base  # the run's own BaseModel (lora=False)
        self.spec = LoraSpec(rank=0)
        self.pairs: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}  # no LoRA layer applies
        self.tied_embed = False
        self.head_only_tied = False
        self.device = base.device
        self.step = 0
        self.lock = threading.Lock()
        self.model_params: Dict[str, torch.Tensor] = {}
        self.params: Dict[str, torch.Tensor] = {}
        low = base.dtype not in (torch.float32, torch.float64)
        self.master_dtype = torch.float32 if low else base.dtype
        for name, p in base.model.named_parameters():  # a tied matrix once
            self.model_params[name] = p
            if low:
                m = p.detach().to(torch.float32).clone().requires_grad_(True)
                p.requires_grad_(True)
                p.register_post_accumulate_grad_hook(_into_master(m))
            else:
                m = p
                p.requires_grad_(True)
            self.params[name] = m
        self.reset_optimizer()

    @torch.no_grad()
    def sync(self) -> None:
        """The model's copy set from the masters (rounded to its dtype)."""
        for name, p in self.model_params.items():
            m = self.params[name]
            if m is not p:
                p.copy_(m)

    @torch.no_grad()
    def adam_step(self, lr: float, beta1: float, beta2: float, eps: float, wd: float, clip: float):
        """Adapter.adam_step over every weight (the same arithmetic, lora.adamw_apply, in
        slices): the gradient norm before clipping and the masters' update norm."""
        ss = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.params.values():
            if p.grad is not None:
                g = p.grad.reshape(-1)
                for i in range(0, g.numel(), ADAM_CHUNK):
                    ss += g[i:i + ADAM_CHUNK].double().pow(2).sum()
        norm = float(ss.sqrt().item())
        coef = 1.0
        if clip > 0 and norm > clip:
            coef = clip / (norm + 1e-6)
        self.step += 1
        t = float(self.step)
        bc1 = 1.0 - beta1 ** t
        bc2 = 1.0 - beta2 ** t
        upd = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.params.items():
            w = p.data.reshape(-1)
            g = p.grad.reshape(-1) if p.grad is not None else None
            m = self.exp_avg[name].reshape(-1)
            v = self.exp_avg_sq[name].reshape(-1)
            for i in range(0, w.numel(), ADAM_CHUNK):
                j = i + ADAM_CHUNK
                upd += adamw_apply(w[i:j], g[i:j] if g is not None else None, coef, m[i:j], v[i:j],
                                   lr, beta1, beta2, eps, wd, bc1, bc2)
            p.grad = None
        for p in self.model_params.values():
            p.grad = None
        self.sync()
        return norm, float(upd.sqrt().item())


def _into_master(m: torch.Tensor):
    """A post-accumulate-grad hook: the parameter's low-precision gradient added into its
    float32 master's gradient at once (so gradients accumulate in float32 across passes)."""

    def hook(p: torch.Tensor) -> None:
        g = p.grad.to(torch.float32)
        m.grad = g if m.grad is None else m.grad.add_(g)
        p.grad = None

    return hook


# -- checkpoints ----------------------------------------------------------------------------


def _write_sharded(dir_: str, prefix: str, tensors: Dict[str, torch.Tensor], shard_bytes: int,
                   meta: Dict[str, str]) -> int:
    """Writes tensors as <prefix>.safetensors, or <prefix>-0000i-of-0000n.safetensors files
    of at most shard_bytes each (a tensor larger than that alone in its file) and
    <prefix>.safetensors.index.json; returns the bytes written."""
    from huggingface_hub import split_torch_state_dict_into_shards

    split = split_torch_state_dict_into_shards(tensors, filename_pattern=prefix + "{suffix}.safetensors",
                                               max_shard_size=shard_bytes)
    total = 0
    for fname, names in split.filename_to_tensors.items():
        path = os.path.join(dir_, fname)
        save_file({n: tensors[n].detach().to("cpu").contiguous() for n in names}, path, metadata=meta)
        total += os.path.getsize(path)
    if split.is_sharded:
        idx = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
               "weight_map": split.tensor_to_filename}
        data = json.dumps(idx, indent=2, sort_keys=True) + "\n"
        with open(os.path.join(dir_, prefix + ".safetensors.index.json"), "w") as f:
            f.write(data)
        total += len(data)
    return total


def save(dir_: str, run: FullRun, with_optimizer: bool, with_gradients: bool = False,
         shard_bytes: int = SHARD_BYTES) -> int:
    """Writes the run's checkpoint folder (see the module doc); returns its bytes."""
    os.makedirs(dir_, exist_ok=True)
    bm = run.base
    state = with_optimizer or with_gradients
    ws = run.params if state else {n: p.detach() for n, p in run.model_params.items()}
    dtype = run.master_dtype if state else bm.dtype
    total = 0
    cfg = bm.model.config
    prev = getattr(cfg, "dtype", None)
    try:
        cfg.dtype = dtype
        cfg.save_pretrained(dir_)
    finally:
        cfg.dtype = prev
    gc = getattr(bm.model, "generation_config", None)
    if gc is not None:
        gc.save_pretrained(dir_)
    src = run.shared.dir
    for name in TOKENIZER_FILES:
        p = os.path.join(src, name)
        if os.path.isfile(p):
            shutil.copyfile(p, os.path.join(dir_, name))
    total += _write_sharded(dir_, WEIGHTS, {n: p.detach() for n, p in ws.items()}, shard_bytes, {"format": "pt"})
    if with_optimizer:
        os_ = {}
        for n in run.params:
            os_[n + ".exp_avg"] = run.exp_avg[n]
            os_[n + ".exp_avg_sq"] = run.exp_avg_sq[n]
        total += _write_sharded(dir_, OPTIMIZER, os_, shard_bytes, {"format": "pt", "optimizer": "adamw"})
    if with_gradients:
        gs = {n + ".grad": (p.grad if p.grad is not None else torch.full(tuple(p.shape), -0.0, dtype=p.dtype, device=p.device))
              for n, p in run.params.items()}
        total += _write_sharded(dir_, GRADIENTS, gs, shard_bytes, {"format": "pt"})
    mk = json.dumps({"format": FORMAT, "base_model": run.shared.name, "step": run.step,
                     "weights_dtype": str(dtype).removeprefix("torch."), "optimizer": with_optimizer,
                     "gradients": with_gradients}, indent=2) + "\n"
    with open(os.path.join(dir_, MARKER), "w") as f:  # last: a folder without it is not one
        f.write(mk)
    return total + len(mk)


def read_marker(dir_: str) -> dict:
    """The folder's MARKER, checked."""
    raw = ckpt._read_capped(os.path.join(dir_, MARKER), MAX_MARKER_BYTES)
    try:
        m = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{MARKER}: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"{MARKER}: not a format {FORMAT} full fine-tuning checkpoint")
    step = m.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 1 << 53:
        raise ValueError(f"{MARKER}: step must be an integer in [0, 2^53), got {step!r}")
    if not isinstance(m.get("base_model"), str):
        raise ValueError(f"{MARKER}: base_model must be a string")
    return m


def _files(dir_: str, prefix: str, max_files: int) -> List[str]:
    """The safetensors files of one kind in a folder: the index's, or the single file."""
    single = os.path.join(dir_, prefix + ".safetensors")
    index = os.path.join(dir_, prefix + ".safetensors.index.json")
    if os.path.isfile(index):
        try:
            idx = json.loads(ckpt._read_capped(index, 64 << 20))
            wm = idx["weight_map"]
            files = sorted(set(wm.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{os.path.basename(index)}: bad index: {e}") from None
        if len(files) > max_files or not all(isinstance(f, str) and f == os.path.basename(f) and f.startswith(prefix + "-")
                                             and f.endswith(".safetensors") for f in files):
            raise ValueError(f"{os.path.basename(index)}: the weight map must name at most {max_files} {prefix}-*.safetensors files of the folder")
        return [os.path.join(dir_, f) for f in files]
    if os.path.isfile(single):
        return [single]
    raise FileNotFoundError(f"no {prefix}.safetensors or {prefix}.safetensors.index.json in {dir_}")


def _read(dir_: str, prefix: str, want: Dict[str, Tuple[Tuple[int, ...], torch.dtype]],
          non_negative: Tuple[str, ...] = ()) -> Dict[str, torch.Tensor]:
    """Reads exactly the tensors want names ({name: (shape, dtype to return)}) from the
    folder's <prefix> files, every header checked (ckpt.read_header) before a value is read,
    every value finite (and >= 0 for names ending in non_negative)."""
    files = _files(dir_, prefix, len(want) + 1)
    mh, mt = ckpt.tensor_limits(len(want))
    where: Dict[str, str] = {}
    for path in files:
        hdr, _ = ckpt.read_header(path, mh, mt)
        for n, (_, shape) in hdr.items():
            if n not in want:
                raise ValueError(f"{os.path.basename(path)}: tensor {n!r} is not a weight of this model")
            if n in where:
                raise ValueError(f"{os.path.basename(path)}: tensor {n!r} is also in {os.path.basename(where[n])}")
            if tuple(shape) != tuple(want[n][0]):
                raise ValueError(f"{os.path.basename(path)}: tensor {n!r} has shape {list(shape)}, the model's is {list(want[n][0])}")
            where[n] = path
    missing = [n for n in want if n not in where]
    if missing:
        raise ValueError(f"{prefix} files lack {len(missing)} of the model's {len(want)} tensors, e.g. {missing[0]!r}")
    out: Dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for n in f.keys():
                t = f.get_tensor(n).to(want[n][1])
                out[n] = ckpt._finite(os.path.basename(path), n, t, n.endswith(non_negative) if non_negative else False)
    return out


def check_state(dir_: str, run: FullRun, with_optimizer: bool, with_gradients: bool) -> dict:
    """The folder's marker, after checking it holds what a load asks (before reading data)."""
    m = read_marker(dir_)
    if with_optimizer and not m.get("optimizer"):
        raise ValueError("the checkpoint holds no optimizer state (it was saved for sampling); load it without the optimizer")
    if with_gradients and not m.get("gradients"):
        raise ValueError("the checkpoint holds no accumulated gradient")
    return m


@torch.no_grad()
def load_into(dir_: str, run: FullRun, with_optimizer: bool, with_gradients: bool) -> None:
    """Replaces the run's weights (and Adam state and gradient if asked) from a checkpoint
    folder; nothing is changed when the folder does not match the model."""
    m = check_state(dir_, run, with_optimizer, with_gradients)
    md = run.master_dtype
    want = {n: (tuple(p.shape), md) for n, p in run.params.items()}
    ws = _read(dir_, WEIGHTS, want)
    st = {}
    if with_optimizer:
        st = _read(dir_, OPTIMIZER, {n + s: (tuple(p.shape), md) for n, p in run.params.items()
                                      for s in (".exp_avg", ".exp_avg_sq")}, non_negative=(".exp_avg_sq",))
    gs = {}
    if with_gradients:
        gs = _read(dir_, GRADIENTS, {n + ".grad": (tuple(p.shape), md) for n, p in run.params.items()})
    for n, p in run.params.items():
        p.copy_(ws[n].to(p.device))
        p.grad = gs[n + ".grad"].to(p.device) if with_gradients else None
    if with_optimizer:
        run.step = int(m["step"])
        for n in run.params:
            run.exp_avg[n].copy_(st[n + ".exp_avg"].to(run.device))
            run.exp_avg_sq[n].copy_(st[n + ".exp_avg_sq"].to(run.device))
    else:
        run.reset_optimizer()
    run.sync()
