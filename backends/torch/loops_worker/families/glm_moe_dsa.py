"""GLM-5 (zai-org/GLM-5; model_type glm_moe_dsa): DeepSeek-style multi-head latent attention
with the DSA sparse-attention indexer, a dense MLP in the first layers and a MoE block of
routed experts (fused gate_up_proj [E, 2·I, H], down_proj [E, H, I]) with shared experts.

LoRA with train_attn: the MLA projections (q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj,
o_proj); with train_mlp: the routed experts per expert at rank r (PEFT's target_parameters).
Not adapted: the indexer (wq_b, wk, weights_proj: it only chooses which keys attend), the
router, the shared experts and the dense first layers (PEFT reads gate_proj/up_proj/down_proj
in a glm_moe_dsa adapter_config.json as transformers 4's experts and fuses them at rank 2r)."""

from . import Family
from .deepseek_v3 import FAMILY as DEEPSEEK

FAMILY = Family(
    name="glm_moe_dsa", model_types=("glm_moe_dsa",), publisher="Z.ai", renderer="role_colon",
    attn=DEEPSEEK.attn, mlp=(), experts=("gate_up_proj", "down_proj"),
    notes="tinker-cookbook 0.6.1's GLM renderers are GLM-5.3's (glm5_3_*), so role_colon; indexer, router, "
          "shared experts and dense first layers not adapted")
