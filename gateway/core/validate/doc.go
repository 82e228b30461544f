// Package validate checks the training requests of the core's API before any work starts:
// a forward/backward request's loss, its loss_fn_config and every datum against the base
// model (sequence length, vocabulary) and the loss's inputs (names, shapes, dtypes, finite
// values), the request's size against the server's limits, a LoRA config, a step's Adam
// parameters and checkpoint names. Each check is a pure function of the request, the
// model's ModelInfo and the limits it is given; a request that fails is InvalidArgument
// (package apierr) with a message that says what was wrong and how to fix it, so bad input
// is a 4xx at submission, never a failed operation.
package validate
