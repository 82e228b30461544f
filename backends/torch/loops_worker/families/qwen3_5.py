"""Qwen3.5 dense (Qwen/Qwen3.5-4B, -9B-Base; their text model): layers alternate Gated
DeltaNet linear attention (linear_attn: in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, a
causal conv1d, out_proj) and full attention (self_attn: q/k/v/o, with an output gate in
q_proj). LoRA with train_attn: q/k/v/o of the full-attention layers and in_proj_qkv,
in_proj_z and out_proj of the linear-attention layers; in_proj_a/in_proj_b (one output
per value head: the decay and write gates) and conv1d stay frozen.

The published checkpoints (Qwen/Qwen3.5-4B, the cookbook's default) are vision-language
(model_type qwen3_5, Qwen3_5ForConditionalGeneration): the worker loads the full model and
serves image chunks as for Qwen3-VL (qwen3_vl.py: the model's image processor, vision tower
frozen, LoRA on the language model only, model.language_model.*, lm_head)."""

from . import ATTN, Family

FAMILY = Family(
    name="qwen3_5", model_types=("qwen3_5_text",), publisher="Qwen", renderer="qwen3_5", vision=("qwen3_5",), images=True,
    attn=ATTN + ("in_proj_qkv", "in_proj_z", "out_proj"),
    notes="renderer qwen3_5 (qwen3_5_disable_thinking); the text model's config (model_type qwen3_5_text); "
          "a vision-language checkpoint (qwen3_5) takes image chunks (the vision tower frozen); linear attention's in_proj_a/"
          "in_proj_b and conv1d are not adapted")
