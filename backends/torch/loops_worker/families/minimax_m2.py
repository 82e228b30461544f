"""MiniMax-M2 (MiniMaxAI/MiniMax-M2): attention with q/k norms over all heads and partial
rotary, and a MoE block of routed experts (fused gate_up_proj [E, 2·I, H], down_proj
[E, H, I]) with a sigmoid router and its correction bias.

LoRA with train_attn: q/k/v/o; with train_mlp: the experts per expert at rank r (PEFT's
target_parameters). The router is not adapted (PEFT reads the names w1/w2/w3/gate in a
minimax_m2 adapter_config.json as transformers 4's experts and router)."""

from . import Family

FAMILY = Family(
    name="minimax_m2", model_types=("minimax_m2",), publisher="MiniMax", renderer="role_colon",
    mlp=(), experts=("gate_up_proj", "down_proj"),
    notes="tinker-cookbook 0.6.1 has no MiniMax renderer, so role_colon; router not adapted")
