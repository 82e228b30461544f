// Package tiny builds the built-in model, "loops/tiny": a Qwen3-shaped
// decoder of about 3.3 million parameters with random weights from a fixed seed, and a
// byte-level BPE tokenizer trained deterministically on a small built-in text. Write
// produces a Hugging Face folder (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json, generation_config.json) that the reference engine, the worker
// client (for Python workers) and transformers all load. It is its own package so that the
// worker client needs no part of the reference engine's backend (it uses the engine's nn,
// safetensors and tokenizer libraries to make the folder).
package tiny
