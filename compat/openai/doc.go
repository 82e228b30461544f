// Package openai serves an OpenAI-compatible inference API under /oai/api/v1: POST
// /chat/completions, POST /completions and GET /models, for base models and sampler
// checkpoints (model = "<base model>", "tinker://<run>/sampler_weights/<name>" or
// "<base model>;<checkpoint path>").
//
// Like the Tinker adapter (package compat) it is nothing but translation onto the loops.v1
// core services: a request is decoded and range-checked, chat messages are rendered with the
// model's own chat template (the chat_template of its tokenizer_config.json, evaluated by
// gonja, a Go Jinja implementation) and tokenized with the model's tokenizer.json, and then
// the core samples: SamplingService.CreateSampler (one sampler per workspace and model,
// remembered in a bounded LRU), SamplingService.Sample and OperationService.WaitOperation.
// The sampled tokens are decoded back to text. No sampling logic lives here.
//
// Streaming (stream: true) answers with server-sent events in OpenAI's chunk format, but the
// core samples a whole sequence at a time, so the chunks are sent when the sample completes.
//
// Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with the HTTP
// status of the one error table (internal/errs, its Tinker column: permanent errors are
// never 409 or 5xx, which OpenAI clients would retry). Every field this adapter does not
// implement is a 400 that names it; nothing is silently ignored. See docs/openai.md.
package openai
