"""Gemma 3 text (google/gemma-3-270m, -1b; the text model of the larger ones): interleaved
sliding-window and global attention layers, embeddings scaled by sqrt(hidden), GELU-tanh
MLP with pre/post feed-forward norms, tied embeddings (lm_head shares the embedding: its
LoRA adapts the output projection only, the input embedding stays frozen, as PEFT's
lm_head target does).

The multimodal checkpoints (google/gemma-3-4b-it and larger: model_type gemma3,
Gemma3ForConditionalGeneration, keys language_model.model.*) are served for text: the
worker loads their language model only and names adapter keys as PEFT does on the full
model (model.language_model.*); image inputs are refused. Their …ForConditionalGeneration
does not apply the text config's final_logit_softcapping (Gemma3ForCausalLM does), so a
multimodal config that sets it is refused rather than served one way or the other."""

from typing import Optional

from . import Family


def _check(config) -> Optional[str]:
    if getattr(config, "model_type", "") == "gemma3" and getattr(config.get_text_config(), "final_logit_softcapping", None):
        return ("its text_config sets final_logit_softcapping, which transformers' Gemma3ForConditionalGeneration "
                "does not apply and Gemma3ForCausalLM does; remove it (published Gemma 3 checkpoints have none)")
    return None

FAMILY = Family(
    name="gemma3", model_types=("gemma3_text",), publisher="Google", renderer="role_colon", vision=("gemma3",),
    check=_check,
    notes="Gemma chat template (<start_of_turn>user); tinker-cookbook 0.6.1 has no Gemma renderer, so "
          "role_colon; a multimodal gemma3 checkpoint serves its language model on text, image inputs are refused")
