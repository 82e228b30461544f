"""Nemotron-H / Nemotron 3 (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B): a hybrid of Mamba-2 mixers,
attention layers and MoE layers (routed experts with non-gated ReLU² MLPs, fused up_proj
[E, I, H] and down_proj [E, H, I], plus shared experts), one mixer per block.

LoRA with train_attn: q/k/v/o of the attention layers and in_proj of the Mamba-2 mixers;
with train_mlp: the routed experts per expert at rank r (PEFT's target_parameters) and the
shared experts' (and dense MLP layers') up_proj/down_proj. Not adapted: the Mamba-2 conv1d
and out_proj (PEFT refuses them: the fused Mamba kernels read out_proj's weight directly),
its A_log/D/dt_bias, and the router."""

from . import Family

FAMILY = Family(
    name="nemotron_h", model_types=("nemotron_h",), publisher="NVIDIA", renderer="nemotron3",
    attn=("q_proj", "k_proj", "v_proj", "o_proj", "in_proj"), mlp=("up_proj", "down_proj"),
    experts=("up_proj", "down_proj"),
    notes="renderer nemotron3 (nemotron3_disable_thinking); Mamba-2 conv1d/out_proj and the router not adapted")
