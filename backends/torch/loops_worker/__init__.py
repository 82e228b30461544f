"""Loops worker: serves loops.backend.v1 (TrainerService, SamplerService) over gRPC with
PyTorch + transformers (multi-adapter LoRA trainer) and transformers or vLLM (sampler)."""

__version__ = "0.1.0"
