// Package openai serves an OpenAI-compatible inference API under /oai/api/v1: POST
// /chat/completions, POST /completions, POST /embeddings and GET /models, for base models and sampler
// checkpoints (model = "<base model>", "tinker://<run>/sampler_weights/<name>" or
// "<base model>;<checkpoint path>").
//
// Like the Tinker adapter (package compat) it is nothing but translation onto the loops.v1
// core services: a request is decoded and range-checked here, and the machinery it shares
// with compat/anthropic (compat/internal/infer) renders chat messages with the model's own
// chat template (the chat_template of its tokenizer_config.json, evaluated by gonja, a Go
// Jinja implementation), tokenizes them with the model's tokenizer.json, and has the core
// sample: SamplingService.CreateSampler (one sampler per workspace and model, remembered in
// a bounded LRU), SamplingService.Sample and OperationService.WaitOperation. The sampled
// tokens are decoded back to text. No sampling logic lives here.
//
// Streaming (stream: true) answers with server-sent events in OpenAI's chunk format as the
// tokens are decoded: the core's SamplingService.SampleStream hands them from the backend's
// decoder (internal/tokenstream) without ever making it wait; a client that stops reading
// for 30 s, falls infer.StreamBacklog tokens behind or disconnects has its samples stopped.
// A backend that cannot stream (a worker sampling with vLLM, or one older than
// StreamSample) sends each choice's text in one chunk when it completes.
//
// POST /embeddings has the core embed each input (SampleRequest.embed: the mean over its
// tokens of the model's final hidden state, after the final norm), one sample per input,
// queued and metered as samples are; see embeddings.go for the bounds.
//
// Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with the HTTP
// status of the one error table (internal/errs, its Tinker column: permanent errors are
// never 409 or 5xx, which OpenAI clients would retry). Every field this adapter does not
// implement is a 400 that names it; nothing is silently ignored. See docs/openai.md.
package openai
