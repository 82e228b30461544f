// Package oracle is an independent, plainly written float64 implementation of the model
// math that every Loops backend must reproduce. The backend contract suite
// (conformance/backendtest) takes its expected values from here.
//
// It reads a Hugging Face model folder (config.json and *.safetensors in F32, F16, BF16 or
// F64) and a PEFT LoRA adapter folder (adapter_config.json and adapter_model.safetensors),
// and computes, in float64:
//
//   - the Qwen3/Qwen2/Llama dense decoder forward pass: RMSNorm, rotary embeddings with the
//     config's rope_theta (and Llama 3 rope_scaling), grouped-query attention, optional
//     q/k RMSNorm and q/k/v biases, SwiGLU MLP, tied or untied lm_head, with LoRA deltas
//     scale·B·A (scale = lora_alpha / r) on any of q,k,v,o,gate,up,down,lm_head (on a
//     tied model with ensure_weight_tying, the lm_head delta also joins the embedding
//     lookup: the shared matrix is adapted);
//   - per-token log-probabilities, temperature-scaled next-token distributions, greedy
//     continuations and top-k prompt log-probabilities;
//   - every Tinker loss Loops serves (cross_entropy, importance_sampling, ppo, cispo, dro,
//     gspo) with its loss_fn_config keys and defaults, per token and summed, and its
//     derivative with respect to the learner log-prob (with cispo's and gspo's
//     stop-gradients; gspo's sequence ratio from the datum's marked positions);
//   - adapter gradients by central finite differences of a surrogate Σ c·lp whose
//     coefficients c are the loss derivatives at the current point (which is the exact
//     gradient for the smooth losses and implements stop-gradient for cispo and gspo);
//   - AdamW as torch.optim.AdamW does it, after torch-style global-norm clipping.
//
// It is written from the math in DESIGN.md ("Semantics every backend implements") and
// deliberately shares no code with any backend: it is slow, simple and obviously correct
// rather than fast.
package oracle
