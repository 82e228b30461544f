"""Kimi K2 (moonshotai/Kimi-K2-Instruct, -Thinking; model_type kimi_k2): the checkpoints ship
remote code (configuration_deepseek.py) instead of a transformers model_type, and their text
model is DeepSeek-V3's architecture (architectures DeepseekV3ForCausalLM; one expert group,
8 of 384 routed experts, sigmoid scoring with the noaux_tc correction bias, a yarn RoPE).
transformers' own Kimi K2.5 config converts a kimi_k2 text config to deepseek_v3 the same
way. The worker reads config.json as a deepseek_v3 config (no remote code runs) and trains it
with deepseek_v3's LoRA targets. Variants transformers' DeepSeek-V3 does not compute (another
scoring function or top-k method, MoE on every n-th layer) are refused, and so are quantized
checkpoints (Kimi-K2-Instruct's FP8 blocks, Kimi-K2-Thinking's INT4): use a bf16 conversion."""

from typing import Optional

from . import Family
from .deepseek_v3 import FAMILY as TEXT

# config.json value → what transformers' DeepSeek-V3 computes
_FIXED = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}


def _check(config) -> Optional[str]:
    for k, want in _FIXED.items():
        got = getattr(config, k, None)
        if got is not None and got != want:
            return f"{k} is {got!r}; transformers' DeepSeek-V3 (which computes Kimi K2) implements {k}={want!r} only"
    if getattr(config, "quantization_config", None):
        return ("the checkpoint is quantized (quantization_config); LoRA training needs the unquantized weights: "
                "use a bf16 conversion of the checkpoint")
    return None


FAMILY = Family(
    name="kimi_k2", model_types=("kimi_k2",), publisher="Moonshot AI", renderer="kimi_k2", loads_as="deepseek_v3",
    attn=TEXT.attn, mlp=TEXT.mlp, experts=TEXT.experts, check=_check,
    notes="renderer kimi_k2; config.json (model_type kimi_k2, remote code) read as deepseek_v3, whose architecture it "
          "is; quantized checkpoints refused; router, shared experts and dense first layers not adapted")
