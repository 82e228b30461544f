// Package inference builds the one sampling engine that the OpenAI- and Anthropic-compatible
// adapters (compat/openai, compat/anthropic) share on a server: a (workspace, model)'s
// sampler is created once whichever API asks first, and the bound on remembered samplers
// holds for both APIs together. The engine itself is compat/internal/infer's.
package inference
