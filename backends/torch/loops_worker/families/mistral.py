"""Mistral dense (mistralai/Mistral-7B-v0.3, Ministral): Llama's blocks, with an optional
sliding window that transformers' attention mask applies."""

from . import Family

FAMILY = Family(
    name="mistral", model_types=("mistral",), publisher="Mistral AI", renderer="role_colon",
    notes="[INST] chat template; tinker-cookbook 0.6.1 has no Mistral renderer, so role_colon")
