"""The trainer: base models with multi-adapter LoRA, losses, AdamW and checkpoints.

Semantics are those of the reference engine (backends/reference/README.md); comments name
the Go function each piece mirrors.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import checkpoint as ckpt
from .errors import ALREADY_EXISTS, FAILED_PRECONDITION, INTERNAL, RESOURCE_EXHAUSTED, WorkerError, invalid, not_found
from . import families
from . import full
from .lora import Adapter, BatchContext, LoraSpec, embeddings_tied, wrap_embedding, wrap_model
from .proto import tpb
from .revision import dir_revision

MAX_SEQ_CAP = 32768
# A training pass over at least this many tokens (rows × padded length) checkpoints its
# decoder layers on CPU (nn.DefaultCheckpointRows): each layer's input is kept and the layer
# recomputed in backward. GPUs checkpoint every training pass (the worker's default there).
DEFAULT_CHECKPOINT_TOKENS = 4096
# Elements of float32 logits the loss head computes at a time (rows of the chunk × vocab):
# the logits of a long sequence are never materialised at once; each chunk's are recomputed
# in backward.
DEFAULT_LOGITS_BUDGET_CPU = 1 << 26
DEFAULT_LOGITS_BUDGET_CUDA = 1 << 28
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2
DEFAULT_DRO_BETA = 0.05
DEFAULT_GSPO_CLIP_LOW = 0.9997
DEFAULT_GSPO_CLIP_HIGH = 1.0004
# loss_fn_config bounds (semantics.LossConfigRange)
LOSS_CONFIG_RANGE = {"clip_low_threshold": (0.0, 1.0), "clip_high_threshold": (1.0, 100.0), "beta": (0.0, 1000.0)}
LOSS_FUNCTIONS = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"]
LOSS_CONFIG_KEYS = {
    "cross_entropy": [],
    "importance_sampling": [],
    "ppo": ["clip_low_threshold", "clip_high_threshold"],
    "cispo": ["clip_low_threshold", "clip_high_threshold"],
    "dro": ["beta"],
    "gspo": ["clip_low_threshold", "clip_high_threshold"],
}
IMPLEMENTATION = "torch"
log = logging.getLogger("loops_worker.engine")
# The snapshot folders resolve_model_dir looks through (hfcache's maxSnapshots).
_MAX_SNAPSHOTS = 1024


def _eos_ids(v) -> List[int]:
    if v is None:
        return []
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v if isinstance(x, (int, float))]
    if isinstance(v, (int, float)):
        return [int(v)]
    return []


def resolve_model_dir(name: str) -> Tuple[Optional[str], str]:
    """(local folder or None, tokenizer id) for a model name, as the gateway resolves it
    (reference.ResolveModelDir, internal/hfcache.Find): a folder that holds config.json, else
    the model's snapshot in the hub cache huggingface_hub itself uses ($HF_HUB_CACHE, else
    $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub): the
    one refs/main names when it holds config.json, else the most recently modified one that
    does."""
    if os.path.isfile(os.path.join(name, "config.json")):
        d = os.path.abspath(name)
        return d, d
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.file_download import repo_folder_name

    hub = constants.HF_HUB_CACHE
    try:
        found = try_to_load_from_cache(name, "config.json", cache_dir=hub)
    except ValueError:  # huggingface_hub's HFValidationError: not a repository id
        found, snaps = None, None
    else:
        snaps = os.path.join(hub, repo_folder_name(repo_id=name, repo_type="model"), "snapshots")
    if isinstance(found, str):
        return os.path.dirname(found), name
    best = None
    if snaps is not None and os.path.isdir(snaps):
        with os.scandir(snaps) as it:
            for e in itertools.islice(it, _MAX_SNAPSHOTS):
                if e.name.startswith(".") or not os.path.isfile(os.path.join(e.path, "config.json")):
                    continue
                try:
                    key = (os.stat(e.path).st_mtime_ns, e.path)
                except OSError:
                    continue
                if best is None or key > best:
                    best = key
    if best is not None:
        return best[1], name
    raise FileNotFoundError(
        f"{name!r} is neither a folder with config.json nor a model in the local Hugging Face cache "
        f"({hub}); download it first, e.g. `huggingface-cli download {name}`")


# The input modalities served (ModelInfo.modalities): text, and "image" for a
# vision-language checkpoint of a family that serves image chunks (families.Family.images)
# whose image processor loads (vision.ImageInputs).
MODALITIES = ("text",)
IMAGE = "image"


class BaseModel:
    """One loaded base model (shared by every adapter on it)."""

    def __init__(self, name: str, path: Optional[str], device: torch.device, dtype: torch.dtype,
                 max_lora_rank: int, attn_impl: str = "auto", grad_checkpointing: bool = False,
                 model=None, pad: Optional[bool] = None, checkpoint_tokens: Optional[int] = None,
                 logits_budget: int = 0, lora: bool = True):
        """A model on the meta device (device meta) has its modules' shapes and no weights:
        a worker whose sampling is vLLM's and that does not train (a tensor-parallel sampler
        replica, vllm_sampler.py) checks adapter folders against it; it cannot compute.
        lora False: no LoRA layers are wrapped (a full fine-tuning run's own copy of the
        model, or a full sampler checkpoint: full.py), so its parameters keep their Hugging
        Face names."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        self.name = name
        if path is None:
            path, tok_id = resolve_model_dir(name)
        else:
            path = os.path.abspath(path)
            tok_id = path
        self.dir = path
        self.tokenizer_id = tok_id
        self.device = device
        self.dtype = dtype
        # the family first: an unserved model_type is refused before its weights are read
        cfg, mt = (model.config, None) if model is not None else families.load_config(path)
        self.family = families.for_config(cfg, mt)
        # a vision-language checkpoint: its language model is loaded as the text model (the
        # vision tower is not read) and adapter keys get the VL model's names, as PEFT names
        # them on the full …ForConditionalGeneration; image inputs are refused (not served)
        self.vision_checkpoint = families.is_vision(cfg)
        # a family that serves image chunks loads the full VL model (the vision tower frozen)
        self.full_vl = self.vision_checkpoint and self.family.images
        if model is None:
            kw = {}
            if self.family.experts and dtype == torch.float64:
                kw["experts_implementation"] = "eager"  # grouped_mm has no float64 kernel
            if attn_impl == "auto":
                attn_impl = self.family.attn_implementation

            def load(cls, **kw):
                if device.type != "meta":
                    return cls.from_pretrained(path, dtype=dtype, attn_implementation=attn_impl, **kw)
                with torch.device("meta"):  # the shapes only (class doc)
                    return cls.from_config(kw.get("config", cfg), dtype=dtype)

            if self.full_vl:
                model = load(AutoModelForImageTextToText, **kw)
            else:
                if self.vision_checkpoint:
                    kw.update(config=families.text_config(cfg), key_mapping=families.key_mapping(self.family))
                elif self.family.loads_as:  # config.json names a model_type transformers lacks (load_config)
                    kw.update(config=cfg)
                model = load(AutoModelForCausalLM, **kw)
        if self.vision_checkpoint and not self.full_vl and families.is_vision(model.config):
            raise ValueError(f"{cfg.model_type} checkpoint: transformers loaded {type(model).__name__}, not the text model "
                             f"of its language model; this transformers version cannot serve it on the torch worker")
        self.model = model.to(device)
        self.model.eval()
        self.model.requires_grad_(False)
        # the language model's config (a full VL model's text_config)
        self.config = families.text_config(self.model.config) if self.full_vl else self.model.config
        # Activation checkpointing: a training pass over at least checkpoint_tokens tokens
        # (rows × padded length) recomputes each decoder layer in backward (None:
        # DEFAULT_CHECKPOINT_TOKENS; 0: never; grad_checkpointing: every training pass). Only the decoder layers are put in
        # training mode for it (transformers checkpoints a layer only then); their modules
        # stay in eval mode, so no dropout: the same values either way.
        if checkpoint_tokens is None:
            checkpoint_tokens = DEFAULT_CHECKPOINT_TOKENS
        self.checkpoint_tokens = 1 if grad_checkpointing else max(0, int(checkpoint_tokens))
        self.grad_checkpointing = self.checkpoint_tokens > 0
        if logits_budget <= 0:
            logits_budget = DEFAULT_LOGITS_BUDGET_CUDA if device.type == "cuda" else DEFAULT_LOGITS_BUDGET_CPU
        self.logits_budget = int(logits_budget)
        self.pad = device.type == "cuda" if pad is None else pad
        # how to load another copy of this model alike (a full fine-tuning run's: full.py)
        self.options = dict(max_lora_rank=max_lora_rank, attn_impl=attn_impl, pad=self.pad,
                            checkpoint_tokens=self.checkpoint_tokens, logits_budget=self.logits_budget)
        self.ctx = BatchContext(torch.float64 if device.type == "cpu" else None)
        # a multi-rank replica's process group and gradient anchor (shard.shard_model)
        self.dist = None
        self.anchor: Optional[torch.Tensor] = None
        self._ck_layers: List[torch.nn.Module] = []
        if self.grad_checkpointing:
            from transformers.modeling_layers import GradientCheckpointingLayer

            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False, "context_fn": self.ctx.checkpoint_contexts})
            self._ck_layers = [m for m in self.model.modules() if isinstance(m, GradientCheckpointingLayer)]
        # {PEFT key: MultiLoraLinear or ExpertTarget}, the family's LoRA targets in model order
        # (a full VL model's module names are already the VL names; only its language model
        # and head are adapted, never the vision tower)
        self.layers: Dict[str, object] = wrap_model(
            self.model, self.ctx, self.family,
            families.vl_name if self.vision_checkpoint and not self.full_vl else (lambda n: n),
            (families.VL_PREFIX, families.UNEMBED) if self.full_vl else None) if lora else {}
        # tied embeddings: an adapter's head LoRA adapts the embedding lookup too (lora.py)
        self.tied = embeddings_tied(self.model)
        if self.tied and lora:
            wrap_embedding(self.model, self.ctx)
        # Gemma-style final logit soft-capping (cap·tanh(logits/cap)), as the model's own head
        self.softcap = float(getattr(self.config, "final_logit_softcapping", None) or 0.0)
        self.num_layers = int(self.config.num_hidden_layers)
        self.vocab = int(self.config.vocab_size)
        mp = int(getattr(self.config, "max_position_embeddings", 0) or 0)
        self.max_seq = MAX_SEQ_CAP if mp <= 0 or mp > MAX_SEQ_CAP else mp
        eos: List[int] = []
        # (a VL checkpoint may name its eos ids in the outer config only)
        for v in _eos_ids(getattr(self.config, "eos_token_id", None)) + _eos_ids(getattr(cfg, "eos_token_id", None)):
            if 0 <= v < self.vocab and v not in eos:
                eos.append(v)
        try:
            with open(os.path.join(path, "generation_config.json")) as f:
                for v in _eos_ids(json.load(f).get("eos_token_id")):
                    if 0 <= v < self.vocab and v not in eos:
                        eos.append(v)
        except (OSError, ValueError):
            pass
        self.eos = eos
        self.tokenizer = None
        try:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001 - stop strings then need a tokenizer
            self.tokenizer = None
        # image chunks: the model's image processor (None: images are refused by the gateway,
        # the catalog saying text only)
        self.images = None
        if self.full_vl:
            from .vision import ImageInputs

            self.images, why = ImageInputs.load(path, self.model.config)
            if self.images is None:
                log.warning("model %s: image chunks are not served: %s", name, why)
        arch = (getattr(self.model.config, "architectures", None) or [getattr(self.config, "model_type", "")])[0]
        self.info = tpb.ModelInfo(
            name=name, max_sequence_length=self.max_seq, vocab_size=self.vocab, architecture=arch,
            tokenizer_id=tok_id, max_lora_rank=max_lora_rank, backend=IMPLEMENTATION,
            hidden_size=int(getattr(self.config, "hidden_size", 0) or 0), revision=dir_revision(path),
            family=self.family.name, publisher=self.family.publisher, renderer=self.family.renderer,
            lora_targets=list(dict.fromkeys(t.target for t in self.layers.values())),
            modalities=list(MODALITIES) + ([IMAGE] if self.images is not None else []),
            tied_embeddings=bool(self.tied),
            language_model_prefix=families.VL_PREFIX if self.vision_checkpoint else "", **self._plan_fields())
        if self.images is not None:
            self.info.vision.CopyFrom(self.images.info())

    def _plan_fields(self) -> dict:
        """ModelInfo's replica-planning inputs (the gateway's internal/replicaplan does the
        arithmetic): the model's size, dtype and shape, its LoRA parameters per unit of rank,
        the loss head's chunk and, on a GPU, the device's memory."""
        c = self.config

        def num(name: str) -> int:
            # 0 where unknown, or where the config holds it per layer (Gemma 4's head_dim:
            # transformers refuses a global read of a heterogeneous attribute)
            try:
                return int(getattr(c, name, 0) or 0)
            except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError and kin
                return 0

        heads = num("num_attention_heads")
        hidden = num("hidden_size")
        head_dim = num("head_dim") or (hidden // heads if heads else 0)
        mem = 0
        if self.device.type == "cuda":
            mem = int(torch.cuda.get_device_properties(self.device).total_memory)
        return dict(
            parameter_count=sum(p.numel() for p in self.model.parameters()),  # a tied weight once
            weight_dtype=str(self.dtype).removeprefix("torch."), num_layers=self.num_layers,
            intermediate_size=num("intermediate_size"), num_attention_heads=heads,
            num_key_value_heads=num("num_key_value_heads") or heads, head_dim=head_dim,
            lora_parameters_per_rank=sum((t.in_features + t.out_features) * max(1, t.experts) for t in self.layers.values()),
            logits_chunk_elements=self.logits_budget, device_memory_bytes=mem)

    # -- the pass ------------------------------------------------------------------------

    def token_logprobs(self, seqs: List[List[int]], adapters: List[Optional[Adapter]],
                       targets: List[torch.Tensor], train: bool,
                       images: Optional[List[Optional["RowImages"]]] = None) -> List[torch.Tensor]:
        """Log-probs of targets[i] ([n_i, K_i] int64) after each position of seqs[i].
        Rows of the same adapter must be adjacent to share a segment (callers sort).

        With padding (the GPU default) all rows go in one padded pass. Without it (CPU), rows
        are batched by length, so no row is padded: a row's result then does not depend on
        what it was batched with beyond float rounding of the matrix products, which keeps
        accumulated and batched gradients equal to ~1e-7. images[i]: row i's images
        (RowImages), None for a text row."""
        images = images or [None] * len(seqs)
        if self.pad or len(seqs) == 1:
            return self._pass(seqs, adapters, targets, train, images)
        groups: Dict[int, List[int]] = {}
        for i, s in enumerate(seqs):
            groups.setdefault(len(s), []).append(i)
        out: List[Optional[torch.Tensor]] = [None] * len(seqs)
        for idx in groups.values():
            res = self._pass([seqs[i] for i in idx], [adapters[i] for i in idx], [targets[i] for i in idx], train,
                             [images[i] for i in idx])
            for i, r in zip(idx, res):
                out[i] = r
        return out  # type: ignore[return-value]

    def _pass(self, seqs: List[List[int]], adapters: List[Optional[Adapter]],
              targets: List[torch.Tensor], train: bool,
              images: List[Optional["RowImages"]]) -> List[torch.Tensor]:
        B = len(seqs)
        T = max(len(s) for s in seqs)
        K = max(int(t.shape[1]) for t in targets)
        dev = self.device
        ids = torch.zeros((B, T), dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        tg = torch.zeros((B, T, K), dtype=torch.long)
        for i, s in enumerate(seqs):
            n = len(s)
            ids[i, :n] = torch.tensor(s, dtype=torch.long)
            mask[i, :n] = 1
            tg[i, :n, : targets[i].shape[1]] = targets[i]
        ids, mask, tg = ids.to(dev), mask.to(dev), tg.to(dev)
        segs: List[Tuple[int, int, Optional[Adapter]]] = []
        for i, ad in enumerate(adapters):
            if segs and segs[-1][2] is ad:
                segs[-1] = (segs[-1][0], i + 1, ad)
            else:
                segs.append((i, i + 1, ad))
        # The segments stay set after a training pass: its backward may recompute layers
        # (activation checkpointing), and the recomputation must apply the same adapters.
        # The caller clears them with end_pass() once backward has run.
        self.ctx.segments = segs
        try:
            with torch.set_grad_enabled(train):
                if train and self.checkpoints(B * T):
                    for layer in self._ck_layers:
                        layer.training = True
                inner = self.model.model
                full_mask = bool(mask.all())
                out = inner(input_ids=ids, attention_mask=None if full_mask else mask, use_cache=False,
                            **self.vision_inputs(images, T))
                h = out.last_hidden_state
                lp = self._chunked_logprobs(h, tg, train)
        except BaseException:
            self.end_pass()
            raise
        finally:
            self.model.eval()
        if not train:
            self.end_pass()
        return [lp[i, : len(s), : targets[i].shape[1]] for i, s in enumerate(seqs)]

    def vision_inputs(self, images: List[Optional["RowImages"]], T: int) -> dict:
        """The model's image arguments for rows padded to T (pixel_values, image_grid_thw,
        mm_token_type_ids; the input ids already hold the image token), or none for text
        rows. A full VL model's cached multimodal position offsets (rope_deltas, kept by
        transformers between calls for generation) are cleared, so a pass never reuses
        another's."""
        if self.full_vl and hasattr(self.model.model, "rope_deltas"):
            self.model.model.rope_deltas = None
        rows = [r for r in images if r is not None]
        if not rows:
            return {}
        kinds = torch.zeros((len(images), T), dtype=torch.long)
        for i, r in enumerate(images):
            if r is not None:
                kinds[i, : len(r.kinds)] = torch.tensor(r.kinds, dtype=torch.long)
        dev = self.device
        return dict(pixel_values=torch.cat([r.pixel_values for r in rows]).to(dev),
                    image_grid_thw=torch.cat([r.grid for r in rows]).to(dev), mm_token_type_ids=kinds.to(dev))

    def row_images(self, where: str, tokens: List[int], images) -> Tuple[List[int], Optional["RowImages"]]:
        """A row's input ids (image placeholders → the image token) and its RowImages, run
        through the model's image processor; (tokens, None) for a text row."""
        if len(images) == 0:
            return tokens, None
        if self.images is None:
            raise invalid(f"{where}: model {self.name} takes text only (modalities {list(self.info.modalities)}), not images")
        ids, kinds = self.images.place(where, tokens, images)
        pv, grid = self.images.pixels(where, images)
        return ids, RowImages(kinds=kinds, pixel_values=pv, grid=grid)

    def checkpoints(self, tokens: int) -> bool:
        """Whether a training pass over tokens (rows × padded length) checkpoints its layers."""
        return bool(self._ck_layers) and tokens >= self.checkpoint_tokens

    def end_pass(self) -> None:
        """Clears the row segments of the last pass (after its backward, for training)."""
        self.ctx.segments = []

    def _chunked_logprobs(self, h: torch.Tensor, tg: torch.Tensor, train: bool) -> torch.Tensor:
        head = self.model.lm_head
        B, T, _ = h.shape
        # Chunk over time so [B, chunk, V] logits stay within logits_budget elements; each
        # chunk's logits are recomputed in backward (so they are never all held at once).
        chunk = max(1, min(T, self.logits_budget // max(1, B * self.vocab)))

        cap = self.softcap

        def piece(hc: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
            logits = head(hc)
            if logits.dtype not in (torch.float32, torch.float64):
                logits = logits.float()
            if cap > 0:
                logits = torch.tanh(logits / cap) * cap
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            return torch.gather(logits, -1, tc) - lse

        outs = []
        for t0 in range(0, T, chunk):
            hc, tc = h[:, t0:t0 + chunk], tg[:, t0:t0 + chunk]
            if train and chunk < T:
                from torch.utils.checkpoint import checkpoint

                outs.append(checkpoint(piece, hc, tc, use_reentrant=False, context_fn=self.ctx.checkpoint_contexts))
            else:
                outs.append(piece(hc, tc))
        return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


@dataclass
class RowImages:
    """One row's images, as the model takes them."""

    kinds: List[int]  # per position: 0 text, 1 image (mm_token_type_ids)
    pixel_values: torch.Tensor  # the image processor's patches of the row's images, in order
    grid: torch.Tensor  # [images, 3] image_grid_thw

    def text_targets(self) -> torch.Tensor:
        """[n] float64: 1 where position i's target (token i + 1) is text, 0 where it is an
        image position (a vision token is an input, never predicted: its loss and weight are 0)."""
        k = torch.tensor(self.kinds[1:] + [0], dtype=torch.float64)
        return 1.0 - k


# -- loss inputs ----------------------------------------------------------------------------


def tensor_values(t) -> Tuple[List[float], List[int]]:
    """A loops.v1.Tensor's values (as floats) and shape; an empty shape means 1-D."""
    if t.dtype == tpb.DTYPE_INT64:
        vals = [float(v) for v in t.int64_data]
    elif t.dtype == tpb.DTYPE_FLOAT32:
        vals = list(t.float32_data)
    elif len(t.int64_data) > 0 and len(t.float32_data) == 0:
        vals = [float(v) for v in t.int64_data]
    else:
        vals = list(t.float32_data)
    shape = list(t.shape) or [len(vals)]
    n = 1
    for d in shape:
        if d < 0:
            raise ValueError(f"negative dimension in shape {shape}")
        n *= d
    if n != len(vals):
        raise ValueError(f"shape {shape} does not match its {len(vals)} values")
    return vals, shape


@dataclass
class DatumLoss:
    n: int
    k: int
    targets: torch.Tensor  # [n, k] int64
    two_d: bool
    weights: Optional[torch.Tensor] = None  # [n, k] float64
    q: Optional[torch.Tensor] = None  # [n] float64
    adv: Optional[torch.Tensor] = None  # [n] float64
    mask: Optional[torch.Tensor] = None  # [n] bool, gspo's sequence_ratio_mask != 0
    images: Optional[RowImages] = None  # the row's images (a VL model's image chunks)


def _fmt(shape) -> str:
    return "[" + " ".join(str(int(s)) for s in shape) + "]"


def parse_datum(i: int, d, loss: str, bm: BaseModel) -> Tuple[List[int], DatumLoss]:
    """reference.parseDatum."""
    if d is None or len(d.tokens) == 0:
        raise invalid(f"datum {i} has no tokens; every datum needs a non-empty model_input")
    n = len(d.tokens)
    V = bm.vocab
    if n > bm.max_seq:
        raise invalid(f"datum {i} has {n} tokens, over the model's limit of {bm.max_seq}; shorten or split it")
    toks = list(d.tokens)
    for j, t in enumerate(toks):
        if t < 0 or t >= V:
            raise invalid(f"datum {i}: token {t} at position {j} is outside the vocabulary [0, {V})")
    toks, row_images = bm.row_images(f"datum {i}", toks, d.images)

    def get(key):
        if key not in d.loss_fn_inputs:
            raise invalid(f"datum {i}: loss {loss!r} needs loss_fn_inputs[{key!r}]")
        try:
            v, s = tensor_values(d.loss_fn_inputs[key])
        except ValueError as e:
            raise invalid(f"datum {i}: loss_fn_inputs[{key!r}]: {e}")
        if s[0] != n or len(s) > 2:
            raise invalid(
                f"datum {i}: loss_fn_inputs[{key!r}] has shape {_fmt(s)} but the input has {n} tokens; per-token "
                f"inputs must have length N (or shape (N, K) for cross_entropy targets and weights)")
        return v, s

    tv, ts = get("target_tokens")
    k = 1
    if len(ts) == 2:
        if loss != "cross_entropy":
            raise invalid(f"datum {i}: 2-D target_tokens are only supported by cross_entropy")
        k = int(ts[1])
        if k < 1:
            raise invalid(f"datum {i}: target_tokens has shape {_fmt(ts)}; K must be at least 1")
    for j, v in enumerate(tv):
        if v != math.trunc(v) or v < 0 or v >= V:
            raise invalid(f"datum {i}: target token {v:g} at index {j} is outside the vocabulary [0, {V})")
    dl = DatumLoss(n=n, k=k, targets=torch.tensor([int(v) for v in tv], dtype=torch.long).reshape(n, k), two_d=len(ts) == 2)

    def finite(key, v):
        for j, x in enumerate(v):
            if math.isnan(x) or math.isinf(x):
                raise invalid(f"datum {i}: loss_fn_inputs[{key!r}][{j}] is {x}; values must be finite")

    if loss == "cross_entropy":
        wv, ws = get("weights")
        if len(ws) != len(ts) or (len(ws) == 2 and ws[1] != ts[1]):
            raise invalid(f"datum {i}: weights has shape {_fmt(ws)} but target_tokens has shape {_fmt(ts)}; they must match")
        finite("weights", wv)
        dl.weights = torch.tensor(wv, dtype=torch.float64).reshape(n, k)
        dl.images = row_images
        return toks, dl
    keys = ("logprobs", "advantages", "sequence_ratio_mask") if loss == "gspo" else ("logprobs", "advantages")
    for key in keys:
        v, s = get(key)
        if len(s) != 1:
            raise invalid(f"datum {i}: loss_fn_inputs[{key!r}] must be 1-D of length {n}, got shape {_fmt(s)}")
        finite(key, v)
        t = torch.tensor(v, dtype=torch.float64)
        if key == "logprobs":
            dl.q = t
        elif key == "advantages":
            dl.adv = t
        else:
            if not any(x != 0 for x in v):
                raise invalid(f"datum {i}: sequence_ratio_mask marks no position; gspo's sequence ratio is the mean over the marked positions, so mark at least one")
            dl.mask = t != 0
    dl.images = row_images
    if row_images is not None and dl.mask is not None:
        dl.mask = dl.mask & (row_images.text_targets() > 0)
        if not bool(dl.mask.any()):
            raise invalid(f"datum {i}: sequence_ratio_mask marks only positions whose targets are image tokens; mark a text position")
    return toks, dl


def token_losses(name: str, cfg: Dict[str, float], dl: DatumLoss, lp: torch.Tensor) -> torch.Tensor:
    """Per-target loss [n, k] (float64) from learner log-probs lp [n, k] (reference.lossFn).
    Gradients follow the reference: ppo's clipped branch has none; cispo's weight is detached."""
    lo = cfg.get("clip_low_threshold", DEFAULT_CLIP_LOW)
    hi = cfg.get("clip_high_threshold", DEFAULT_CLIP_HIGH)
    beta = cfg.get("beta", DEFAULT_DRO_BETA)
    lp = lp.double()
    dev = lp.device
    if name == "cross_entropy":
        return -dl.weights.to(dev) * lp
    l1 = lp[:, 0]
    q, a = dl.q.to(dev), dl.adv.to(dev)
    if name == "importance_sampling":
        r = torch.exp(l1 - q)
        out = -r * a
    elif name == "ppo":
        r = torch.exp(l1 - q)
        un = r * a
        cl = torch.clamp(r, lo, hi) * a
        out = -torch.where(un <= cl, un, cl.detach())
    elif name == "cispo":
        c = torch.clamp(torch.exp(l1 - q), lo, hi).detach()
        out = -c * a * l1
    elif name == "dro":
        out = -(l1 * a - 0.5 * beta * (l1 - q) ** 2)
    elif name == "gspo":
        # every position carries the sequence ratio s (the mean log-ratio over the marked
        # positions, detached) with its own log-prob's gradient: s_t = sg(s)·exp(lp − sg(lp))
        lo = cfg.get("clip_low_threshold", DEFAULT_GSPO_CLIP_LOW)
        hi = cfg.get("clip_high_threshold", DEFAULT_GSPO_CLIP_HIGH)
        m = dl.mask.to(dev)
        log_s = (l1.detach() - q)[m].mean()
        r = torch.exp(log_s + l1 - l1.detach())
        un = r * a
        cl = torch.clamp(r, lo, hi) * a
        out = -torch.where(un <= cl, un, cl.detach())
    else:  # validated before
        raise invalid(f"unknown loss_fn {name!r}")
    return out.unsqueeze(1)


# -- the engine ------------------------------------------------------------------------------


def _group_adapters(rows) -> List[Adapter]:
    """The distinct adapters of a group's rows, by id (the same list on every rank)."""
    seen: Dict[str, Adapter] = {}
    for r in rows:
        seen.setdefault(r[0], r[2].adapter)
    return [seen[k] for k in sorted(seen)]


def _stash_grads(rows) -> List[Tuple[Adapter, Dict[str, Optional[torch.Tensor]]]]:
    """Takes the group's adapters' accumulated gradients aside (their .grad then None), so
    the pass's new gradients can be summed over the ranks alone (shard.py)."""
    out = []
    for ad in _group_adapters(rows):
        old = {k: p.grad for k, p in ad.params.items()}
        ad.zero_grad()
        out.append((ad, old))
    return out


def _sum_grads(d, rows, stash) -> None:
    """Sums the pass's new LoRA gradients over the ranks (one all-reduce) and adds them to
    the gradients taken aside before it, as a 1-rank backward accumulates them."""
    flat = []
    for ad, _ in stash:
        for p in ad.params.values():
            flat.append((p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1))
    if not flat:
        return
    buf = d.all_reduce_sum(torch.cat(flat))
    off = 0
    for ad, old in stash:
        for k, p in ad.params.items():
            n = p.numel()
            g = buf[off:off + n].view_as(p).clone()
            off += n
            p.grad = g if old[k] is None else old[k] + g



@dataclass
class _Item:
    idx: int
    adapter: Optional[Adapter] = None
    datums: List[DatumLoss] = field(default_factory=list)
    tokens: List[List[int]] = field(default_factory=list)
    err: Optional[WorkerError] = None


def _item_error(e: WorkerError):
    from .proto import bpb

    return bpb.ForwardBackwardItemResult(error=bpb.ItemError(code=e.code, message=e.message))


class Engine:
    def __init__(self, models: Dict[str, BaseModel], order: List[str], max_lora_rank: int = 64,
                 max_adapters: int = 256, full_runs: int = 1):
        """full_runs: the full fine-tuning runs (LoRA rank 0, full.py) held at once, each
        with its own copy of its model (0: full fine-tuning refused)."""
        self.models = models
        self.full_runs = full_runs
        # the largest safetensors file of a full fine-tuning checkpoint
        self.full_shard_bytes = full.SHARD_BYTES
        self.order = order
        self.max_lora_rank = max_lora_rank
        self.max_adapters = max_adapters
        self.adapters: Dict[str, Adapter] = {}
        self.mu = threading.Lock()  # guards self.adapters
        # One pass at a time per worker (one device); sampling takes it too on the HF path.
        self.compute = threading.RLock()
        # a multi-rank replica's process group (shard.py); None: one rank
        self.dist = None

    # -- lookups -----------------------------------------------------------------------------

    def model(self, name: str) -> BaseModel:
        bm = self.models.get(name)
        if bm is None:
            raise invalid(
                f"base model {name!r} is not served by this worker; served models: {self.order} "
                f"(start the worker with --model {name} to serve it)")
        return bm

    def adapter(self, adapter_id: str) -> Adapter:
        with self.mu:
            a = self.adapters.get(adapter_id)
        if a is None:
            raise not_found(f"adapter {adapter_id!r} does not exist; create it with CreateAdapter first")
        return a

    def capabilities(self):
        from .proto import bpb

        models = []
        for n in self.order:
            bm = self.models[n]
            m = tpb.ModelInfo()
            m.CopyFrom(bm.info)
            # full fine-tuning (rank 0): on one rank, not of a vision-language checkpoint (_new_full)
            m.full_finetune = (self.full_runs > 0 and self.dist is None and not bm.vision_checkpoint
                               and bm.device.type != "meta")
            models.append(m)
        return bpb.GetCapabilitiesResponse(
            models=models, loss_functions=list(LOSS_FUNCTIONS),
            max_adapters=self.max_adapters, implementation=IMPLEMENTATION, saves_gradients=True,
            checkpoint_urls=True)

    def _check_lora(self, lc) -> LoraSpec:
        if lc is None:
            raise invalid("lora config is required")
        if lc.rank == 0:
            if not (lc.train_attn and lc.train_mlp and lc.train_unembed):
                raise invalid("rank 0 is full fine-tuning, which trains every weight of the model: leave train_attn, "
                              "train_mlp and train_unembed on, or give a LoRA rank of at least 1")
            return LoraSpec(rank=0)
        if lc.rank < 1 or lc.rank > self.max_lora_rank:
            raise invalid(f"LoRA rank {lc.rank} is out of range: use a rank from 1 to {self.max_lora_rank}, or 0 for full fine-tuning")
        if not (lc.train_attn or lc.train_mlp or lc.train_unembed):
            raise invalid("the adapter would train nothing: set at least one of train_attn, train_mlp, train_unembed")
        return LoraSpec(rank=int(lc.rank), seed=int(lc.seed), attn=lc.train_attn, mlp=lc.train_mlp,
                        unembed=lc.train_unembed)

    # -- adapters ----------------------------------------------------------------------------

    def create_adapter(self, req) -> None:
        if not req.adapter_id:
            raise invalid("adapter_id is required")
        bm = self.model(req.base_model)
        self._check_trains(bm)
        spec = self._check_lora(req.lora if req.HasField("lora") else None)
        if spec.rank == 0:
            self._add_full(req.adapter_id, bm)
            return
        with self.mu:
            if req.adapter_id in self.adapters:
                raise WorkerError(ALREADY_EXISTS, f"adapter {req.adapter_id!r} already exists; delete it first or pick another id")
            if len(self.adapters) >= self.max_adapters:
                raise WorkerError(RESOURCE_EXHAUSTED, f"the worker already holds {len(self.adapters)} adapters (its limit); delete one first")
        ad = Adapter(req.adapter_id, bm, spec, bm.device)
        with self.mu:
            if req.adapter_id in self.adapters:
                raise WorkerError(ALREADY_EXISTS, f"adapter {req.adapter_id!r} already exists; delete it first or pick another id")
            self.adapters[req.adapter_id] = ad

    @staticmethod
    def _check_trains(bm: BaseModel) -> None:
        if bm.device.type == "meta":
            raise WorkerError(FAILED_PRECONDITION, f"this worker holds no weights of {bm.name} in torch: it is a sampler "
                              f"replica whose vLLM is tensor-parallel (--vllm-tensor-parallel-size); it samples and "
                              f"does not train (train on the model's trainer pool)")

    def _full_room(self, adapter_id: str, bm: BaseModel) -> None:
        """Refuses a new full fine-tuning run the worker cannot hold (call under self.mu)."""
        if adapter_id in self.adapters:
            raise WorkerError(ALREADY_EXISTS, f"adapter {adapter_id!r} already exists; delete it first or pick another id")
        if len(self.adapters) >= self.max_adapters:
            raise WorkerError(RESOURCE_EXHAUSTED, f"the worker already holds {len(self.adapters)} adapters (its limit); delete one first")
        n = sum(1 for a in self.adapters.values() if getattr(a, "full", False))
        if n >= self.full_runs:
            raise WorkerError(RESOURCE_EXHAUSTED, f"the worker holds {n} full fine-tuning runs, its limit of {self.full_runs} "
                              f"(each holds its own copy of the model with gradients, master weights and Adam state); "
                              f"end one (loops runs unload RUN, or end its session), or train a LoRA adapter (rank 1 or more); "
                              f"an operator raises the limit with the worker's --full-finetune-runs")

    def _new_full(self, adapter_id: str, bm: BaseModel) -> "full.FullRun":
        """A full fine-tuning run on bm: its own copy of the model (full.py)."""
        self._check_trains(bm)
        if self.dist is not None:
            raise WorkerError(FAILED_PRECONDITION, "full fine-tuning (rank 0) is not served on a multi-rank replica yet; "
                              "serve the model on a one-GPU trainer pool (gpus_per_replica = 1) for it, or give a LoRA rank")
        if bm.vision_checkpoint:
            raise invalid(f"full fine-tuning (rank 0) of a vision-language checkpoint ({bm.name}) is not served: "
                          f"give a LoRA rank of at least 1")
        with self.mu:
            self._full_room(adapter_id, bm)
        with self.compute:
            own = BaseModel(bm.name, bm.dir, bm.device, bm.dtype, lora=False, **bm.options)
        return full.FullRun(adapter_id, bm, own)

    def _add_full(self, adapter_id: str, bm: BaseModel, run: Optional["full.FullRun"] = None) -> None:
        if run is None:
            run = self._new_full(adapter_id, bm)
        with self.mu:
            self._full_room(adapter_id, bm)
            self.adapters[adapter_id] = run

    def delete_adapter(self, adapter_id: str) -> None:
        with self.mu:
            self.adapters.pop(adapter_id, None)

    # -- forward / backward ------------------------------------------------------------------

    def _prepare(self, idx: int, it) -> _Item:
        fi = _Item(idx=idx)
        try:
            fi.adapter = self.adapter(it.adapter_id)
            if it.loss_fn not in LOSS_CONFIG_KEYS:
                raise invalid(f"unknown loss_fn {it.loss_fn!r}; use one of {LOSS_FUNCTIONS}")
            keys = LOSS_CONFIG_KEYS[it.loss_fn]
            for k, v in it.loss_fn_config.items():
                if k not in keys:
                    raise invalid(f"loss_fn_config key {k!r} is not used by {it.loss_fn} (accepted keys: {keys})")
                if math.isnan(v) or math.isinf(v):
                    raise invalid(f"loss_fn_config[{k!r}] must be finite")
                lo, hi = LOSS_CONFIG_RANGE[k]
                if v < lo or v > hi:
                    raise invalid(f"loss_fn_config[{k!r}] is {v:g}; it must be in [{lo:g}, {hi:g}]")
            if len(it.data) == 0:
                raise invalid(f"the batch for adapter {it.adapter_id!r} is empty; send at least one datum")
            for i, d in enumerate(it.data):
                toks, dl = parse_datum(i, d, it.loss_fn, fi.adapter.base)
                fi.tokens.append(toks)
                fi.datums.append(dl)
        except WorkerError as e:
            fi.err = e
        return fi

    def forward_backward(self, req):
        from .proto import bpb

        if len(req.items) == 0:
            raise invalid("the request has no items")
        items = [self._prepare(i, it) for i, it in enumerate(req.items)]
        results: List = [None] * len(items)
        groups: Dict[Tuple[str, bool], List[_Item]] = {}
        for fi in items:
            if fi.err is not None:
                results[fi.idx] = _item_error(fi.err)
                continue
            # (a full fine-tuning run computes with its own copy of the model)
            key = (fi.adapter.base, bool(req.items[fi.idx].forward_only))
            groups.setdefault(key, []).append(fi)
        with self.compute:
            for (base, fwd_only), g in groups.items():
                try:
                    self._run_group(base, g, req, not fwd_only, results)
                except WorkerError as e:
                    for fi in g:
                        results[fi.idx] = _item_error(e)
                except torch.cuda.OutOfMemoryError as e:  # type: ignore[attr-defined]
                    if self.dist is not None:
                        raise  # one rank's failure mid-pass ends the replica (shard.py)
                    torch.cuda.empty_cache()
                    for fi in g:
                        results[fi.idx] = _item_error(WorkerError(RESOURCE_EXHAUSTED, f"out of GPU memory in forward_backward: {e}; send smaller batches"))
        if self.dist is not None and not self.dist.leader:
            return None  # a follower's results went to rank 0
        return bpb.ForwardBackwardResponse(results=results)

    def _run_group(self, bm: BaseModel, g: List[_Item], req, train: bool, results) -> None:
        from .proto import bpb

        # rows sorted by adapter so each adapter's rows form one segment
        rows = []  # (adapter id, item, datum index)
        for fi in g:
            for j in range(len(fi.datums)):
                rows.append((fi.adapter.id, fi.idx, fi, j))
        rows.sort(key=lambda r: (r[0], r[1]))
        d = bm.dist
        every = rows
        if d is not None:  # this rank's share of the rows (shard.py)
            rows = [rows[i] for i in d.span(len(rows))]
            stash = _stash_grads(every) if train else None
        seqs = [r[2].tokens[r[3]] for r in rows]
        ads = [r[2].adapter for r in rows]
        tgs = [r[2].datums[r[3]].targets for r in rows]
        ims = [r[2].datums[r[3]].images for r in rows]
        if not rows:  # a rank with no rows still takes part in the pass's collectives
            seqs, ads, tgs, ims = [[0]], [None], [torch.zeros((1, 1), dtype=torch.long)], [None]
        lps = bm.token_logprobs(seqs, ads, tgs, train, ims)
        try:
            per_row_loss = []
            total = None
            for (aid, idx, fi, j), lp in zip(rows, lps):
                it = req.items[fi.idx]
                tl = token_losses(it.loss_fn, dict(it.loss_fn_config), fi.datums[j], lp)
                if fi.datums[j].images is not None:  # only text targets carry a loss
                    tl = tl * fi.datums[j].images.text_targets().to(tl.device, tl.dtype)[:, None]
                per_row_loss.append(tl)
                s = tl.sum()
                total = s if total is None else total + s
            if d is not None and train:
                # every rank runs a backward (its FSDP gathers match the others'), through
                # the pass's gradient anchor when its rows train nothing
                z = lps[0].sum() * 0.0 + bm.anchor * 0.0
                total = z if total is None else total + z
            if train and total is not None and total.requires_grad:
                total.backward()
        finally:
            bm.end_pass()
        if d is not None:
            bm.anchor.grad = None
            if train:
                _sum_grads(d, every, stash)
        mine = [(lp.detach().float().cpu(), tl.detach().sum(dim=1).cpu()) for lp, tl in zip(lps, per_row_loss)]
        if d is not None:
            shares = d.gather(mine)
            if not d.leader:
                return
            rows, mine = every, [x for share in shares for x in share]
        outs: Dict[int, Dict[int, Tuple[torch.Tensor, torch.Tensor]]] = {}
        for (aid, idx, fi, j), out in zip(rows, mine):
            outs.setdefault(fi.idx, {})[j] = out
        for fi in g:
            res = tpb.ForwardBackwardResult()
            tot = 0.0
            for j, dl in enumerate(fi.datums):
                lp, el = outs[fi.idx][j]
                shape = [dl.n, dl.k] if (dl.k > 1 or dl.two_d) else [dl.n]
                o = tpb.DatumOutput()
                o.outputs["logprobs"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=shape, float32_data=lp.reshape(-1).tolist()))
                o.outputs["elementwise_loss"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[dl.n], float32_data=el.float().tolist()))
                tot += float(el.sum())
                res.outputs.append(o)
            res.metrics["loss:sum"] = tot
            results[fi.idx] = bpb.ForwardBackwardItemResult(result=res)

    # -- optimizer ---------------------------------------------------------------------------

    def optim_step(self, req):
        from .proto import bpb

        a = self.adapter(req.adapter_id)
        if not req.HasField("adam"):
            raise invalid("adam params are required")
        p = req.adam
        lr, b1, b2, eps, wd, clip = p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm
        if b1 == 0 and b2 == 0 and eps == 0:
            b1, b2, eps = 0.9, 0.95, 1e-12
        if not lr >= 0:
            raise invalid(f"learning_rate must be >= 0, got {lr:g}")
        if not (0 <= b1 < 1) or not (0 <= b2 < 1):
            raise invalid(f"beta1 and beta2 must be in [0, 1), got {b1:g} and {b2:g}")
        if not eps >= 0:
            raise invalid(f"eps must be >= 0, got {eps:g}")
        if not wd >= 0:
            raise invalid(f"weight_decay must be >= 0, got {wd:g}")
        if not clip >= 0:
            raise invalid(f"grad_clip_norm must be >= 0 (0 turns clipping off), got {clip:g}")
        with self.compute:
            norm, update = a.adam_step(lr, b1, b2, eps, wd, clip)
        res = tpb.OptimStepResult()
        res.metrics["grad_norm:mean"] = norm
        res.metrics["update_norm:mean"] = update
        res.metrics["learning_rate:mean"] = lr
        return bpb.OptimStepResponse(result=res)

    # -- checkpoints -------------------------------------------------------------------------

    @staticmethod
    def _check_dir(d: str) -> None:
        if not d or not os.path.isabs(d):
            raise invalid(f"dir must be an absolute path, got {d!r}")

    def save_adapter(self, req) -> int:
        self._check_dir(req.dir)
        a = self.adapter(req.adapter_id)
        with self.compute:
            try:
                if getattr(a, "full", False):
                    return full.save(req.dir, a, req.include_optimizer, req.include_gradients, self.full_shard_bytes)
                return ckpt.save(req.dir, a, a.base.tokenizer_id, req.include_optimizer, req.include_gradients)
            except OSError as e:
                raise WorkerError(INTERNAL, f"saving adapter {req.adapter_id!r}: {e}")

    @staticmethod
    def lora_modules(bm: BaseModel) -> Dict[str, Tuple[str, int, int, int]]:
        """{PEFT module key: (target name, in, out, experts)} of every LoRA target of the
        base model, in model order."""
        return {k: (t.target, t.in_features, t.out_features, t.experts) for k, t in bm.layers.items()}

    def check_adapter_dir(self, dir_: str, bm: BaseModel, with_optimizer: bool, with_gradients: bool = False) -> ckpt.Plan:
        """ckpt.check_folder against bm and this worker's rank limit, as InvalidArgument."""
        try:
            return ckpt.check_folder(dir_, self.lora_modules(bm), bm.num_layers, self.max_lora_rank, with_optimizer, with_gradients)
        except (OSError, ValueError) as e:
            raise invalid(f"cannot load adapter from {dir_}: {e}")

    def load_adapter_from(self, dir_: str, bm: BaseModel, with_optimizer: bool, adapter_id: str = "",
                          with_gradients: bool = False) -> Adapter:
        """nn.LoadAdapter: a new Adapter from a PEFT folder (any subset of targets). The
        folder is checked before anything is allocated; only its modules are allocated.
        with_gradients: the accumulated gradient from gradients.safetensors (nn.LoadGradients)."""
        plan = self.check_adapter_dir(dir_, bm, with_optimizer, with_gradients)
        try:
            ws = ckpt.read_weights(dir_, plan)
            st = ckpt.read_optimizer(dir_, plan) if with_optimizer else {}
            gs = ckpt.read_gradients(dir_, plan) if with_gradients else {}
        except (OSError, ValueError) as e:
            raise invalid(f"cannot load adapter from {dir_}: {e}")
        r = plan.rank
        scale = plan.alpha / r if plan.alpha > 0 else None
        ad = Adapter(adapter_id, bm, LoraSpec(rank=r, seed=plan.seed), bm.device, scale=scale, init=False, keys=plan.keys)
        ad.keep_only(plan.keys)
        # without ensure_weight_tying the adapter was trained by the head-only rule: keep it
        ad.head_only_tied = ad.tied_embed and not plan.tied
        ad.tied_embed = ad.tied_embed and plan.tied
        with torch.no_grad():
            for name, p in ad.params.items():
                p.copy_(ws[name].to(p.device))
            if with_optimizer:
                ad.step = plan.step
                for name in ad.params:
                    ad.exp_avg[name].copy_(st[name + ".exp_avg"].to(ad.exp_avg[name].device))
                    ad.exp_avg_sq[name].copy_(st[name + ".exp_avg_sq"].to(ad.exp_avg_sq[name].device))
            for name, p in ad.params.items():
                if with_gradients:
                    p.grad = gs[name + ".grad"].to(p.device)
        return ad

    def load_adapter(self, req) -> None:
        self._check_dir(req.dir)
        if not req.adapter_id:
            raise invalid("adapter_id is required")
        if full.is_full_dir(req.dir):
            return self._load_full(req)
        try:
            existing = self.adapter(req.adapter_id)
        except WorkerError as e:
            existing = None
            try:
                pc = ckpt.read_config(req.dir)
            except FileNotFoundError:
                raise e
            except (OSError, ValueError) as ce:
                raise invalid(f"cannot load adapter from {req.dir}: {ce}")
            bm = None
            for n in self.order:
                m = self.models[n]
                if pc.get("base_model_name_or_path") in (n, m.tokenizer_id, m.dir):
                    bm = m
            if bm is None:
                raise e
        else:
            if getattr(existing, "full", False):
                raise invalid(f"{req.dir} is a LoRA adapter folder; adapter {req.adapter_id!r} is a full fine-tuning run "
                              f"(rank 0), which loads full fine-tuning checkpoints only")
            bm = existing.base
        self._check_trains(bm)
        with self.compute:
            ad = self.load_adapter_from(req.dir, bm, req.load_optimizer, req.adapter_id, req.load_gradients)
        with self.mu:
            if req.adapter_id in self.adapters or existing is not None:
                self.adapters[req.adapter_id] = ad
                return
            if len(self.adapters) >= self.max_adapters:
                raise WorkerError(RESOURCE_EXHAUSTED, f"the worker already holds {len(self.adapters)} adapters (its limit); delete one first")
            self.adapters[req.adapter_id] = ad

    def _load_full(self, req) -> None:
        """LoadAdapter of a full fine-tuning checkpoint: into the run of that id, or a new run
        on the served model the checkpoint names."""
        try:
            mk = full.read_marker(req.dir)
        except (OSError, ValueError) as e:
            raise invalid(f"cannot load full fine-tuning checkpoint from {req.dir}: {e}")
        with self.mu:
            run = self.adapters.get(req.adapter_id)
        if run is not None and not getattr(run, "full", False):
            raise invalid(f"{req.dir} is a full fine-tuning checkpoint; adapter {req.adapter_id!r} is a LoRA adapter "
                          f"(rank {run.spec.rank}): load it into a run of rank 0")
        fresh = run is None
        if fresh:
            bm = self.models.get(mk["base_model"])
            if bm is None:
                raise invalid(f"{req.dir} is a full fine-tuning checkpoint of {mk['base_model']!r}, "
                              f"which this worker does not serve (it serves {self.order})")
            run = self._new_full(req.adapter_id, bm)
        with self.compute:
            try:
                full.load_into(req.dir, run, req.load_optimizer, req.load_gradients)
            except (OSError, ValueError) as e:
                raise invalid(f"cannot load full fine-tuning checkpoint from {req.dir}: {e}")
        if fresh:
            self._add_full(req.adapter_id, run.shared, run)
