"""DeepSeek-V4 (deepseek-ai/DeepSeek-V4-Flash, -Pro; V4.1): single-KV-head attention with a
query LoRA (q_a_proj → q_b_proj), one projection for keys and values (kv_proj), per-head
sinks and a grouped low-rank output projection (o_a_proj, a block-diagonal
DeepseekV4GroupedLinear, then o_b_proj); sliding-window layers and layers that add
compressed KV entries (HCA, and CSA with its indexer); hyper-connections (hc_mult residual
streams mixed by Sinkhorn-normalised weights); MoE layers of routed experts (fused
gate_up_proj, down_proj; the first layers hash-routed by token id) and shared experts.

LoRA with train_attn: q_a_proj, q_b_proj, kv_proj, o_b_proj; with train_mlp: the shared
experts' gate/up/down and the routed experts per expert at rank r (PEFT's
target_parameters; PEFT has no transformers-4 remap for DeepSeek-V4). Not adapted: o_a_proj
(its grouped forward is not a plain Linear, so PEFT's LoRA on it would have the wrong shape),
the compressors and the indexer (their kv_proj/gate_proj/q_b_proj share target names and
are left out by exclude_modules), the routers, sinks and hyper-connection weights.

The published checkpoints are FP8/FP4-quantized: refused (LoRA training needs the
unquantized weights: use a bf16 conversion)."""

from typing import Optional

from . import Family


def _check(config) -> Optional[str]:
    if getattr(config, "quantization_config", None):
        return ("the checkpoint is quantized (quantization_config, DeepSeek-V4's FP8/FP4 release); LoRA training needs "
                "the unquantized weights: use a bf16 conversion of the checkpoint")
    return None


FAMILY = Family(
    name="deepseek_v4", model_types=("deepseek_v4",), publisher="DeepSeek", renderer="deepseekv4_1",
    attn=("q_a_proj", "q_b_proj", "kv_proj", "o_b_proj"), experts=("gate_up_proj", "down_proj"),
    exclude=r".*\.compressor\..*", attn_implementation="eager", check=_check,
    notes="renderer deepseekv4_1 (its _low/_max_reasoning, _disable_thinking variants); transformers ships V4 eager-only "
          "(per-head sinks); o_a_proj, compressors, indexer, routers, sinks and hyper-connections not adapted; "
          "quantized checkpoints refused")
