// Package blackbox checks any Tinker-compatible server from the outside, with plain HTTP
// the way the tinker SDK (0.38) talks to it: a short SFT-then-sample session (client/config,
// create_session, heartbeat, create_model and retrieve_future long-polls, a protobuf
// forward_backward, optim_step, save_weights_for_sampler, create_sampling_session, asample
// with a protobuf result, the training_runs and checkpoints listings, session finish), then
// every protocol case that has a Tinker form. It needs no access to the server's internals,
// so it runs against Loops, a hosted Tinker endpoint, or another implementation; `loops
// conformance --target URL` is its command line.
package blackbox
