"""DeepSeek-V3 / V3.1 / R1 (and Kimi K2's text model, the same architecture): multi-head
latent attention (q_a_proj → q_b_proj, or q_proj without a query LoRA; kv_a_proj_with_mqa →
kv_b_proj; o_proj) and a MoE block of routed experts (DeepseekV3Experts: fused gate_up_proj
[E, 2·I, H], down_proj [E, H, I]), shared experts and, in the first layers
(first_k_dense_replace), a dense MLP.

LoRA with train_attn: every MLA projection; with train_mlp: the routed experts, per expert at
rank r (PEFT's target_parameters layout). Not adapted: the router (mlp.gate and its
correction bias), the shared experts and the dense first layers: PEFT reads gate_proj/
up_proj/down_proj in a deepseek_v3 adapter_config.json as the experts of transformers 4 and
fuses them into gate_up_proj at rank 2r, so listing them would not load in PEFT as trained."""

from . import Family

FAMILY = Family(
    name="deepseek_v3", model_types=("deepseek_v3",), publisher="DeepSeek", renderer="deepseekv3",
    attn=("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"),
    mlp=(), experts=("gate_up_proj", "down_proj"),
    notes="renderer deepseekv3 (deepseekv3_thinking); Kimi K2 checkpoints use kimi_k2; MLA projections and routed "
          "experts adapted; router, shared experts and dense first layers not adapted")
