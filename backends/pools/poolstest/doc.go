// Package poolstest is the contract suite every pools.Provider passes (Run), and a fake
// worker that registers and heartbeats like the real one (FakeWorker, and FakeWorkerMain for
// providers that start processes: a test binary re-executes itself as the worker).
package poolstest
