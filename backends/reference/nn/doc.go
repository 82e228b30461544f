// Package nn is the numerical core of the reference CPU engine: dense decoder models
// (Qwen3, Qwen2/2.5, Llama 3) with frozen weights, LoRA adapters with gradients and AdamW
// state, a fused forward/backward pass over sequences of many adapters at once, and an
// inference path with a KV cache for sampling. It is generic over float32 (serving) and
// float64 (reference checks in tests) and knows nothing of protobuf.
package nn
