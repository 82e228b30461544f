"""The model families the torch worker trains: one file per family.

A family maps a Hugging Face config.json (its model_type) to what the worker needs to
train LoRA adapters on it: the module names of its LoRA targets (attention, MLP, fused
MoE experts, the unembedding), the limits it is refused over, its publisher, and the
tinker-cookbook renderer that fits its chat models. Adding a family is one file here
(a module-level FAMILY) plus its parity test in tests/test_families.py; docs/models.md
says how.

An unknown model_type is refused when the model is loaded (for_config), naming the
family and the ones served.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = "lm_head"
# Where a vision-language model (…ForConditionalGeneration) keeps its language model's
# decoder: the text model's "model." is this in the VL model's module (and PEFT key) names.
VL_PREFIX = "model.language_model."
# Checkpoint key → text model key, for loading a VL checkpoint's language model as the text
# model: transformers 5 writes model.language_model.*, Gemma 3's published checkpoints hold
# the older language_model.model.* / language_model.lm_head.*. Other keys (the vision tower,
# the projector) are not read.
VL_KEY_MAPPING = {r"^model\.language_model\.": "model.", r"^language_model\.model\.": "model.",
                  r"^language_model\.lm_head\.": "lm_head."}


@dataclass(frozen=True)
class Family:
    """One model family.

    attn, mlp: leaf names of the nn.Linear modules adapted when an adapter trains attention
    (train_attn) or the MLP (train_mlp); a dense MLP inside a MoE model (shared experts,
    dense layers) is found by the same names. experts: names of fused expert parameters
    (3-D, [experts, out, in], or [experts, in, out] when the module says is_transposed)
    adapted per expert with train_mlp, as PEFT's target_parameters does. unembed: the
    output head, adapted with train_unembed.
    """

    name: str  # the family's name in the catalog (e.g. "qwen3_moe")
    model_types: Tuple[str, ...]  # config.json model_type values it serves
    publisher: str
    renderer: str  # tinker-cookbook renderer for its chat models ("role_colon" for base models)
    attn: Tuple[str, ...] = ATTN
    mlp: Tuple[str, ...] = MLP
    experts: Tuple[str, ...] = ()
    unembed: str = UNEMBED
    notes: str = ""  # limits and quirks, for docs/models.md and errors
    # the attention implementation the worker asks transformers for when --attn-implementation
    # is auto (the default): sdpa, unless the family's modeling code does not offer it
    attn_implementation: str = "sdpa"
    # check(config) -> None or the reason this config is refused (a variant the worker
    # cannot compute exactly); a VL checkpoint's check gets its outer config
    check: Optional[Callable[[object], Optional[str]]] = None
    # model_types of vision-language checkpoints (config.json with a text_config and a
    # vision_config) whose language model is this family: the worker loads the text model
    # only (the vision tower is not read) and names adapter keys as PEFT does on the full
    # VL model, where the language model lives under model.language_model (VL_PREFIX)
    vision: Tuple[str, ...] = ()
    # whether the worker serves image chunks on the vision-language checkpoints (vision):
    # it then loads the full …ForConditionalGeneration (vision tower frozen, LoRA on the
    # language model only) and runs the model's image processor; otherwise their language
    # model alone is loaded and served on text
    images: bool = False
    # the transformers model_type whose config and modeling code compute this family's
    # checkpoints, when their config.json names a model_type transformers lacks (remote code):
    # load_config reads such a config.json as that model_type's config
    loads_as: str = ""
    # checkpoint key → text model key patterns of the family's VL checkpoints, tried before
    # VL_KEY_MAPPING's (a layout transformers writes for this family only)
    key_mapping: Tuple[Tuple[str, str], ...] = ()
    # a regex (full match, as PEFT's exclude_modules) of module names that carry a target leaf
    # name but are not adapted (e.g. DeepSeek-V4's compressor kv_proj); written to
    # adapter_config.json's exclude_modules so PEFT adapts the same modules
    exclude: str = ""

    def targets(self) -> List[str]:
        """Every module/parameter leaf name the family adapts."""
        return list(self.attn) + list(self.mlp) + list(self.experts) + [self.unembed]

    def kind(self, leaf: str) -> Optional[str]:
        """"attn", "mlp" or "unembed" for a target leaf name; None when not a target."""
        if leaf in self.attn:
            return "attn"
        if leaf in self.mlp or leaf in self.experts:
            return "mlp"
        if leaf == self.unembed:
            return "unembed"
        return None


# The family files, in catalog order.
MODULES = ["qwen3", "qwen2", "llama", "mistral", "gemma3", "qwen3_5", "qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_5_moe", "glm_moe_dsa", "minimax_m2", "nemotron_h", "qwen3_vl",
           "gemma4", "kimi_k2", "kimi_k25", "deepseek_v4", "qwen3_next"]


# model_types transformers implements that the worker still refuses, and why (added to the
# refusal): a family file is what serves a model_type (docs/models.md, "Adding a family")
_GLM5_NEXT = ("GLM-5.3: transformers implements it only as Glm5NextForConditionalGeneration (no causal LM of its "
              "text model glm5_next_text that the worker could train and sample); train GLM-5 (glm_moe_dsa) instead")
UNSERVED = {"glm5_next": _GLM5_NEXT, "glm5_next_text": _GLM5_NEXT}


def _load() -> Dict[str, Family]:
    out: Dict[str, Family] = {}
    for m in MODULES:
        fam: Family = importlib.import_module(f"{__name__}.{m}").FAMILY
        for t in fam.model_types + fam.vision:
            if t in out:
                raise RuntimeError(f"model_type {t!r} is claimed by both {out[t].name} and {fam.name}")
            out[t] = fam
    return out


BY_MODEL_TYPE: Dict[str, Family] = _load()
FAMILIES: List[Family] = list(dict.fromkeys(BY_MODEL_TYPE.values()))
VISION_TYPES = frozenset(t for f in FAMILIES for t in f.vision)


def supported() -> str:
    return ", ".join(sorted(BY_MODEL_TYPE))


def all_target_names() -> List[str]:
    """Every target leaf name of every family (what an adapter_config.json may list)."""
    return list(dict.fromkeys(n for f in FAMILIES for n in f.targets()))


def key_mapping(family: Family) -> Dict[str, str]:
    """Checkpoint key → text model key, for loading a VL checkpoint of family as its text model."""
    return {**dict(family.key_mapping), **VL_KEY_MAPPING}


def is_vision(config) -> bool:
    """Whether a config is a vision-language checkpoint's (a text_config inside it)."""
    return (getattr(config, "model_type", "") or "") in VISION_TYPES


def text_config(config):
    """The language model's config of a vision-language config; the config itself otherwise."""
    return config.get_text_config() if is_vision(config) else config


def vl_name(name: str) -> str:
    """The module name in the full VL model of a text model's module name (lm_head stays)."""
    return VL_PREFIX + name[len("model."):] if name.startswith("model.") else name


def load_config(path: str):
    """(transformers config, model_type) of a model folder. A family with loads_as (its
    checkpoints name a model_type transformers lacks, e.g. kimi_k2) gets its config.json
    read as that model_type's config, without remote code; model_type is config.json's own."""
    from transformers import AutoConfig

    try:
        with open(os.path.join(path, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        raw = None
    mt = raw.get("model_type", "") if isinstance(raw, dict) else ""
    fam = BY_MODEL_TYPE.get(mt)
    if fam is None or not fam.loads_as:
        cfg = AutoConfig.from_pretrained(path)
        return cfg, getattr(cfg, "model_type", "") or ""
    kw = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map", "transformers_version")}
    return AutoConfig.for_model(fam.loads_as, **kw), mt


def for_config(config, model_type: Optional[str] = None) -> Family:
    """The family of a transformers config (model_type: config.json's, when load_config read
    it as another model_type's config); ValueError naming the model_type and what is
    served when the worker does not serve it, or naming the limit a config is over."""
    mt = model_type or getattr(config, "model_type", "") or ""
    fam = BY_MODEL_TYPE.get(mt)
    if fam is None:
        arch = (getattr(config, "architectures", None) or [mt])[0]
        why = f" ({UNSERVED[mt]})" if mt in UNSERVED else ""
        raise ValueError(
            f"model family {mt!r} ({arch}) is not served by the torch worker{why}; it serves the model_types "
            f"{supported()} (docs/models.md says how to add a family)")
    why = (fam.check(config) if fam.check is not None else None) or (_aux_loss(config) if fam.experts else None)
    if why:
        raise ValueError(f"{fam.name} model refused: {why}")
    return fam


def _aux_loss(config) -> Optional[str]:
    """Why a MoE config is refused for its router's load-balancing loss: with
    output_router_logits on and a non-zero router_aux_loss_coef, transformers adds that loss
    to the training loss, and the worker's losses (Tinker's loss functions) never do. The
    released checkpoints leave output_router_logits off; the reference engine refuses the
    same configs (docs/semantics.md)."""
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is not None and getattr(cfg, "output_router_logits", False) and getattr(cfg, "router_aux_loss_coef", 0):
            return (f"its config sets output_router_logits with router_aux_loss_coef {cfg.router_aux_loss_coef}: "
                    "transformers would add the router's load-balancing loss to the training loss, which Loops' "
                    "loss functions do not; set output_router_logits to false in config.json (the released "
                    "checkpoints do)")
    return None
