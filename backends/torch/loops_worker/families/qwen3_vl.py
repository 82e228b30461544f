"""Qwen3-VL dense (Qwen/Qwen3-VL-2B/4B/8B/32B-Instruct, model_type qwen3_vl,
Qwen3VLForConditionalGeneration): a Qwen3 language model (model.language_model.*, q/k
norms, interleaved multimodal RoPE) with a ViT vision tower (model.visual.*) whose
DeepStack merger outputs are added to the first decoder layers' hidden states at the
image positions.

The worker loads the full model and serves image chunks: the model's image processor
(transformers' Qwen2-VL processor, Pillow backend) turns each image into patches, its
vision tokens take the chunk's positions, and the model computes the multimodal positions
itself. LoRA adapts the language model only (attention and MLP, the head); the vision tower
and merger are frozen and never adapted, as PEFT's exclude_modules says in the saved
adapter_config.json."""

from . import Family

FAMILY = Family(
    name="qwen3_vl", model_types=(), publisher="Qwen", renderer="qwen3_vl_instruct", vision=("qwen3_vl",),
    images=True,
    notes="renderer qwen3_vl_instruct (qwen3_vl with thinking); image chunks served (the vision tower frozen, "
          "LoRA on the language model only); video inputs are not served")
