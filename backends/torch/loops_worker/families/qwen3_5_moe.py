"""Qwen3.5-MoE (Qwen/Qwen3.5-35B-A3B, -397B-A17B; their text model): Qwen3.5's Gated DeltaNet
and full attention layers with a MoE block of routed experts (fused gate_up_proj [E, 2·I, H],
down_proj [E, H, I]) and one gated shared expert.

LoRA with train_attn: q/k/v/o and the linear-attention in_proj_qkv, in_proj_z, out_proj (as
qwen3_5); with train_mlp: the routed experts per expert at rank r (PEFT's
target_parameters) and the shared expert's gate/up/down. Not adapted: the router
(mlp.gate), the shared expert's gate (shared_expert_gate), in_proj_a/in_proj_b and conv1d."""

from . import MLP, Family
from .qwen3_5 import FAMILY as DENSE

FAMILY = Family(
    name="qwen3_5_moe", model_types=("qwen3_5_moe_text",), publisher="Qwen", renderer="qwen3_5", vision=("qwen3_5_moe",),
    attn=DENSE.attn, mlp=MLP, experts=("gate_up_proj", "down_proj"),
    notes="renderer qwen3_5; the text model's config (qwen3_5_moe_text); the vision-language checkpoint "
          "(qwen3_5_moe) serves its language model on text, image inputs are refused; router and shared_expert_gate not adapted")
