// Package tiny builds the reference engine's built-in model, "loops/tiny": a Qwen3-shaped
// decoder of about 3.3 million parameters with random weights from a fixed seed, and a
// byte-level BPE tokenizer trained deterministically on a small built-in text. Write
// produces a Hugging Face folder (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json, generation_config.json) that the engine and transformers both load.
package tiny
