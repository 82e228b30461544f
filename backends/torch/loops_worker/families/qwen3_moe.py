"""Qwen3-MoE (Qwen/Qwen3-30B-A3B, 235B-A22B): Qwen3 attention and a sparse MoE block whose
experts are fused 3-D parameters (Qwen3MoeExperts: gate_up_proj [E, 2·I, H], down_proj
[E, H, I]). LoRA: attention q/k/v/o, and per expert on gate_up_proj and down_proj (rank r
per expert, PEFT's target_parameters layout); the router (mlp.gate) is not adapted. Dense
MLP layers (mlp_only_layers, decoder_sparse_step > 1; the released checkpoints have none)
are not adapted: PEFT reads the names gate_proj/up_proj/down_proj in a qwen3_moe
adapter_config.json as the experts of transformers 4 and fuses them into gate_up_proj at
rank 2r, so listing them would not load in PEFT as trained."""

from . import Family

FAMILY = Family(
    name="qwen3_moe", model_types=("qwen3_moe",), publisher="Qwen", renderer="qwen3",
    mlp=(), experts=("gate_up_proj", "down_proj"),
    notes="experts adapted per expert at rank r (A [E·r, in], B [out, E·r] as PEFT stores them); router "
          "not adapted; the load-balancing auxiliary loss is not part of the training loss; dense MLP layers (mlp_only_layers) are not adapted")
