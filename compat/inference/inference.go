package inference

import "github.com/loops-dev/loops/compat/internal/infer"

// Engine resolves model strings to samplers and samples through the core.
type Engine = infer.Engine

// Services are the core services the engine samples through.
type Services = infer.Services

// Options tune the engine: the bound on remembered samplers and the caller's workspace.
type Options = infer.Options

// New returns an engine to pass as openai.Options.Engine and anthropic.Options.Engine.
func New(s Services, o Options) *Engine { return infer.New(s, o) }
