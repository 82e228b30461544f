// Package backends defines the roles a compute backend plays for the gateway (Trainer and
// Sampler, whose methods are the loops.backend.v1 worker protocol) and a registry of
// backend implementations by name. The gateway never imports an implementation: the binary
// links the built-ins with blank imports and picks one by name at start-up.
package backends
