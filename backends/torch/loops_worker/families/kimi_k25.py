"""Kimi K2.5 / K2.6 (moonshotai/Kimi-K2.5; model_type kimi_k25, Kimi_K25ForConditionalGeneration):
a MoonViT vision tower and projector in front of a language model that is DeepSeek-V3's
architecture (transformers' Kimi_K25Config gives its text_config model_type deepseek_v3,
converting the hub's kimi_k2). The worker trains and samples that language model on text,
with deepseek_v3's LoRA targets (MLA projections; routed experts per expert at rank r); the
vision tower is not read and image inputs are refused."""

from . import Family
from .deepseek_v3 import FAMILY as TEXT

FAMILY = Family(
    name="kimi_k25", model_types=(), publisher="Moonshot AI", renderer="kimi_k25", vision=("kimi_k25",),
    # transformers 5 saves Kimi_K25ForConditionalGeneration's decoder layers as
    # language_model.model.blocks.N (its load renames blocks → layers, meant for MoonViT, and
    # the save reverses it everywhere); the hub's checkpoints say layers
    key_mapping=((r"^language_model\.model\.blocks\.", "model.layers."),),
    attn=TEXT.attn, mlp=TEXT.mlp, experts=TEXT.experts,
    notes="renderer kimi_k25 (kimi_k25_disable_thinking; kimi_k26 for K2.6); its language model is deepseek_v3's "
          "architecture, served on text, image inputs refused; router, shared experts and dense first layers not adapted")
