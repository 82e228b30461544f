"""Gemma 4 (google/gemma-4-e2b-it, -e4b-it, -26B-A4B-it, -31B-it; their language model):
Gemma 3's interleaved sliding-window and global layers (global layers with their own head
dimension, proportional RoPE and, with attention_k_eq_v, keys reused as values: no v_proj),
per-layer embeddings (PLE: a second token embedding projected into every layer through
per_layer_input_gate / per_layer_projection), the last layers reusing earlier layers' keys
and values (num_kv_shared_layers: those layers have no k_proj/v_proj), and, in the MoE
checkpoints, a routed-expert block (fused gate_up_proj [E, 2·I, H], down_proj [E, H, I])
beside each layer's dense MLP. Embeddings are tied.

LoRA with train_attn: q/k/v/o where a layer has them; with train_mlp: the dense MLP's
gate/up/down and the routed experts per expert at rank r (PEFT's target_parameters; PEFT has
no transformers-4 remap for Gemma 4, so the dense names are safe to list). Not adapted: the
router (router.proj, its scales), the PLE projections and embeddings.

The published checkpoints are multimodal (model_type gemma4, Gemma4ForConditionalGeneration,
with vision and audio towers): the worker trains and samples their language model on text
(model.language_model.*); image and audio inputs are refused."""

from typing import Optional

from . import Family


def _check(config) -> Optional[str]:
    text = config.get_text_config()
    if getattr(text, "use_bidirectional_attention", None) == "all":
        return ("use_bidirectional_attention is 'all' (every token attends to every other): that is not a causal "
                "language model, so it cannot be trained or sampled token by token; use a causal Gemma 4 checkpoint")
    return None


FAMILY = Family(
    name="gemma4", model_types=("gemma4_text",), publisher="Google", renderer="role_colon", vision=("gemma4",),
    experts=("gate_up_proj", "down_proj"), check=_check,
    notes="Gemma chat template; tinker-cookbook 0.6.1 has no Gemma renderer, so role_colon; the multimodal gemma4 "
          "checkpoint serves its language model on text, image and audio inputs are refused; router and per-layer "
          "embedding projections not adapted")
