// Package serve runs a worker: it serves a backends.Backend (the pure-Go reference engine
// unless told otherwise) as the loops.backend.v1 TrainerService and SamplerService over
// Connect, gRPC and gRPC-Web on one listener, HTTP/2 with mutual TLS only (the credentials
// the gateway issues, backends/pools/mtls: it answers only that gateway), the protocol the
// gateway's worker client (backends/worker) speaks to the Python worker (python -m
// loops_worker). The folders and URLs a request names are checked first (confine.go):
// folders inside Options.AllowDirs, symbolic links resolved; URLs of the checkpoint store
// (Options.CheckpointOrigins).
//
// Run is `loops worker` (and `python -m loops_worker`'s Go twin): it listens, prints
// "LOOPS_WORKER_LISTENING host:port" on stdout once it serves, and with a registry URL
// registers with the gateway's RegistryService (pools.Hold) and holds its lease until it
// stops, the gateway says drain, or its parent goes away (stdin closes, with
// LOOPS_WORKER_EXIT_ON_STDIN_EOF=1). ParseArgs reads the Python worker's flags, so the
// gateway starts either worker with the same command line (the worker backend's
// worker_command option); Main is the command's entry point with exit codes.
//
// The Go worker runs on the CPU only and serves the built-in loops/tiny model and local
// Hugging Face folders (or ids found in the local Hugging Face cache): what the reference
// engine loads.
package serve
