// Package anthropic serves an Anthropic-compatible Messages API under /anthropic/api (the
// base URL an Anthropic client is given; it appends /v1/messages): POST /v1/messages and
// POST /v1/messages/count_tokens, for base models and sampler checkpoints (model =
// "<base model>", "tinker://<run>/sampler_weights/<name>" or "<base model>;<checkpoint
// path>"), authenticated by the gateway with the same keys as every surface (x-api-key, as
// Anthropic's clients send it, or Authorization: Bearer).
//
// Like compat/openai it is nothing but translation: a request is decoded and range-checked
// here, and the machinery the two share (compat/internal/infer) renders the system prompt
// and messages with the model's own chat template, tokenizes them, and has the core's
// SamplingService sample them (one sampler per workspace and model, remembered in a bounded
// LRU). With stream: true the answer is Anthropic's server-sent events (message_start,
// content_block_start, ping, content_block_delta per batch of new text, content_block_stop,
// message_delta, message_stop), sent while the tokens are decoded.
//
// Errors have Anthropic's shape, {"type": "error", "error": {"type", "message"}}, with the
// HTTP status of the one error table (internal/errs, its Tinker column: permanent errors are
// never 409 or 5xx, which clients would retry). Every field this adapter does not implement
// is a 400 that names it. See docs/anthropic.md.
package anthropic
