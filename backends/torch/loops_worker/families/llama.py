"""Llama 2/3.x dense (meta-llama/Llama-3.1-8B, 3.2-1B, 3.3-70B): GQA attention, SwiGLU MLP,
rope_scaling of type llama3 (3.1+) computed by transformers' rotary embedding."""

from . import Family

_ROPE_TYPES = ("default", "llama3", "linear", "dynamic", "yarn")


def _check(config):
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    t = rp.get("rope_type", rp.get("type", "default")) if isinstance(rp, dict) else "default"
    if t not in _ROPE_TYPES:
        return f"rope type {t!r} is not one of {list(_ROPE_TYPES)}"
    return None


FAMILY = Family(
    name="llama", model_types=("llama",), publisher="Meta", renderer="llama3", check=_check,
    notes="Llama 3 chat template (<|start_header_id|>): renderer llama3 for -Instruct models, role_colon "
          "for base models; rope_scaling llama3 (3.1+)")
