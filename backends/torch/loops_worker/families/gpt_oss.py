"""gpt-oss (openai/gpt-oss-20b, -120b): attention with biases and sinks, alternating sliding
and full attention, a MoE block whose experts are fused 3-D parameters stored transposed
(GptOssExperts: gate_up_proj [E, H, 2·I] with interleaved gate/up, down_proj [E, I, H],
with biases). LoRA: attention q/k/v/o and per expert on gate_up_proj and down_proj (rank r
per expert, PEFT's target_parameters layout); the router and the biases are not adapted."""

from . import Family


def _check(config):
    if getattr(config, "quantization_config", None):
        return "MXFP4-quantized checkpoints are not served; use a dequantized (bf16) checkpoint"
    return None


FAMILY = Family(
    name="gpt_oss", model_types=("gpt_oss",), publisher="OpenAI", renderer="gpt_oss_no_sysprompt",
    experts=("gate_up_proj", "down_proj"), check=_check,
    attn_implementation="eager",  # transformers offers no sdpa for its attention sinks
    notes="harmony chat format: renderer gpt_oss_no_sysprompt (or gpt_oss_{low,medium,high}_reasoning); "
          "router not adapted")
