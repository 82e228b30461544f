// Package infer is the machinery the inference adapters share (compat/openai and
// compat/anthropic): resolving a request's model string to a core sampler (one per
// workspace and model, remembered in a bounded LRU), a base model's text (its
// tokenizer.json, and its chat template evaluated by gonja), queueing the prompts' samples
// on the core's SamplingService and waiting for them, and streaming the tokens while the
// backend decodes them (internal/tokenstream) with their text cut where it is safe (whole
// UTF-8 characters, never part of a stop sequence). It bounds every request before work
// starts: a prompt's text by bytes (what the model's token limit can hold) before it is
// rendered or tokenized and by tokens while it is tokenized, and choices × max_tokens ×
// top_logprobs; and it stops the samples of a client that left, streamed or not, answering
// only once they have ended. It holds no sampling logic: that is
// the core's and the backends'. Errors a client caused are *Error, which each adapter
// answers in its own protocol's shape; the rest are the core's connect errors.
package infer
