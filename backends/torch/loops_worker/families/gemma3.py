"""Gemma 3 text (google/gemma-3-270m, -1b; the text model of the larger ones): interleaved
sliding-window and global attention layers, embeddings scaled by sqrt(hidden), GELU-tanh
MLP with pre/post feed-forward norms, tied embeddings (lm_head shares the embedding: its
LoRA adapts the output projection only, the input embedding stays frozen, as PEFT's
lm_head target does)."""

from . import Family

FAMILY = Family(
    name="gemma3", model_types=("gemma3_text",), publisher="Google", renderer="role_colon",
    notes="Gemma chat template (<start_of_turn>user); tinker-cookbook 0.6.1 has no Gemma renderer, so "
          "role_colon; the multimodal gemma3 (vision) config is not served")
