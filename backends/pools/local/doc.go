// Package local is the pools.Provider that runs worker processes on this host: one process
// per replica (python -m loops_worker --register ...), with the replica's GPUs assigned
// through CUDA_VISIBLE_DEVICES from a configured inventory, restarted with back-off when it
// exits, its stderr logged. Processes register with the gateway's Registry like any worker.
package local
