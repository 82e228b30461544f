// Package tokenizer implements the byte-level BPE tokenizer of the built-in tiny model
// (deterministic training, encoding, decoding, and writing Hugging Face tokenizer.json and
// tokenizer_config.json files that transformers' AutoTokenizer loads offline), and decoding
// of the tokenizer.json of Hugging Face models (Qwen, Llama 3) for stop strings.
package tokenizer
