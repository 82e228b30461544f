"""Qwen3 dense (Qwen/Qwen3-0.6B … 32B): q/k/v/o with per-head q_norm/k_norm, SwiGLU MLP."""

from . import Family

FAMILY = Family(
    name="qwen3", model_types=("qwen3",), publisher="Qwen", renderer="qwen3",
    notes="chat template with <think> blocks: renderer qwen3 (qwen3_disable_thinking, qwen3_instruct for "
          "2507 instruct models); base models use role_colon")
