// Package tinkerlayout converts LoRA adapters between PEFT's layout, which Loops stores and
// its engines load, and Tinker's, which the tinker SDK and CLI download and which
// tinker-cookbook's weights tools (build_hf_model, build_lora_adapter, publish_to_hf_hub)
// read.
//
// For the dense decoder families Loops serves (Qwen3, Qwen2, Llama, Gemma 3 and the
// built-in loops/tiny) the two layouts differ in one name: Tinker calls the unembedding's
// LoRA base_model.model.model.unembed_tokens where PEFT calls it base_model.model.lm_head.
// The cookbook maps unembed_tokens to lm_head, or to model.embed_tokens for a model with
// tied embeddings, whose checkpoint has no lm_head; a PEFT name would make it look for
// lm_head.weight and fail on tied models. The tensors themselves (shapes, A [r, in],
// B [out, r], lora_alpha / r) are the same in both layouts.
//
// MoE experts (experts.go): Loops stores a fused-experts LoRA in PEFT's target_parameters
// layout (A [E·r, in], B [out, r·E]); Tinker's is 3-D per projection, experts.w1 (gate),
// w3 (up), w2 (down), A (E, r, in), B (E, out, r); Nemotron-H's gateless experts have w1 (up)
// and w2 only. ToTinker converts to it for the families in ExpertFamilies and refuses others
// with ErrNoTinkerLayout; ToPEFT reads it back bit for bit.
//
// Vision-language checkpoints: PEFT names their language model model.language_model.*
// (Base.LanguageModelPrefix); Tinker names it as the text model (model.*), to which the
// cookbook adds the prefix itself. TinkerName and PEFTName convert between the two.
//
// Files are converted as streams: a safetensors file's header is rewritten and its data
// section copied unchanged, so a download never holds a checkpoint in memory.
package tinkerlayout
