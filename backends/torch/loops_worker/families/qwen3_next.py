"""Qwen3-Next (Qwen/Qwen3-Next-80B-A3B-Instruct, -Thinking): Qwen3.5's predecessor; layers
alternate Gated DeltaNet linear attention (linear_attn: in_proj_qkvz, in_proj_ba, a causal
conv1d, out_proj) and gated full attention (self_attn: q/k/v/o), each with a MoE block of
routed experts (fused gate_up_proj, down_proj) and one gated shared expert.

LoRA with train_attn: q/k/v/o and the linear attention's in_proj_qkvz and out_proj; with
train_mlp: the routed experts per expert at rank r (PEFT's target_parameters). Not adapted:
in_proj_ba (the decay and write gates) and conv1d, the router, the shared expert and its
gate: PEFT reads gate_proj/up_proj/down_proj in a qwen3_next adapter_config.json as the
experts of transformers 4 (its qwen2_moe conversion) and fuses them into gate_up_proj, so
listing them would not load in PEFT as trained."""

from . import ATTN, Family

FAMILY = Family(
    name="qwen3_next", model_types=("qwen3_next",), publisher="Qwen", renderer="qwen3_instruct",
    attn=ATTN + ("in_proj_qkvz", "out_proj"), mlp=(), experts=("gate_up_proj", "down_proj"),
    notes="renderer qwen3_instruct (qwen3 for -Thinking); linear attention's in_proj_ba and conv1d, the router and "
          "the shared expert not adapted")
