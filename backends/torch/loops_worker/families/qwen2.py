"""Qwen2 / Qwen2.5 dense: q/k/v with biases (LoRA adapts the weight; the bias stays frozen)."""

from . import Family

FAMILY = Family(
    name="qwen2", model_types=("qwen2",), publisher="Qwen", renderer="role_colon",
    notes="ChatML template; tinker-cookbook 0.6.1 has no Qwen2 renderer, so role_colon")
