"""Multi-adapter LoRA layers over one shared base model, and the adapters themselves.

Every targeted nn.Linear of the base model is wrapped in a MultiLoraLinear. Before a pass
the engine sets the batch's row segments (rows r0:r1 of the batch use adapter X, or the base
model); each wrapped layer then adds scale * (x[r0:r1] @ A^T) @ B^T for its segment's adapter.
Rows of many adapters thus share every base-model matrix product, and autograd sends each
adapter's gradient only to its own A and B. Adapters are plain fp32 tensors with their own
AdamW moments.

Semantics follow the reference engine (backends/reference/README.md): alpha 32 (scale
32/rank), A ~ U(-1/sqrt(in), 1/sqrt(in)) drawn from Go's PCG seeded with
seed ^ fnv64a(<PEFT key of lora_A>), B = 0. Which modules are targets is the model
family's (families/): attn = q,k,v,o; mlp = gate,up,down and, for MoE families, the fused
expert parameters (MultiLoraExperts: rank r per expert, stored as PEFT's target_parameters
stores them: A [E·r, in], B [out, E·r]); unembed = lm_head.
On a model with tied embeddings the unembedding LoRA adapts the shared
matrix W: ΔW = scale * B @ A is added to the head's logits and to the input embedding lookup
(MultiLoraEmbedding), as PEFT's ensure_weight_tying and tinker-cookbook's merge do, and A and
B get gradients from both uses; adapters saved before this rule (no ensure_weight_tying in
their adapter_config.json) keep the head-only rule they were trained with (Adapter.tied_embed).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from . import pcg
from .families import Family

LORA_ALPHA = 32.0
PEFT_PREFIX = "base_model.model."


@dataclass
class LoraSpec:
    rank: int
    seed: int = 0
    attn: bool = True
    mlp: bool = True
    unembed: bool = True

    def wants(self, kind: str) -> bool:
        """Whether the adapter trains targets of kind "attn", "mlp" or "unembed"."""
        return {"attn": self.attn, "mlp": self.mlp, "unembed": self.unembed}[kind]


class BatchContext:
    """The row segments of the current pass: a list of (r0, r1, adapter or None)."""

    def __init__(self, lora_dtype: Optional[torch.dtype] = None) -> None:
        self.segments: List[Tuple[int, int, Optional["Adapter"]]] = []
        self.lora_dtype = lora_dtype

    def checkpoint_contexts(self):
        """torch.utils.checkpoint's context_fn: a recomputation in backward runs with the
        segments of the pass that ran the forward. A batch of several lengths on CPU is several
        passes whose backward runs after the last one, when segments hold the last pass's."""
        segs = list(self.segments)

        @contextlib.contextmanager
        def restore():
            prev = self.segments
            self.segments = segs
            try:
                yield
            finally:
                self.segments = prev

        return contextlib.nullcontext(), restore()

    def spans(self, n: int) -> List[Tuple[int, int, Optional["Adapter"]]]:
        """The segments in units of the first dimension n of a layer's input: batch rows
        ([B, T, ...] inputs) or tokens (the [B·T, ...] inputs of MoE blocks, which flatten
        the batch). One span when a single segment covers the batch."""
        segs = self.segments
        if len(segs) == 1 and segs[0][0] == 0:
            return [(0, n, segs[0][2])]
        rows = segs[-1][1]
        if n % rows != 0:
            raise RuntimeError(f"a LoRA layer's input has {n} rows, not a multiple of the batch's {rows}")
        f = n // rows
        return [(r0 * f, r1 * f, ad) for r0, r1, ad in segs]


class MultiLoraLinear(nn.Module):
    """An nn.Linear target: y = base(x) + scale·(x Aᵀ) Bᵀ for each row segment's adapter."""

    experts = 1

    def __init__(self, base: nn.Linear, key: str, ctx: BatchContext, kind: str):
        super().__init__()
        self.base = base
        self.key = key  # PEFT module key, e.g. base_model.model.model.layers.0.self_attn.q_proj
        self.target = key.rsplit(".", 1)[-1]  # the target_modules name
        self.kind = kind  # "attn", "mlp" or "unembed"
        self.in_features = base.in_features
        self.out_features = base.out_features
        self._ctx = ctx

    @property
    def weight(self) -> torch.Tensor:  # tied embeddings and HF helpers look at .weight
        return self.base.weight

    def _delta(self, x: torch.Tensor, ad: "Adapter") -> Optional[torch.Tensor]:
        pair = ad.pairs.get(self.key)
        if pair is None:
            return None
        a, b = pair
        # On CPU the LoRA branch runs in float64 (it is small), so the reduction over tokens
        # that forms each adapter's gradient does not depend on how rows were batched or
        # accumulated; on GPU it runs in the activations' dtype (bf16).
        cd = self._ctx.lora_dtype or x.dtype
        return nn.functional.linear(nn.functional.linear(x.to(cd), a.to(cd)), b.to(cd)) * ad.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if not self._ctx.segments:
            return y
        spans = self._ctx.spans(x.shape[0])
        if len(spans) == 1:
            ad = spans[0][2]
            if ad is None:
                return y
            d = self._delta(x, ad)
            return y if d is None else y + d.to(y.dtype)
        parts = []
        touched = False
        for r0, r1, ad in spans:
            d = self._delta(x[r0:r1], ad) if ad is not None else None
            if d is None:
                parts.append(torch.zeros((r1 - r0,) + tuple(y.shape[1:]), dtype=y.dtype, device=y.device))
            else:
                touched = True
                parts.append(d.to(y.dtype))
        if not touched:
            return y
        return y + torch.cat(parts, dim=0)


class MultiLoraEmbedding(nn.Module):
    """The input embedding of a model with tied embeddings: rows of a segment whose adapter
    has tied_embed get W[t] + scale * (B @ A)[t] from the adapter's head LoRA (B [vocab, r],
    A [r, hidden]), the sum formed in the LoRA dtype and rounded once to the weight's dtype
    (as a merged W + ΔW), then scaled as the base embedding scales (Gemma's embed_scale)."""

    def __init__(self, base: nn.Embedding, head_key: str, ctx: BatchContext):
        super().__init__()
        self.base = base
        self.head_key = head_key
        self._ctx = ctx

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def _adapted(self, ids: torch.Tensor, ad: "Adapter") -> Optional[torch.Tensor]:
        if not ad.tied_embed:
            return None
        pair = ad.pairs.get(self.head_key)
        if pair is None:
            return None
        a, b = pair
        w = self.base.weight
        cd = self._ctx.lora_dtype or w.dtype
        d = nn.functional.embedding(ids, b.to(cd)) @ a.to(cd) * ad.scale
        e = (nn.functional.embedding(ids, w).to(cd) + d).to(w.dtype)
        es = getattr(self.base, "embed_scale", None)
        if es is not None:
            e = e * es.to(w.dtype)
        return e

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        segs = self._ctx.segments
        if not segs:
            return self.base(ids)
        rows = ids.shape[0]
        if len(segs) == 1 and segs[0][0] == 0 and segs[0][1] >= rows:
            e = self._adapted(ids, segs[0][2]) if segs[0][2] is not None else None
            return self.base(ids) if e is None else e
        parts = []
        touched = False
        for r0, r1, ad in segs:
            e = self._adapted(ids[r0:r1], ad) if ad is not None else None
            if e is None:
                e = self.base(ids[r0:r1])
            else:
                touched = True
            parts.append(e)
        if not touched:
            return self.base(ids)
        return torch.cat(parts, dim=0)


def embeddings_tied(model: nn.Module) -> bool:
    """Whether the model's head and input embedding are one matrix."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and emb is not None and head.weight.data_ptr() == emb.weight.data_ptr()


def wrap_embedding(model: nn.Module, ctx: BatchContext) -> Optional[MultiLoraEmbedding]:
    """Wraps the input embedding of a model with tied embeddings (call after wrap_model)."""
    emb = model.get_input_embeddings()
    if not isinstance(emb, nn.Embedding):
        return None
    w = MultiLoraEmbedding(emb, PEFT_PREFIX + "lm_head", ctx)
    model.set_input_embeddings(w)
    return w


class ExpertTarget:
    """One fused expert parameter of a MultiLoraExperts module: its PEFT key and shapes.
    The LoRA of expert e is A_e = A[e·r:(e+1)·r] ([r, in]) and B_e = B.reshape(out, r,
    E)[:, :, e] ([out, r]), PEFT's ParamWrapper layout, with ΔW_e = scale·B_e A_e."""

    def __init__(self, key: str, name: str, kind: str, experts: int, in_features: int, out_features: int,
                 transposed: bool):
        self.key = key
        self.target = name  # the target_parameters name
        self.kind = kind
        self.experts = experts
        self.in_features = in_features
        self.out_features = out_features
        self.transposed = transposed  # stored [E, in, out] rather than [E, out, in]


class MultiLoraExperts(nn.Module):
    """A fused-experts module (3-D parameters, transformers 5's Qwen3MoeExperts,
    GptOssExperts, ...) with per-expert LoRA on some of its parameters. Each token span of
    one adapter runs the family's own experts forward with W + ΔW in place of W
    (torch.func.functional_call), so routing, activation and biases are the model's own;
    ΔW is formed per pass from the adapter's A and B (as PEFT's ParamWrapper does)."""

    def __init__(self, base: nn.Module, targets: List[ExpertTarget], ctx: BatchContext):
        super().__init__()
        self.base = base
        self.targets = targets
        self._ctx = ctx

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)

    def _run(self, ad: Optional["Adapter"], args, kwargs):
        repl = {}
        if ad is not None:
            for t in self.targets:
                pair = ad.pairs.get(t.key)
                if pair is None:
                    continue
                a, b = pair
                w = getattr(self.base, t.target)
                cd = self._ctx.lora_dtype or w.dtype
                r = a.shape[0] // t.experts
                A = a.to(cd).reshape(t.experts, r, t.in_features)
                B = b.to(cd).reshape(t.out_features, r, t.experts).permute(2, 0, 1)
                d = torch.bmm(B, A) * ad.scale  # [E, out, in]
                if t.transposed:
                    d = d.transpose(1, 2)
                repl[t.target] = w + d.to(w.dtype)
        if not repl:
            return self.base(*args, **kwargs)
        return torch.func.functional_call(self.base, repl, tuple(args), kwargs, strict=False)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        if not self._ctx.segments:
            return self.base(hidden_states, *args, **kwargs)
        n = hidden_states.shape[0]
        spans = self._ctx.spans(n)
        if len(spans) == 1:
            return self._run(spans[0][2], (hidden_states,) + args, kwargs)

        def cut(v, t0, t1):  # the routing tensors are per token too
            return v[t0:t1] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n else v

        outs = [self._run(ad, tuple(cut(v, t0, t1) for v in (hidden_states,) + args),
                          {k: cut(v, t0, t1) for k, v in kwargs.items()}) for t0, t1, ad in spans]
        return torch.cat(outs, dim=0)


def wrap_model(model: nn.Module, ctx: BatchContext, family: Family,
               rename: Callable[[str], str] = lambda n: n,
               only: Optional[Tuple[str, ...]] = None) -> Dict[str, object]:
    """Wraps every LoRA target of the family in a causal LM; returns {PEFT key: target}
    (MultiLoraLinear or ExpertTarget) in model order. rename maps a module name to the one
    PEFT sees (a vision-language checkpoint's language model: families.vl_name). Expert parameters get PEFT's keys: of
    n targeted parameters of one module, in its parameter order, the i-th is
    <module>{.base_layer × (n-1-i)} (PEFT nests one ParamWrapper per parameter). only: the
    module-name prefixes adapted (a full VL model's language model and head, never its
    vision tower); None adapts the whole model."""
    found: Dict[str, object] = {}
    linear = set(family.attn) | set(family.mlp) | {family.unembed}
    for name, mod in list(model.named_modules()):
        if (only is not None and not name.startswith(only)) or (family.exclude and re.fullmatch(family.exclude, rename(name))):
            continue
        leaf = name.rsplit(".", 1)[-1]
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        if leaf in linear and isinstance(mod, nn.Linear):
            w = MultiLoraLinear(mod, PEFT_PREFIX + rename(name), ctx, family.kind(leaf))
            setattr(parent, leaf, w)
            found[w.key] = w
            continue
        if not family.experts:
            continue
        params = [(pn, p) for pn, p in mod.named_parameters(recurse=False) if pn in family.experts and p.dim() == 3]
        if not params:
            continue
        transposed = bool(getattr(mod, "is_transposed", False))
        targets = []
        for i, (pn, p) in enumerate(params):
            E, d1, d2 = p.shape
            fan_in, fan_out = (d1, d2) if transposed else (d2, d1)
            key = PEFT_PREFIX + rename(name) + ".base_layer" * (len(params) - 1 - i)
            targets.append(ExpertTarget(key, pn, family.kind(pn), int(E), int(fan_in), int(fan_out), transposed))
        setattr(parent, leaf, MultiLoraExperts(mod, targets, ctx))
        for t in targets:
            found[t.key] = t
    return found


def layer_keys(layers: Dict[str, object], spec: LoraSpec) -> List[str]:
    """PEFT module keys an adapter with spec trains (of the model's targets, in order)."""
    return [k for k, t in layers.items() if spec.wants(t.kind)]


def init_lora_a(name_a: str, seed: int, rank: int, fan_in: int) -> np.ndarray:
    """The reference engine's initial A for parameter name_a: float32 [rank, fan_in]."""
    rng = pcg.new_rng((seed ^ pcg.fnv64a(name_a.encode())) & pcg.MASK64)
    u = pcg.float64_block(rng, rank * fan_in)
    bound = 1.0 / math.sqrt(fan_in)
    return ((u * 2.0 - 1.0) * bound).astype(np.float32).reshape(rank, fan_in)


class Trained:
    """The AdamW state of a run's trained tensors (params: name → tensor, each with its
    .grad), shared by LoRA adapters and full fine-tuning runs (full.FullRun)."""

    params: Dict[str, torch.Tensor]

    def reset_optimizer(self) -> None:
        self.step = 0
        self.exp_avg = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in self.params.items()}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None


class Adapter(Trained):
    """One LoRA adapter: fp32 A/B tensors, gradients (in .grad) and AdamW moments."""

    def __init__(self, adapter_id: str, base, spec: LoraSpec, device: torch.device,
                 scale: Optional[float] = None, init: bool = True, keys: Optional[List[str]] = None):
        """keys: the PEFT module keys to allocate (a loaded checkpoint's); default: the
        spec's targets in every layer."""
        self.id = adapter_id
        self.base = base
        self.spec = spec
        self.scale = float(scale) if scale is not None else LORA_ALPHA / spec.rank
        # the head LoRA adapts the shared matrix of a tied model (the embedding lookup too)
        self.tied_embed = bool(spec.unembed and getattr(base, "tied", False))
        # a tied model's head LoRA loaded from a checkpoint without ensure_weight_tying
        # (the head-only rule it was trained with); saved as loops.unembed = head-only
        self.head_only_tied = False
        self.device = device
        self.step = 0
        self.lock = threading.Lock()
        self.pairs: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.params: Dict[str, torch.Tensor] = {}  # PEFT tensor name -> fp32 leaf tensor
        self.exp_avg: Dict[str, torch.Tensor] = {}
        self.exp_avg_sq: Dict[str, torch.Tensor] = {}
        for key in (layer_keys(base.layers, spec) if keys is None else keys):
            lin = base.layers[key]
            r = spec.rank * lin.experts  # per expert rank r: E·r rows (PEFT's layout)
            na, nb = key + ".lora_A.weight", key + ".lora_B.weight"
            if init:
                a = torch.from_numpy(init_lora_a(na, spec.seed, r, lin.in_features))
            else:
                a = torch.zeros(r, lin.in_features, dtype=torch.float32)
            a = a.to(device).requires_grad_(True)
            b = torch.zeros(lin.out_features, r, dtype=torch.float32, device=device).requires_grad_(True)
            self.pairs[key] = (a, b)
            self.params[na], self.params[nb] = a, b
        self.reset_optimizer()

    def keep_only(self, keys: List[str]) -> None:
        """Restricts the adapter to the given module keys (a loaded checkpoint's subset)."""
        keep = set(keys)
        for key in list(self.pairs):
            if key not in keep:
                del self.pairs[key]
                for s in (".lora_A.weight", ".lora_B.weight"):
                    self.params.pop(key + s, None)
                    self.exp_avg.pop(key + s, None)
                    self.exp_avg_sq.pop(key + s, None)
        kinds = {self.base.layers[k].kind for k in self.pairs}
        self.spec.attn = "attn" in kinds
        self.spec.mlp = "mlp" in kinds
        self.spec.unembed = "unembed" in kinds
        self.tied_embed = self.tied_embed and self.spec.unembed

    def targets(self) -> Tuple[List[str], List[str]]:
        """(target_modules, target_parameters) of the adapter's keys, for adapter_config.json."""
        mods: List[str] = []
        params: List[str] = []
        for k in self.pairs:
            t = self.base.layers[k]
            out = params if isinstance(t, ExpertTarget) else mods
            if t.target not in out:
                out.append(t.target)
        return mods, params

    @torch.no_grad()
    def adam_step(self, lr: float, beta1: float, beta2: float, eps: float, wd: float, clip: float):
        """torch.optim.AdamW order, as the reference engine: global-norm clip
        g*clip/(|g|+1e-6) when clip > 0 and |g| > clip; p -= lr*wd*p; bias-corrected update.
        Arithmetic in float64, stored in float32. Returns the gradient norm before clipping and
        the update norm |W_after - W_before| of the weights as stored (as the reference engine)."""
        ss = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.params.values():
            if p.grad is not None:
                ss += p.grad.double().pow(2).sum()
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
            # no gradient is -0.0, the additive identity (how gradients.safetensors stores it), so
            # a step after an offload and restore is bit-identical to one without
            upd += adamw_apply(p.data, p.grad, coef, self.exp_avg[name], self.exp_avg_sq[name],
                               lr, beta1, beta2, eps, wd, bc1, bc2)
            p.grad = None
        return norm, float(upd.sqrt().item())


@torch.no_grad()
def adamw_apply(w: torch.Tensor, grad: Optional[torch.Tensor], coef: float, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float, wd: float,
                bc1: float, bc2: float) -> torch.Tensor:
    """One AdamW update of the weights w in place (Adapter.adam_step's arithmetic, shared with
    full fine-tuning's chunks: elementwise, so a tensor updated whole or in slices gets the same
    bits): the moments and weights updated in float64 and stored in their own dtypes. grad None
    is -0.0 (no gradient). Returns the float64 sum of squares of the stored weights' change."""
    g = grad.double() * coef if grad is not None else torch.full_like(w, -0.0, dtype=torch.float64)
    m = exp_avg.double().mul_(beta1).add_(g, alpha=1 - beta1)
    v = exp_avg_sq.double().mul_(beta2).add_(g * g, alpha=1 - beta2)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    before = w.to(torch.float64, copy=True)  # (a float64 w is updated in place below)
    nw = before - lr * wd * before
    nw = nw - lr * (m / bc1) / ((v / bc2).sqrt() + eps)
    w.copy_(nw)
    return (w.double() - before).pow(2).sum()
