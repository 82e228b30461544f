// Package reference is Loops' embedded pure-Go CPU engine: a LoRA trainer and sampler for
// Qwen3, Qwen2/2.5 and Llama 3 dense decoders loaded from Hugging Face folders (or the
// built-in "loops/tiny" model), implementing the loops.backend.v1 TrainerService and
// SamplerService. It is the numerical reference the other backends are checked against;
// see README.md in this folder for every semantic decision.
package reference
